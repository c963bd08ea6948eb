package plugins

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
	"github.com/flowd-io/flowd/runtime"
)

// The ABI's golden vectors, which the Go SDK's tests (plugins/sdk/go) check too: the host
// must write and read exactly these bytes.
const goldenFile = "testdata/abi-golden.json"

// replayPkg answers every call with the bytes of its "out" parameter and accepts only the
// input of its "in" parameter (see its source).
const replayPkg = "./testdata/replay"

type goldenVectors struct {
	ABI    int `json:"abi"`
	Params []struct {
		Name   string            `json:"name"`
		Params map[string]string `json:"params"`
		Hex    goldenHex         `json:"hex"`
	} `json:"params"`
	Records []struct {
		Name      string          `json:"name"`
		WantsBody bool            `json:"wants_body"`
		Messages  []goldenMessage `json:"messages"`
		Hex       goldenHex       `json:"hex"`
	} `json:"records"`
	Bitmaps []struct {
		Name string    `json:"name"`
		Keep []bool    `json:"keep"`
		Hex  goldenHex `json:"hex"`
	} `json:"bitmaps"`
	AllocInputs []struct {
		Name   string `json:"name"`
		Group  string `json:"group"`
		Queues []struct {
			Topic   string `json:"topic"`
			Broker  string `json:"broker"`
			QueueID int    `json:"queue_id"`
		} `json:"queues"`
		Members  []goldenMember `json:"members"`
		Previous []int32        `json:"previous"`
		Hex      goldenHex      `json:"hex"`
	} `json:"alloc_inputs"`
	AllocOutputs []struct {
		Name   string    `json:"name"`
		Owners []int32   `json:"owners"`
		Hex    goldenHex `json:"hex"`
	} `json:"alloc_outputs"`
	TransformOutputs []struct {
		Name    string           `json:"name"`
		Outputs [][]goldenOutput `json:"outputs"`
		Hex     goldenHex        `json:"hex"`
	} `json:"transform_outputs"`
}

type goldenMessage struct {
	QueueID        int32  `json:"queue_id"`
	QueueOffset    int64  `json:"queue_offset"`
	StoreTimestamp int64  `json:"store_timestamp"`
	Topic          string `json:"topic"`
	Tags           string `json:"tags"`
	Keys           string `json:"keys"`
	Properties     string `json:"properties"`
	Body           string `json:"body"`
}

func (m goldenMessage) message() Message {
	return Message{Topic: m.Topic, QueueID: m.QueueID, QueueOffset: m.QueueOffset, StoreTimestamp: m.StoreTimestamp,
		Tags: m.Tags, Keys: m.Keys, Properties: bytesOrNil(m.Properties), Body: bytesOrNil(m.Body)}
}

type goldenMember struct {
	ID     string `json:"id"`
	Weight uint32 `json:"weight"`
	Room   string `json:"room"`
	Labels []struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	} `json:"labels"`
}

type goldenOutput struct {
	Tags       string `json:"tags"`
	Keys       string `json:"keys"`
	Properties string `json:"properties"`
	Body       string `json:"body"`
}

// bytesOrNil is how the host hands out an empty field: nil.
func bytesOrNil(s string) []byte {
	if s == "" {
		return nil
	}
	return []byte(s)
}

// goldenHex is a vector's bytes, written as one hex string per field.
type goldenHex []byte

func (h *goldenHex) UnmarshalJSON(b []byte) error {
	var fields []string
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	raw, err := hex.DecodeString(strings.Join(fields, ""))
	*h = raw
	return err
}

func loadGoldenVectors(t *testing.T) *goldenVectors {
	t.Helper()
	b, err := os.ReadFile(goldenFile)
	require.NoError(t, err)
	var g goldenVectors
	require.NoError(t, json.Unmarshal(b, &g), goldenFile)
	require.Equal(t, ABIVersion, g.ABI, "%s: ABI version", goldenFile)
	for kind, n := range map[string]int{"params": len(g.Params), "records": len(g.Records), "bitmaps": len(g.Bitmaps),
		"alloc_inputs": len(g.AllocInputs), "alloc_outputs": len(g.AllocOutputs), "transform_outputs": len(g.TransformOutputs)} {
		require.NotZero(t, n, "%s has no %s vectors", goldenFile, kind)
	}
	return &g
}

