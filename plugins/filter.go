package plugins

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/flowd-io/flowd/runtime"
)

// Message is what a filter or transform sees of a stored message.
type Message struct {
	Topic          string
	QueueID        int32
	QueueOffset    int64
	StoreTimestamp int64 // milliseconds since the Unix epoch
	Tags           string
	Keys           string // RocketMQ KEYS: keys separated by one space
	Properties     []byte // RocketMQ encoding: key 0x01 value 0x02, repeated
	Body           []byte // decompressed
}

// recordHeader is the fixed part of a message record (ABI.md, kind filter).
const recordHeader = 4 + 4 + 8 + 8 + 2 + 2 + 2 + 4 + 4

// recordSize is the encoded size of m, and whether its strings fit their u16 prefixes.
func recordSize(m *Message, body bool) (int, error) {
	if len(m.Topic) > maxU16 || len(m.Tags) > maxU16 || len(m.Keys) > maxU16 {
		return 0, fmt.Errorf("message %s/%d@%d: topic, tags or keys over %d bytes: %w", m.Topic[:min(len(m.Topic), 64)], m.QueueID, m.QueueOffset, maxU16, ErrTooLarge)
	}
	n := recordHeader + len(m.Topic) + len(m.Tags) + len(m.Keys) + len(m.Properties)
	if body {
		n += len(m.Body)
	}
	return n, nil
}

// batchEnd returns the end of the next chunk of msgs[from:] (at most MaxBatch messages and
// MaxBatchBytes, or one record) and its encoded size.
func batchEnd(msgs []Message, from int, body bool) (end, size int, err error) {
	end = from
	for end < len(msgs) && end-from < MaxBatch {
		n, err := recordSize(&msgs[end], body)
		if err != nil {
			return 0, 0, err
		}
		if end > from && size+n > MaxBatchBytes {
			break
		}
		size += n
		end++
	}
	return end, size, nil
}

// encodeRecords writes msgs as message records into b, which has exactly their size.
func encodeRecords(b []byte, msgs []Message, body bool) {
	off := 0
	le := binary.LittleEndian
	for i := range msgs {
		m := &msgs[i]
		start := off
		off += 4
		le.PutUint32(b[off:], uint32(m.QueueID))
		le.PutUint64(b[off+4:], uint64(m.QueueOffset))
		le.PutUint64(b[off+12:], uint64(m.StoreTimestamp))
		off = putStr16(b, off+20, m.Topic)
		off = putStr16(b, off, m.Tags)
		off = putStr16(b, off, m.Keys)
		off = putBytes32(b, off, m.Properties)
		if body {
			off = putBytes32(b, off, m.Body)
		} else {
			off = putBytes32(b, off, nil)
		}
		le.PutUint32(b[start:], uint32(off-start-4))
	}
}

// Filter runs a filter plugin: the active version of its slot decides which messages of a
// batch a consumer gets. It is safe for concurrent use; each call borrows one instance.
type Filter struct {
	src source
}

// NewFilter returns a Filter calling the active version of slot, which must hold filter
// plugins loaded with [Manifest.Spec] (a [Registry] hands out slots that do).
func NewFilter(slot *runtime.Slot) *Filter { return &Filter{src: slot} }

// Match sets keep[i] to whether msgs[i] passes the filter. keep must be at least as long as
// msgs. Batches larger than [MaxBatch] messages or [MaxBatchBytes] are split into several
// calls on one instance. Message bodies are passed only if the manifest sets wants_body.
//
// On error keep is still set, to what the fault policy says: all true when the plugin failed
// open (errors.Is(err, runtime.ErrPolicyOpen)), all false otherwise. A caller may therefore
// log the error and act on keep. Errors: [*runtime.FaultError] for traps, time-outs, memory
// faults, guest error codes ([ErrGuest]) and malformed bitmaps ([ErrBadOutput]);
// [runtime.ErrPolicyOpen] or [runtime.ErrPolicyClosed] once a fault stopped the version;
// [ErrTooLarge] for a message whose topic, tags or keys exceed 65 535 bytes.
func (f *Filter) Match(ctx context.Context, msgs []Message, keep []bool) error {
	if len(keep) < len(msgs) {
		return fmt.Errorf("filter: %d messages but room for %d verdicts", len(msgs), len(keep))
	}
	keep = keep[:len(msgs)]
	err := f.match(ctx, msgs, keep)
	if err != nil {
		open := errors.Is(err, runtime.ErrPolicyOpen)
		for i := range keep {
			keep[i] = open
		}
	}
	return err
}

