package plugins

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/runtime"
)

func benchOrders(n int) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = Message{
			Topic: "orders", QueueID: int32(i % 8), QueueOffset: int64(i), StoreTimestamp: 1700000000000,
			Tags: "paid", Keys: fmt.Sprintf("order-%d", i), Properties: []byte("UNIQ_KEY\x01abc\x02"),
			Body: []byte(fmt.Sprintf(`{"id": "order-%d", "customer": "c-17", "amount": %d, "currency": "EUR"}`, i, i%250)),
		}
	}
	return msgs
}

// nativeAmountAbove is the go-jsonfilter example's logic in plain Go, for comparison.
func nativeAmountAbove(body []byte, key []byte, threshold float64) bool {
	for i := 0; i+len(key) <= len(body); i++ {
		if body[i] != '"' || string(body[i:i+len(key)]) != string(key) {
			continue
		}
		j := i + len(key)
		for j < len(body) && body[j] == ' ' {
			j++
		}
		if j >= len(body) || body[j] != ':' {
			continue
		}
		for j++; j < len(body) && body[j] == ' '; j++ {
		}
		var v float64
		digits := 0
		for ; j < len(body) && body[j] >= '0' && body[j] <= '9'; j++ {
			v = v*10 + float64(body[j]-'0')
			digits++
		}
		return digits > 0 && v > threshold
	}
	return false
}

// BenchmarkFilter is the cost per message of the go-jsonfilter example through the host,
// next to the same logic in plain Go, at three batch sizes. Go compiled to Wasm scans bytes
// far slower than native Go; the tags-only filter shows the fixed cost per call and per
// message. Each Wasm filter runs compiled as flowd loads every plugin ("interruptible":
// with wazero's close-on-context-done checks, so a call can be stopped at its time limit)
// and without the checks ("uninterruptible", runtime.Options.Uninterruptible), in the same
// run:
//
//	go test -run '^$' -bench 'BenchmarkFilter$' -benchtime 20000x ./plugins/
func BenchmarkFilter(b *testing.B) {
	wasm := goGuest(b, jsonFilterPkg)
	m := manifest("big-orders", KindFilter, wasm, map[string]string{"threshold": "100"})
	m.WantsBody = true
	// The same batches through a filter that only compares tags: the cost of the host, the
	// ABI and the SDK, without the JSON scan.
	tagsWasm := goGuest(b, "./testdata/tagfilter")
	tagsM := manifest("tags", KindFilter, tagsWasm, nil)
	type filters struct{ json, tags *Filter }
	modes := map[string]filters{}
	for mode, opts := range map[string]runtime.Options{"interruptible": {}, "uninterruptible": {Uninterruptible: true}} {
		rt := newRuntimeWith(b, opts)
		modes[mode] = filters{json: NewFilter(load(b, rt, m, wasm)), tags: NewFilter(load(b, rt, tagsM, tagsWasm))}
	}
	ctx := context.Background()
	match := func(f *Filter, msgs []Message, keep []bool) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := f.Match(ctx, msgs, keep); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(msgs)), "ns/msg")
		}
	}
	for _, n := range []int{1, 32, 256} {
		msgs := benchOrders(n)
		keep := make([]bool, n)
		for _, mode := range []string{"interruptible", "uninterruptible"} {
			b.Run(fmt.Sprintf("wasm-go/%s/batch=%d", mode, n), match(modes[mode].json, msgs, keep))
			b.Run(fmt.Sprintf("wasm-go-tags-only/%s/batch=%d", mode, n), match(modes[mode].tags, msgs, keep))
		}
		b.Run(fmt.Sprintf("native/batch=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			key := []byte(`"amount"`)
			for b.Loop() {
				for i := range msgs {
					keep[i] = nativeAmountAbove(msgs[i].Body, key, 100)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/msg")
		})
	}
}

// BenchmarkAllocator is one call of the go-averagely example for 1 000 queues and 100
// members (the whole group's assignment).
func BenchmarkAllocator(b *testing.B) {
	wasm := goGuest(b, averagelyPkg)
	a := NewAllocator(load(b, newRuntime(b), manifest("avg", KindAllocator, wasm, nil), wasm))
	in := allocInput(1000, 0)
	for i := range 100 {
		in.Members = append(in.Members, Member{ID: fmt.Sprintf("10.0.0.%03d@%d", i, 4000+i), Weight: 1})
	}
	in.Previous = make([]int32, 1000)
	var owners []int32
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if owners, err = a.Allocate(ctx, in, owners); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHotSwap measures a swap in two parts: "swap" is Slot.Swap to a loaded version,
// which returns once the old version is drained and closed (callers are not held up: new
// borrows go to the new version at once); "first-call" is the first filter call on the new
// version, the pause a caller sees, to compare with "steady-call".
func BenchmarkHotSwap(b *testing.B) {
	wasm := goGuest(b, jsonFilterPkg)
	rt := newRuntime(b)
	m := manifest("big-orders", KindFilter, wasm, map[string]string{"threshold": "100"})
	m.WantsBody = true
	slot := load(b, rt, m, wasm)
	f := NewFilter(slot)
	ctx := context.Background()
	msgs := benchOrders(32)
	keep := make([]bool, len(msgs))
	swap := func(b *testing.B, timeSwap bool) {
		for b.Loop() {
			b.StopTimer()
			next, err := rt.Load(ctx, m.Spec(wasm))
			require.NoError(b, err)
			if timeSwap {
				b.StartTimer()
			}
			if err := slot.Swap(ctx, next); err != nil {
				b.Fatal(err)
			}
			if timeSwap {
				b.StopTimer()
			} else {
				b.StartTimer()
			}
			if err := f.Match(ctx, msgs, keep); err != nil {
				b.Fatal(err)
			}
			if timeSwap {
				b.StartTimer()
			}
		}
	}
	b.Run("swap", func(b *testing.B) { swap(b, true) })
	b.Run("first-call", func(b *testing.B) { swap(b, false) })
	b.Run("steady-call", func(b *testing.B) {
		for b.Loop() {
			if err := f.Match(ctx, msgs, keep); err != nil {
				b.Fatal(err)
			}
		}
	})
}
