// Command tagfilter is the smallest useful filter on the Go SDK: it keeps messages tagged
// "paid". Benchmarks use it to show what the host and the SDK cost per message, apart from
// the plugin's own work.
package main

import flowd "github.com/flowd-io/flowd/plugins/sdk/go"

func main() {}

func init() {
	flowd.RegisterFilter(func(m flowd.Message) bool { return string(m.Tags) == "paid" })
}
