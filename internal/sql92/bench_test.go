package sql92

import (
	"strings"
	"testing"
)

// encodedProps renders properties as RocketMQ stores them: key \x01 value \x02, repeated.
func encodedProps(kv ...string) string {
	var b strings.Builder
	for i := 0; i+1 < len(kv); i += 2 {
		b.WriteString(kv[i])
		b.WriteByte(1)
		b.WriteString(kv[i+1])
		b.WriteByte(2)
	}
	return b.String()
}

// lookupEncoded finds key in encoded properties without decoding them into a map, as a
// filter reading the stored message would.
func lookupEncoded(props, key string) (string, bool) {
	for props != "" {
		sep := strings.IndexByte(props, 1)
		if sep < 0 {
			return "", false
		}
		end := strings.IndexByte(props[sep+1:], 2)
		if end < 0 {
			end = len(props) - sep - 1
		}
		if props[:sep] == key {
			return props[sep+1 : sep+1+end], true
		}
		props = props[min(len(props), sep+1+end+1):]
	}
	return "", false
}

// javaHash is Java's String.hashCode for ASCII text, the tag code a consume queue stores.
func javaHash(s string) int64 {
	var h int32
	for i := 0; i < len(s); i++ {
		h = 31*h + int32(s[i])
	}
	return int64(h)
}

// BenchmarkMatch: the cost of deciding one message with a typical SQL92 selector, next to
// the tag filter the broker runs on consume-queue units (a set lookup of the unit's tag
// code) and to that filter reading TAGS from the message.
func BenchmarkMatch(b *testing.B) {
	msgs := []map[string]string{
		props("a", "7", "region", "us", "TAGS", "TagA", "KEYS", "k1", "UNIQ_KEY", "0A0B0C0D"),
		props("a", "3", "region", "eu", "TAGS", "TagB", "KEYS", "k2", "UNIQ_KEY", "0A0B0C0E"),
		props("a", "9", "region", "ap", "TAGS", "TagC", "KEYS", "k3", "UNIQ_KEY", "0A0B0C0F"),
		props("region", "eu", "TAGS", "TagA", "KEYS", "k4", "UNIQ_KEY", "0A0B0C10"),
	}
	encoded := make([]string, len(msgs))
	codes := make([]int64, len(msgs))
	for i, m := range msgs {
		encoded[i] = encodedProps("a", m["a"], "region", m["region"], "TAGS", m["TAGS"], "KEYS", m["KEYS"], "UNIQ_KEY", m["UNIQ_KEY"])
		codes[i] = javaHash(m["TAGS"])
	}
	sel, err := Compile("a > 5 AND region IN ('eu','us')")
	if err != nil {
		b.Fatal(err)
	}
	tagCodes := map[int64]struct{}{javaHash("TagA"): {}, javaHash("TagB"): {}}

	b.Run("sql92/map", func(b *testing.B) {
		getters := make([]func(string) (string, bool), len(msgs))
		for i, m := range msgs {
			getters[i] = mapGetter(m)
		}
		i, n := 0, 0
		for b.Loop() {
			if sel.Match(getters[i]) {
				n++
			}
			i = (i + 1) % len(getters)
		}
		sink = n
	})
	b.Run("sql92/encoded", func(b *testing.B) {
		getters := make([]func(string) (string, bool), len(encoded))
		for i, e := range encoded {
			getters[i] = func(k string) (string, bool) { return lookupEncoded(e, k) }
		}
		i, n := 0, 0
		for b.Loop() {
			if sel.Match(getters[i]) {
				n++
			}
			i = (i + 1) % len(getters)
		}
		sink = n
	})
	b.Run("tags/unit-code", func(b *testing.B) {
		i, n := 0, 0
		for b.Loop() {
			if _, ok := tagCodes[codes[i]]; ok {
				n++
			}
			i = (i + 1) % len(codes)
		}
		sink = n
	})
	b.Run("tags/encoded", func(b *testing.B) {
		i, n := 0, 0
		for b.Loop() {
			tags, _ := lookupEncoded(encoded[i], "TAGS")
			if _, ok := tagCodes[javaHash(tags)]; ok {
				n++
			}
			i = (i + 1) % len(encoded)
		}
		sink = n
	})
}

var sink int

func TestLookupEncoded(t *testing.T) {
	e := encodedProps("a", "1", "TAGS", "x", "empty", "")
	for k, want := range map[string]string{"a": "1", "TAGS": "x", "empty": ""} {
		got, ok := lookupEncoded(e, k)
		if !ok || got != want {
			t.Fatalf("lookupEncoded(%q) = %q, %v; want %q", k, got, ok, want)
		}
	}
	if _, ok := lookupEncoded(e, "b"); ok {
		t.Fatal("found a missing key")
	}
}

// BenchmarkEval isolates the evaluator: property lookups are a switch, not a map.
func BenchmarkEval(b *testing.B) {
	get := func(k string) (string, bool) {
		switch k {
		case "a":
			return "7", true
		case "region":
			return "us", true
		}
		return "", false
	}
	for _, expr := range []string{
		"a > 5 AND region IN ('eu','us')",
		"region = 'us' AND a <> 3",
		"a BETWEEN 1 AND 10 OR region IS NULL",
	} {
		sel, err := Compile(expr)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(expr, func(b *testing.B) {
			n := 0
			for b.Loop() {
				if sel.Match(get) {
					n++
				}
			}
			sink = n
		})
	}
}
