package runtime

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/tetratelabs/wazero/api"
)

func TestLoadRefusesBadModules(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	good := cModule(1)
	sum := sha256.Sum256(good)
	wrongSum := hex.EncodeToString(make([]byte, 32))
	evil := wmod{imports: []wimport{{module: "env", name: "evil"}}, funcs: []wfunc{{name: "run", body: bodyCallImp}}}.bytes()
	wasiMistyped := wmod{imports: []wimport{{module: "wasi_snapshot_preview1", name: "fd_write", params: []api.ValueType{i32}}},
		funcs: []wfunc{{name: "run", body: []byte{0x41, 0, 0x10, 0}}}}.bytes()
	wasiUnknown := wmod{imports: []wimport{{module: "wasi_snapshot_preview1", name: "sock_open_everything"}},
		funcs: []wfunc{{name: "run", body: bodyCallImp}}}.bytes()
	noMarker := wmod{funcs: []wfunc{{name: "add", params: []api.ValueType{i32, i32}, results: []api.ValueType{i32}, body: bodyAdd}}}.bytes()
	bigMemory := wmod{memPages: 20, funcs: []wfunc{{name: "run"}}}.bytes()

	tests := []struct {
		name     string
		spec     Spec
		want     error
		contains []string
	}{
		{name: "not wasm", spec: Spec{Wasm: []byte("#!/bin/sh\necho hi\n")}, want: ErrInvalidModule, contains: []string{"not a WebAssembly binary"}},
		{name: "empty", spec: Spec{Wasm: nil}, want: ErrInvalidModule},
		{name: "header only garbage", spec: Spec{Wasm: append(append([]byte{}, wasmHeader...), 0xff, 0xff)}, want: ErrInvalidModule, contains: []string{"compile"}},
		{name: "checksum mismatch", spec: Spec{Wasm: good, SHA256: wrongSum}, want: ErrChecksum,
			contains: []string{hex.EncodeToString(sum[:]), wrongSum}},
		{name: "import not offered", spec: Spec{Wasm: evil}, want: ErrImport, contains: []string{"env.evil"}},
		{name: "WASI import mistyped", spec: Spec{Wasm: wasiMistyped}, want: ErrImport, contains: []string{"wasi_snapshot_preview1.fd_write"}},
		{name: "WASI import unknown", spec: Spec{Wasm: wasiUnknown}, want: ErrImport, contains: []string{"sock_open_everything"}},
		{name: "export missing", spec: Spec{Wasm: good, Exports: []Export{{Name: "filter", Params: []api.ValueType{i32}}}},
			want: ErrExport, contains: []string{"filter", "missing"}},
		{name: "export mistyped", spec: Spec{Wasm: good, Exports: []Export{{Name: "add", Params: []api.ValueType{i64, i64}, Results: []api.ValueType{i64}}}},
			want: ErrExport, contains: []string{"add", "(i32, i32) -> (i32)", "(i64, i64) -> (i64)"}},
		{name: "ABI marker missing", spec: Spec{Wasm: noMarker, ABI: ABI{Export: "flowd_abi_version", Version: 1}},
			want: ErrABIVersion, contains: []string{"flowd_abi_version", "missing"}},
		{name: "ABI marker mistyped", spec: Spec{Wasm: good, ABI: ABI{Export: "add", Version: 1}}, want: ErrABIVersion},
		{name: "ABI version mismatch", spec: Spec{Wasm: good, ABI: ABI{Export: "flowd_abi_version", Version: 2}},
			want: ErrABIVersion, contains: []string{"version 1", "expects 2"}},
		{name: "memory minimum above the limit", spec: Spec{Wasm: bigMemory, MemoryLimitPages: 10}, want: ErrMemory, contains: []string{"20 pages"}},
		{name: "self-test fails", spec: Spec{Wasm: good, SelfTest: func(ctx context.Context, inst *Instance) error {
			stack := []uint64{2, 2}
			if err := inst.Call(ctx, inst.Function("add"), stack); err != nil {
				return err
			}
			if stack[0] != 5 {
				return errors.New("2+2 is not 5")
			}
			return nil
		}}, want: ErrSelfTest, contains: []string{"2+2 is not 5"}},
		{name: "self-test traps", spec: Spec{Wasm: good, Policy: PolicyReload, SelfTest: func(ctx context.Context, inst *Instance) error {
			return inst.Call(ctx, inst.Function("trap"), nil)
		}}, want: ErrSelfTest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Name = "bad"
			m, err := rt.Load(ctx, tt.spec)
			require.Nil(t, m)
			require.ErrorIs(t, err, tt.want)
			for _, s := range tt.contains {
				require.Contains(t, err.Error(), s)
			}
		})
	}
}

func TestLoadAcceptsGoodModules(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t, nil)
	goWasm := goGuestWasm(t)
	goSum := sha256.Sum256(goWasm)
	host := []HostModule{{Name: "env", Functions: []HostFunction{{Name: "evil", Fn: func(context.Context, api.Module, []uint64) {}}}}}
	withHostImport := wmod{imports: []wimport{{module: "env", name: "evil"}}, funcs: []wfunc{{name: "run", body: bodyCallImp}}}.bytes()

	tests := []struct {
		name  string
		spec  Spec
		check func(t *testing.T, m *Module)
	}{
		{name: "Go wasip1 reactor runs _initialize", spec: Spec{Wasm: goWasm, SHA256: hex.EncodeToString(goSum[:]),
			ABI:     ABI{Export: "flowd_abi_version", Version: 1},
			Exports: []Export{{Name: "add", Params: []api.ValueType{i32, i32}, Results: []api.ValueType{i32}}}},
			check: func(t *testing.T, m *Module) {
				st, err := call(ctx, m, "initialized")
				require.NoError(t, err)
				require.Equal(t, uint64(7), st[0])
				st, err = call(ctx, m, "add", 40, 2)
				require.NoError(t, err)
				require.Equal(t, uint64(42), st[0])
			}},
		{name: "module without WASI imports", spec: Spec{Wasm: cModule(1), ABI: ABI{Export: "flowd_abi_version", Version: 1}},
			check: func(t *testing.T, m *Module) {
				st, err := call(ctx, m, "add", 1, 2)
				require.NoError(t, err)
				require.Equal(t, uint64(3), st[0])
			}},
		{name: "import of a host module", spec: Spec{Wasm: withHostImport, Host: host},
			check: func(t *testing.T, m *Module) {
				_, err := call(ctx, m, "run")
				require.NoError(t, err)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.spec.Name = "good"
			m, err := rt.Load(ctx, tt.spec)
			require.NoError(t, err)
			tt.check(t, m)
			require.NoError(t, m.Close(ctx))
		})
	}
}