func goldenMessages(ms []goldenMessage) []Message {
	msgs := make([]Message, len(ms))
	for i, m := range ms {
		msgs[i] = m.message()
	}
	return msgs
}

// encodeGoldenRecords encodes msgs as the filter and transform calls do.
func encodeGoldenRecords(t *testing.T, msgs []Message, body bool) []byte {
	t.Helper()
	end, size, err := batchEnd(msgs, 0, body)
	require.NoError(t, err)
	require.Equal(t, len(msgs), end, "one batch")
	b := make([]byte, size)
	encodeRecords(b, msgs, body)
	return b
}

func TestGoldenParamsEncoding(t *testing.T) {
	for _, v := range loadGoldenVectors(t).Params {
		require.Equal(t, hex.EncodeToString(v.Hex), hex.EncodeToString(encodeParams(v.Params)), v.Name)
	}
}

func TestGoldenRecordsEncoding(t *testing.T) {
	for _, v := range loadGoldenVectors(t).Records {
		got := encodeGoldenRecords(t, goldenMessages(v.Messages), v.WantsBody)
		require.Equal(t, hex.EncodeToString(v.Hex), hex.EncodeToString(got), v.Name)
	}
}

func (g *goldenVectors) allocInput(i int) *AllocInput {
	v := g.AllocInputs[i]
	in := &AllocInput{Group: v.Group, Previous: v.Previous}
	for _, q := range v.Queues {
		in.Queues = append(in.Queues, protocol.MessageQueue{Topic: q.Topic, BrokerName: q.Broker, QueueID: q.QueueID})
	}
	for _, m := range v.Members {
		member := Member{ID: m.ID, Weight: m.Weight, Room: m.Room}
		for _, l := range m.Labels {
			member.Labels = append(member.Labels, Label{Key: l.Key, Value: l.Value})
		}
		in.Members = append(in.Members, member)
	}
	return in
}

func TestGoldenAllocInputEncoding(t *testing.T) {
	g := loadGoldenVectors(t)
	for i, v := range g.AllocInputs {
		in := g.allocInput(i)
		size, err := allocSize(in)
		require.NoError(t, err, v.Name)
		got := make([]byte, size)
		encodeAlloc(got, in)
		require.Equal(t, hex.EncodeToString(v.Hex), hex.EncodeToString(got), v.Name)
	}
}

func goldenOutputs(msgs [][]goldenOutput) [][]Output {
	want := make([][]Output, len(msgs))
	for i, outs := range msgs {
		want[i] = make([]Output, len(outs))
		for j, o := range outs {
			want[i][j] = Output{Tags: o.Tags, Keys: o.Keys, Properties: bytesOrNil(o.Properties), Body: bytesOrNil(o.Body)}
		}
	}
	return want
}

func TestGoldenTransformOutputDecoding(t *testing.T) {
	for _, v := range loadGoldenVectors(t).TransformOutputs {
		want := goldenOutputs(v.Outputs)
		got := make([][]Output, len(want))
		require.NoError(t, decodeOutputs(v.Hex, got), v.Name)
		require.Equal(t, want, got, v.Name)
		for n := range len(v.Hex) {
			require.ErrorIs(t, decodeOutputs(v.Hex[:n], make([][]Output, len(want))), ErrBadOutput, "%s: the first %d of %d bytes", v.Name, n, len(v.Hex))
		}
		require.ErrorIs(t, decodeOutputs(append(v.Hex[:len(v.Hex):len(v.Hex)], 0), make([][]Output, len(want))), ErrBadOutput, "%s: a byte over", v.Name)
	}
}

