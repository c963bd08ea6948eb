package plugins

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/flowd-io/flowd/runtime"
)

// Output is one message a transform produced. Topic, queue, offset and timestamp are the
// host's to decide.
type Output struct {
	Tags, Keys string
	Properties []byte
	Body       []byte
}

// Transform runs a transform plugin: the active version of its slot turns each message into
// zero, one or more messages. It is safe for concurrent use; each call borrows one instance.
type Transform struct {
	src source
}

// NewTransform returns a Transform calling the active version of slot, which must hold
// transform plugins loaded with [Manifest.Spec].
func NewTransform(slot *runtime.Slot) *Transform { return &Transform{src: slot} }

// Apply returns, for each message, what the plugin made of it, copied out of guest memory.
// The guest's output is checked before it is used ([ErrBadOutput] if it does not parse).
//
// When the plugin failed open (errors.Is(err, runtime.ErrPolicyOpen)) the result passes
// every message through unchanged and the error is returned too; on any other error the
// result is nil.
func (t *Transform) Apply(ctx context.Context, msgs []Message) ([][]Output, error) {
	out, err := t.apply(ctx, msgs)
	if err != nil {
		if errors.Is(err, runtime.ErrPolicyOpen) {
			return passThrough(msgs), err
		}
		return nil, err
	}
	return out, nil
}

func passThrough(msgs []Message) [][]Output {
	out := make([][]Output, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		out[i] = []Output{{Tags: m.Tags, Keys: m.Keys, Properties: m.Properties, Body: m.Body}}
	}
	return out
}

func (t *Transform) apply(ctx context.Context, msgs []Message) ([][]Output, error) {
	out := make([][]Output, len(msgs))
	if len(msgs) == 0 {
		return out, nil
	}
	inst, err := t.src.Borrow(ctx)
	if err != nil {
		return nil, fmt.Errorf("transform: %w", err)
	}
	defer inst.Release()
	st, err := stateOf(inst, KindTransform)
	if err != nil {
		return nil, err
	}
	return out, st.fail(ctx, ExportTransform, st.transform(ctx, msgs, out))
}

func (st *state) transform(ctx context.Context, msgs []Message, out [][]Output) error {
	for from := 0; from < len(msgs); {
		end, size, err := batchEnd(msgs, from, true)
		if err != nil {
			return fmt.Errorf("plugin %s: %w", st.v.name, err)
		}
		buf, err := st.input(ctx, size)
		if err != nil {
			return err
		}
		encodeRecords(buf, msgs[from:end], true)
		st.stack[0], st.stack[1], st.stack[2] = uint64(st.buf), uint64(size), uint64(end-from)
		if err := st.inst.Call(ctx, st.call, st.stack[:]); err != nil {
			return err
		}
		res, err := st.output(st.stack[0])
		if err != nil {
			return err
		}
		if err := decodeOutputs(res, out[from:end]); err != nil {
			return err
		}
		from = end
	}
	return nil
}

// decodeOutputs parses transform output into out, one entry per input message, copying
// everything out of b (guest memory).
func decodeOutputs(b []byte, out [][]Output) error {
	r := reader{b: b}
	for i := range out {
		count := r.u32()
		if r.err != nil {
			break
		}
		if uint64(count) > uint64(len(r.b)-r.off)/12 { // each output is at least 12 bytes
			return fmt.Errorf("message %d: %d outputs cannot fit in %d bytes: %w", i, count, len(r.b)-r.off, ErrBadOutput)
		}
		outs := make([]Output, count)
		for j := range outs {
			outs[j].Tags = string(r.str16())
			outs[j].Keys = string(r.str16())
			outs[j].Properties = clone(r.bytes32())
			outs[j].Body = clone(r.bytes32())
		}
		out[i] = outs
	}
	if r.err != nil {
		return fmt.Errorf("%w: %w", r.err, ErrBadOutput)
	}
	if r.off != len(b) {
		return fmt.Errorf("%d bytes left over after %d messages: %w", len(b)-r.off, len(out), ErrBadOutput)
	}
	return nil
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

// reader decodes little-endian fields, remembering the first overrun.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) need(n int) bool {
	if r.err != nil {
		return false
	}
	if n < 0 || len(r.b)-r.off < n {
		r.err = fmt.Errorf("output ends at byte %d, a field needs %d more", len(r.b), n-(len(r.b)-r.off))
		return false
	}
	return true
}

func (r *reader) u32() uint32 {
	if !r.need(4) {
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) str16() []byte {
	if !r.need(2) {
		return nil
	}
	n := int(binary.LittleEndian.Uint16(r.b[r.off:]))
	r.off += 2
	if !r.need(n) {
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off]
}

func (r *reader) bytes32() []byte {
	n := int(r.u32())
	if !r.need(n) {
		return nil
	}
	r.off += n
	return r.b[r.off-n : r.off]
}

// selfTestTransform transforms one message.
func selfTestTransform(ctx context.Context, inst *runtime.Instance) error {
	st, err := stateOf(inst, KindTransform)
	if err != nil {
		return err
	}
	out := make([][]Output, 1)
	return st.transform(ctx, []Message{{Topic: "flowd-self-test", Body: []byte("{}")}}, out)
}
