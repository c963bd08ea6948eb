package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"

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