// loadReplay loads the replay guest as a plugin of kind, answering out and, unless in is
// nil, accepting only in. Its self-test is left out: the guest answers golden inputs only.
func loadReplay(t *testing.T, rt *runtime.Runtime, kind Kind, wantsBody bool, in, out []byte) *runtime.Slot {
	t.Helper()
	wasm := goGuest(t, replayPkg)
	params := map[string]string{"out": hex.EncodeToString(out)}
	if in != nil {
		params["in"] = hex.EncodeToString(in)
	}
	m := manifest("replay", kind, wasm, params)
	m.WantsBody = wantsBody
	m.Limits.MaxInstances = 1
	require.NoError(t, m.Validate())
	spec := m.Spec(wasm)
	spec.SelfTest = nil
	mod, err := rt.Load(context.Background(), spec)
	require.NoError(t, err)
	s := &runtime.Slot{}
	require.NoError(t, s.Swap(context.Background(), mod))
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// zeroOwners is an allocator output giving every one of nq queues to member 0.
func zeroOwners(nq int) []byte { return make([]byte, 4*nq) }

// The host's side of the boundary as a guest sees it: what lands in guest memory is the
// golden input, and golden output left in guest memory is read as the vectors say.
func TestGoldenVectorsThroughAGuest(t *testing.T) {
	ctx := context.Background()
	g := loadGoldenVectors(t)
	rt := newRuntime(t)
	const sawOther = "the guest was handed other bytes than the golden vector"

	for _, v := range g.Records {
		msgs := goldenMessages(v.Messages)
		f := NewFilter(loadReplay(t, rt, KindFilter, v.WantsBody, v.Hex, make([]byte, (len(msgs)+7)/8)))
		require.NoError(t, f.Match(ctx, msgs, make([]bool, len(msgs))), "filter, %s: %s", v.Name, sawOther)
		if v.WantsBody { // a transform always gets bodies
			tr := NewTransform(loadReplay(t, rt, KindTransform, false, v.Hex, make([]byte, 4*len(msgs))))
			_, err := tr.Apply(ctx, msgs)
			require.NoError(t, err, "transform, %s: %s", v.Name, sawOther)
		}
	}
	for i, v := range g.AllocInputs {
		in := g.allocInput(i)
		a := NewAllocator(loadReplay(t, rt, KindAllocator, false, v.Hex, zeroOwners(len(in.Queues))))
		owners, err := a.Allocate(ctx, in, nil)
		require.NoError(t, err, "allocator, %s: %s", v.Name, sawOther)
		require.Equal(t, make([]int32, len(in.Queues)), owners, v.Name)
	}

	for _, v := range g.Bitmaps {
		f := NewFilter(loadReplay(t, rt, KindFilter, false, nil, v.Hex))
		msgs := make([]Message, len(v.Keep))
		for i := range msgs {
			msgs[i] = Message{Topic: "t", QueueOffset: int64(i)}
		}
		keep := make([]bool, len(msgs))
		require.NoError(t, f.Match(ctx, msgs, keep), v.Name)
		require.Equal(t, v.Keep, keep, "bitmap %s", v.Name)
	}
	for _, v := range g.AllocOutputs {
		in := &AllocInput{Group: "g"}
		for k := range v.Owners {
			in.Queues = append(in.Queues, protocol.MessageQueue{Topic: "t", BrokerName: "b", QueueID: k})
		}
		for m := range maxOwner(v.Owners) + 1 {
			in.Members = append(in.Members, Member{ID: fmt.Sprintf("m%04d", m), Weight: 1})
		}
		a := NewAllocator(loadReplay(t, rt, KindAllocator, false, nil, v.Hex))
		owners, err := a.Allocate(ctx, in, nil)
		require.NoError(t, err, v.Name)
		require.Equal(t, v.Owners, owners, "allocator output %s", v.Name)
	}
	for _, v := range g.TransformOutputs {
		tr := NewTransform(loadReplay(t, rt, KindTransform, false, nil, v.Hex))
		msgs := make([]Message, len(v.Outputs))
		for i := range msgs {
			msgs[i] = Message{Topic: "t", QueueOffset: int64(i)}
		}
		got, err := tr.Apply(ctx, msgs)
		require.NoError(t, err, v.Name)
		require.Equal(t, goldenOutputs(v.Outputs), got, "transform output %s", v.Name)
	}
}

func maxOwner(owners []int32) int {
	m := 0
	for _, o := range owners {
		m = max(m, int(o))
	}
	return m
}