func (f *Filter) match(ctx context.Context, msgs []Message, keep []bool) error {
	if len(msgs) == 0 {
		return nil
	}
	st, err := f.borrow(ctx)
	if err != nil {
		return err
	}
	defer st.inst.Release()
	return st.fail(ctx, ExportFilter, st.filter(ctx, msgs, keep))
}

// MatchWith is [Filter.Match] for messages that depend on the version filtering them:
// prepare gets the manifest of the version an instance was borrowed from and returns the
// messages (with bodies only if that manifest's WantsBody is set, say), so that manifest
// and verdicts come from one version even while another is being activated. keep must be
// at least as long as the messages. An error from prepare ends the call and is returned.
// On error keep is set as Match sets it.
func (f *Filter) MatchWith(ctx context.Context, keep []bool, prepare func(*Manifest) ([]Message, error)) error {
	err := f.matchWith(ctx, keep, prepare)
	if err != nil {
		open := errors.Is(err, runtime.ErrPolicyOpen)
		for i := range keep {
			keep[i] = open
		}
	}
	return err
}

func (f *Filter) matchWith(ctx context.Context, keep []bool, prepare func(*Manifest) ([]Message, error)) error {
	st, err := f.borrow(ctx)
	if err != nil {
		return err
	}
	defer st.inst.Release()
	msgs, err := prepare(st.v.man)
	if err != nil {
		return err
	}
	if len(keep) < len(msgs) {
		return fmt.Errorf("filter: %d messages but room for %d verdicts", len(msgs), len(keep))
	}
	if len(msgs) == 0 {
		return nil
	}
	return st.fail(ctx, ExportFilter, st.filter(ctx, msgs, keep[:len(msgs)]))
}

// borrow borrows an instance of the active version and returns its state; release it with
// st.inst.Release.
func (f *Filter) borrow(ctx context.Context) (*state, error) {
	inst, err := f.src.Borrow(ctx)
	if err != nil {
		return nil, fmt.Errorf("filter: %w", err)
	}
	st, err := stateOf(inst, KindFilter)
	if err != nil {
		inst.Release()
		return nil, err
	}
	return st, nil
}

// filter runs msgs through the guest in chunks.
func (st *state) filter(ctx context.Context, msgs []Message, keep []bool) error {
	for from := 0; from < len(msgs); {
		end, size, err := batchEnd(msgs, from, st.v.wantsBody)
		if err != nil {
			return fmt.Errorf("plugin %s: %w", st.v.name, err)
		}
		buf, err := st.input(ctx, size)
		if err != nil {
			return err
		}
		encodeRecords(buf, msgs[from:end], st.v.wantsBody)
		n := end - from
		st.stack[0], st.stack[1], st.stack[2] = uint64(st.buf), uint64(size), uint64(n)
		if err := st.inst.Call(ctx, st.call, st.stack[:]); err != nil {
			return err
		}
		if err := st.bitmap(int32(st.stack[0]), keep[from:end]); err != nil {
			return err
		}
		from = end
	}
	return nil
}

// bitmap validates the guest's bitmap at ptr and copies it into keep.
func (st *state) bitmap(ptr int32, keep []bool) error {
	if ptr < 0 {
		return &GuestError{Code: int64(ptr)}
	}
	n := len(keep)
	bm, ok := st.inst.Memory().Read(uint32(ptr), uint32((n+7)/8))
	if !ok {
		return fmt.Errorf("bitmap at %#x outside memory (%d bytes): %w", ptr, st.inst.Memory().Size(), ErrBadOutput)
	}
	if n%8 != 0 && bm[len(bm)-1]>>(n%8) != 0 {
		return fmt.Errorf("bitmap with bits set past message %d (last byte %#08b): %w", n, bm[len(bm)-1], ErrBadOutput)
	}
	for i := range keep {
		keep[i] = bm[i>>3]&(1<<(i&7)) != 0
	}
	return nil
}

// selfTestFilter filters one message with empty fields.
func selfTestFilter(ctx context.Context, inst *runtime.Instance) error {
	st, err := stateOf(inst, KindFilter)
	if err != nil {
		return err
	}
	var keep [1]bool
	return st.filter(ctx, []Message{{Topic: "flowd-self-test"}}, keep[:])
}
