package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
)

// A compare-and-set that another write beat is a lost race, whichever code JetStream
// answers it with (10071, or 10164 from a replicated stream, which nats.go's ErrKeyExists
// does not match); an unanswered call is not.
func TestLostRace(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"wrong last sequence 10071", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence, Description: "wrong last sequence: 7"}, true},
		{"wrong last sequence 10164", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"}, true},
		{"10164 wrapped", fmt.Errorf("update: %w", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}), true},
		{"key exists", jetstream.ErrKeyExists, true},
		{"revision mismatch", fmt.Errorf("x: %w", jetstream.ErrKeyRevisionMismatch), true},
		{"no responders", nats.ErrNoResponders, false},
		{"timeout", context.DeadlineExceeded, false},
		{"another API error", &jetstream.APIError{Code: 503, ErrorCode: jetstream.JSErrCodeJetStreamNotEnabled}, false},
		{"none", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, lostRace(c.err))
			require.False(t, errors.Is(c.err, jetstream.ErrKeyNotFound))
		})
	}
}

// slowKV answers each Get after delay, or not at all if the call's deadline comes first.
type slowKV struct {
	jetstream.KeyValue
	delay    time.Duration
	attempts atomic.Int32
}

func (k *slowKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	k.attempts.Add(1)
	select {
	case <-time.After(k.delay):
		return nil, jetstream.ErrKeyNotFound
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// A KV that answers slower than a read's first deadline is still read: each attempt waits
// longer than the last, where attempts of one fixed deadline would all be cut off.
func TestLeaseReadWaitsLongerForASlowServer(t *testing.T) {
	kv := &slowKV{delay: 250 * time.Millisecond}
	l := &Lease{o: LeaseOptions{KV: kv, TTL: 3 * time.Second, RenewInterval: time.Second}}
	require.Equal(t, 100*time.Millisecond, l.readTimeout(), "the first attempt's deadline is shorter than the server's answer")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := l.get(ctx, "k")
	require.ErrorIs(t, err, jetstream.ErrKeyNotFound, "the server's answer, not the caller's deadline")
	require.Equal(t, int32(3), kv.attempts.Load(), "100 ms and 200 ms attempts cut off, the 400 ms one answered")
}
