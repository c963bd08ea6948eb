package plugins

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/runtime"
)

// memorySize borrows an instance of slot's active version and returns its memory size.
func memorySize(t *testing.T, slot *runtime.Slot) uint32 {
	t.Helper()
	inst, err := slot.Borrow(context.Background())
	require.NoError(t, err)
	defer inst.Release()
	return inst.Memory().Size()
}

// Go guests' garbage collector may not run between calls, so an SDK or example that
// allocated per call would grow its memory until the limit. Thousands of calls must leave
// the memory as it was after the first batch.
func TestGoGuestsDoNotGrowTheirMemory(t *testing.T) {
	ctx := context.Background()
	rt := newRuntime(t)
	msgs := benchOrders(64)
	keep := make([]bool, len(msgs))

	fw := goGuest(t, jsonFilterPkg)
	fm := manifest("f", KindFilter, fw, map[string]string{"threshold": "100"})
	fm.WantsBody = true
	fm.Limits.MaxInstances = 1
	fslot := load(t, rt, fm, fw)
	f := NewFilter(fslot)

	tw := goGuest(t, redactPkg)
	tm := manifest("t", KindTransform, tw, nil)
	tm.Limits.MaxInstances = 1
	tslot := load(t, rt, tm, tw)
	tr := NewTransform(tslot)

	aw := goGuest(t, stickyPkg)
	am := manifest("a", KindAllocator, aw, nil)
	am.Limits.MaxInstances = 1
	aslot := load(t, rt, am, aw)
	a := NewAllocator(aslot)
	in := allocInput(200, 7)
	in.Previous = make([]int32, 200)
	var owners []int32

	round := func() {
		require.NoError(t, f.Match(ctx, msgs, keep))
		_, err := tr.Apply(ctx, msgs)
		require.NoError(t, err)
		owners, err = a.Allocate(ctx, in, owners)
		require.NoError(t, err)
	}
	round()
	fSize, tSize, aSize := memorySize(t, fslot), memorySize(t, tslot), memorySize(t, aslot)
	for range 3000 {
		round()
	}
	require.Equal(t, fSize, memorySize(t, fslot), "filter memory grew")
	require.Equal(t, tSize, memorySize(t, tslot), "transform memory grew")
	require.Equal(t, aSize, memorySize(t, aslot), "allocator memory grew")
}

// The SDK answers malformed input with CodeInput rather than trapping.
func TestGoSDKRefusesMalformedInput(t *testing.T) {
	ctx := context.Background()
	wasm := goGuest(t, jsonFilterPkg)
	m := manifest("f", KindFilter, wasm, map[string]string{"threshold": "1"})
	slot := load(t, newRuntime(t), m, wasm)
	inst, err := slot.Borrow(ctx)
	require.NoError(t, err)
	defer inst.Release()
	st := inst.Data().(*state)

	cases := map[string]struct {
		input []byte
		n     uint64
	}{
		"record length past the end": {binary.LittleEndian.AppendUint32(nil, 1000), 1},
		"more records than bytes":    {encodedOne(), 2},
		"bytes left over":            {append(encodedOne(), 0, 0, 0, 0), 1},
		"topic length past record":   {func() []byte { b := encodedOne(); b[24] = 0xff; return b }(), 1},
	}
	for name, c := range cases {
		buf, err := st.input(ctx, len(c.input))
		require.NoError(t, err)
		copy(buf, c.input)
		stack := []uint64{uint64(st.buf), uint64(len(c.input)), c.n}
		require.NoError(t, inst.Call(ctx, st.call, stack), name)
		require.Equal(t, CodeInput, int32(stack[0]), name)
	}
}

func encodedOne() []byte {
	msgs := []Message{{Topic: "t", Tags: "a", Body: []byte("{}")}}
	n, _ := recordSize(&msgs[0], true)
	b := make([]byte, n)
	encodeRecords(b, msgs, true)
	return b
}
