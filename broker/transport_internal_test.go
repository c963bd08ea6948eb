package broker

import (
	"reflect"
	"testing"
)

// Every setting of TransportConfig must reach the transport under the same name: a field
// added to one and forgotten in serverOptions would be silently ignored.
func TestTransportConfigReachesTheServer(t *testing.T) {
	var cfg TransportConfig
	cv := reflect.ValueOf(&cfg).Elem()
	for i := range cv.NumField() {
		f := cv.Field(i)
		f.SetInt(int64(1000 + i)) // every field is an int, an int64 or a duration
	}
	opts := reflect.ValueOf(cfg.serverOptions())
	for i := range cv.NumField() {
		name := cv.Type().Field(i).Name
		got := opts.FieldByName(name)
		if !got.IsValid() {
			t.Errorf("the transport has no setting %s", name)
			continue
		}
		if got.Int() != cv.Field(i).Int() {
			t.Errorf("%s: the transport gets %v, want %v", name, got.Int(), cv.Field(i).Int())
		}
	}
}
