package runtime

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// A plugin layer loads a module with the exports and ABI version it requires, then calls it
// through a Slot so a new version can be swapped in at run time.
func Example() {
	ctx := context.Background()
	rt, err := New(ctx, Options{}) // Options.CacheDir keeps compiled code between runs
	if err != nil {
		panic(err)
	}
	defer rt.Close(ctx)

	load := func(wasm []byte) (*Module, error) {
		return rt.Load(ctx, Spec{
			Name:        "adder",
			Wasm:        wasm,
			CallTimeout: time.Second,
			Policy:      PolicyFailOpen,
			ABI:         ABI{Export: "flowd_abi_version", Version: 1},
			Exports:     []Export{{Name: "add", Params: []api.ValueType{api.ValueTypeI32, api.ValueTypeI32}, Results: []api.ValueType{api.ValueTypeI32}}},
			// Look the export up once per instance.
			Init: func(ctx context.Context, inst *Instance) error {
				inst.SetData(inst.Function("add"))
				return nil
			},
		})
	}
	var slot Slot
	m, err := load(cModule(1))
	if err != nil {
		panic(err)
	}
	if err := slot.Swap(ctx, m); err != nil {
		panic(err)
	}

	stack := []uint64{40, 2}
	err = slot.Do(ctx, func(inst *Instance) error {
		return inst.Call(ctx, inst.Data().(api.Function), stack)
	})
	switch {
	case errors.Is(err, ErrPolicyOpen):
		fmt.Println("module failed open: bypass it")
	case err != nil:
		fmt.Println("error:", err)
	default:
		fmt.Println(uint32(stack[0]))
	}
	// Output: 42
}
