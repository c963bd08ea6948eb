package flowd

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"
)

// goldenFile holds the ABI's golden vectors, shared with the host's tests in package
// plugins: both sides must produce and accept the same bytes.
const goldenFile = "../../testdata/abi-golden.json"

type golden struct {
	ABI    int `json:"abi"`
	Params []struct {
		Name   string            `json:"name"`
		Params map[string]string `json:"params"`
		Hex    hexFields         `json:"hex"`
	} `json:"params"`
	Records []struct {
		Name      string          `json:"name"`
		WantsBody bool            `json:"wants_body"`
		Messages  []goldenMessage `json:"messages"`
		Hex       hexFields       `json:"hex"`
	} `json:"records"`
	Bitmaps []struct {
		Name string    `json:"name"`
		Keep []bool    `json:"keep"`
		Hex  hexFields `json:"hex"`
	} `json:"bitmaps"`
	AllocInputs []struct {
		Name   string `json:"name"`
		Group  string `json:"group"`
		Queues []struct {
			Topic   string `json:"topic"`
			Broker  string `json:"broker"`
			QueueID int32  `json:"queue_id"`
		} `json:"queues"`
		Members []struct {
			ID     string `json:"id"`
			Weight uint32 `json:"weight"`
			Room   string `json:"room"`
			Labels []struct {
				Key   string `json:"key"`
				Value string `json:"value"`
			} `json:"labels"`
		} `json:"members"`
		Previous []int32   `json:"previous"`
		Hex      hexFields `json:"hex"`
	} `json:"alloc_inputs"`
	AllocOutputs []struct {
		Name   string    `json:"name"`
		Owners []int32   `json:"owners"`
		Hex    hexFields `json:"hex"`
	} `json:"alloc_outputs"`
	TransformOutputs []struct {
		Name    string `json:"name"`
		Outputs [][]struct {
			Tags       string `json:"tags"`
			Keys       string `json:"keys"`
			Properties string `json:"properties"`
			Body       string `json:"body"`
		} `json:"outputs"`
		Hex hexFields `json:"hex"`
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

// hexFields is a vector's bytes, one hex string per field, joined.
type hexFields []byte

func (h *hexFields) UnmarshalJSON(b []byte) error {
	var fields []string
	if err := json.Unmarshal(b, &fields); err != nil {
		return err
	}
	raw, err := hex.DecodeString(strings.Join(fields, ""))
	*h = raw
	return err
}

func loadGolden(t *testing.T) *golden {
	t.Helper()
	b, err := os.ReadFile(goldenFile)
	if err != nil {
		t.Fatalf("golden vectors: %v", err)
	}
	var g golden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("golden vectors %s: %v", goldenFile, err)
	}
	if g.ABI != ABIVersion {
		t.Fatalf("golden vectors are of ABI %d, the SDK implements %d", g.ABI, ABIVersion)
	}
	if len(g.Params) == 0 || len(g.Records) == 0 || len(g.Bitmaps) == 0 || len(g.AllocInputs) == 0 ||
		len(g.AllocOutputs) == 0 || len(g.TransformOutputs) == 0 {
		t.Fatalf("golden vectors %s: a kind of vector is missing", goldenFile)
	}
	return &g
}

func TestGoldenParams(t *testing.T) {
	for _, v := range loadGolden(t).Params {
		got := map[string]string{}
		if !decodeParams(v.Hex, got) {
			t.Errorf("%s: refused", v.Name)
			continue
		}
		want := v.Params
		if want == nil {
			want = map[string]string{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: decoded %q, want %q", v.Name, got, want)
		}
		for n := range len(v.Hex) {
			if decodeParams(v.Hex[:n], map[string]string{}) {
				t.Errorf("%s: accepted the first %d of %d bytes", v.Name, n, len(v.Hex))
			}
		}
	}
}

func TestGoldenRecords(t *testing.T) {
	for _, v := range loadGolden(t).Records {
		msgs, ok := decodeMessages(nil, v.Hex, int32(len(v.Messages)))
		if !ok {
			t.Errorf("%s: refused", v.Name)
			continue
		}
		for i, w := range v.Messages {
			if !v.WantsBody {
				w.Body = ""
			}
			m := msgs[i]
			got := goldenMessage{m.QueueID, m.QueueOffset, m.StoreTimestamp, string(m.Topic), string(m.Tags),
				string(m.Keys), string(m.Properties), string(m.Body)}
			if got != w {
				t.Errorf("%s: message %d decoded as %+v, want %+v", v.Name, i, got, w)
			}
		}
		for n := range len(v.Hex) {
			if _, ok := decodeMessages(nil, v.Hex[:n], int32(len(v.Messages))); ok {
				t.Errorf("%s: accepted the first %d of %d bytes", v.Name, n, len(v.Hex))
			}
		}
		if _, ok := decodeMessages(nil, v.Hex, int32(len(v.Messages)+1)); ok {
			t.Errorf("%s: accepted as %d records", v.Name, len(v.Messages)+1)
		}
	}
}

func TestGoldenBitmaps(t *testing.T) {
	for _, v := range loadGolden(t).Bitmaps {
		msgs := make([]Message, len(v.Keep))
		for i := range msgs {
			msgs[i].QueueOffset = int64(i)
		}
		// A dirty, reused buffer must not leak into the result.
		buf := bytes.Repeat([]byte{0xff}, 64)
		got := filterBitmap(buf, msgs, func(m Message) bool { return v.Keep[m.QueueOffset] })
		if !bytes.Equal(got, v.Hex) {
			t.Errorf("%s: bitmap %x, want %x", v.Name, got, []byte(v.Hex))
		}
		if got := filterBitmap(nil, msgs, func(m Message) bool { return v.Keep[m.QueueOffset] }); !bytes.Equal(got, v.Hex) {
			t.Errorf("%s: bitmap in a new buffer %x, want %x", v.Name, got, []byte(v.Hex))
		}
	}
}

func TestGoldenAllocInputs(t *testing.T) {
	for _, v := range loadGolden(t).AllocInputs {
		var in Input
		if !decodeInput(&in, v.Hex) {
			t.Errorf("%s: refused", v.Name)
			continue
		}
		if string(in.Group) != v.Group || len(in.Queues) != len(v.Queues) || len(in.Members) != len(v.Members) {
			t.Errorf("%s: group %q with %d queues and %d members, want %q, %d, %d", v.Name,
				in.Group, len(in.Queues), len(in.Members), v.Group, len(v.Queues), len(v.Members))
			continue
		}
		for k, q := range v.Queues {
			g := in.Queues[k]
			if string(g.Topic) != q.Topic || string(g.Broker) != q.Broker || g.QueueID != q.QueueID {
				t.Errorf("%s: queue %d is %s/%s/%d, want %+v", v.Name, k, g.Topic, g.Broker, g.QueueID, q)
			}
		}
		for i, m := range v.Members {
			g := in.Members[i]
			if string(g.ID) != m.ID || g.Weight != m.Weight || string(g.Room) != m.Room || len(g.Labels) != len(m.Labels) {
				t.Errorf("%s: member %d is %q weight %d room %q with %d labels, want %+v", v.Name, i, g.ID, g.Weight, g.Room, len(g.Labels), m)
				continue
			}
			for j, l := range m.Labels {
				if string(g.Labels[j].Key) != l.Key || string(g.Labels[j].Value) != l.Value {
					t.Errorf("%s: member %d label %d is %q=%q, want %+v", v.Name, i, j, g.Labels[j].Key, g.Labels[j].Value, l)
				}
			}
		}
		if len(v.Previous) == 0 && len(in.Previous) != 0 || len(v.Previous) != 0 && !reflect.DeepEqual(in.Previous, v.Previous) {
			t.Errorf("%s: previous %v, want %v", v.Name, in.Previous, v.Previous)
		}
		for n := range len(v.Hex) {
			if decodeInput(&Input{}, v.Hex[:n]) {
				t.Errorf("%s: accepted the first %d of %d bytes", v.Name, n, len(v.Hex))
			}
		}
	}
}

func TestGoldenAllocOutputs(t *testing.T) {
	for _, v := range loadGolden(t).AllocOutputs {
		if got := appendOwners(nil, v.Owners); !bytes.Equal(got, v.Hex) {
			t.Errorf("%s: %x, want %x", v.Name, got, []byte(v.Hex))
		}
	}
}

func TestGoldenTransformOutputs(t *testing.T) {
	for _, v := range loadGolden(t).TransformOutputs {
		var got []byte
		for _, outs := range v.Outputs {
			var msg []Output
			for _, o := range outs {
				msg = append(msg, Output{Tags: []byte(o.Tags), Keys: []byte(o.Keys), Properties: []byte(o.Properties), Body: []byte(o.Body)})
			}
			got = appendOutputs(got, msg)
		}
		if !bytes.Equal(got, v.Hex) {
			t.Errorf("%s: %x, want %x", v.Name, got, []byte(v.Hex))
		}
	}
}
