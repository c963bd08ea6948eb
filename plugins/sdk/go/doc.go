// Package flowd is the Go SDK for flowd plugins: WebAssembly modules built with
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o plugin.wasm .
//
// A plugin imports this package, which exports the ABI's functions (flowd_abi_version,
// flowd_alloc, flowd_init, flowd_filter, flowd_allocate, flowd_transform; see ABI.md in the
// plugins directory), and registers its logic from an init function:
//
//	func init() { flowd.RegisterFilter(func(m flowd.Message) bool { return len(m.Tags) > 0 }) }
//	func main() {}
//
// Parameters from the manifest are available with [Param] from the [OnInit] hook on.
//
// The SDK decodes input into reused buffers and hands the plugin views into them: a
// [Message]'s and an [Input]'s byte slices are valid only during the call. A plugin that
// allocates little keeps a Go guest small, since its garbage collector may not run between
// calls.
//
// The package is a module of its own, github.com/flowd-io/flowd/plugins/sdk/go, with no
// dependencies, so a plugin's module graph holds nothing of the daemon's. It needs Go 1.24,
// the first release with go:wasmexport and wasip1 reactors (-buildmode=c-shared).
//
// Only the exports (exports_wasip1.go) are built for GOOS=wasip1 alone; the rest, the ABI's
// encodings in codec.go included, builds anywhere, so plugins type-check with go vet ./... on
// the host and the encodings are tested natively against the golden vectors the host checks.
package flowd
