package consumer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

func TestReadTargetPicksTheMemberToPullFrom(t *testing.T) {
	set := []clientcore.Member{{ID: 0, Addr: "m"}, {ID: 2, Addr: "r2"}, {ID: 3, Addr: "r3"}}
	noMaster := []clientcore.Member{{ID: 2, Addr: "r2"}, {ID: 3, Addr: "r3"}}
	for _, c := range []struct {
		name       string
		members    []clientcore.Member
		suggested  int64
		masterDown bool
		want       string // "" for none
	}{
		{"no route", nil, 0, false, ""},
		{"the master by default", set, 0, false, "m"},
		{"a suggested replica", set, 3, false, "r3"},
		{"a suggested member the route does not list: the master", set, 5, false, "m"},
		{"the master failed: the lowest-id replica", set, 0, true, "r2"},
		{"the master failed, a replica suggested: that one", set, 3, true, "r3"},
		{"the master failed, no replica: the master still", []clientcore.Member{{ID: 0, Addr: "m"}}, 0, true, "m"},
		{"no master listed: the lowest id", noMaster, 0, false, "r2"},
		{"no master listed, one suggested", noMaster, 3, false, "r3"},
		{"a single broker", []clientcore.Member{{ID: 0, Addr: "m"}}, 2, false, "m"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, ok := readTarget(c.members, c.suggested, c.masterDown)
			assert.Equal(t, c.want != "", ok)
			assert.Equal(t, c.want, m.Addr)
		})
	}
}

func TestNextReadFollowsTheSuggestionAndFallsBack(t *testing.T) {
	const ok = protocol.Success
	for _, c := range []struct {
		name     string
		from     int64
		answered bool
		code     protocol.ResponseCode
		suggest  int64
		advanced bool
		failed   bool
		want     readOutcome
	}{
		{"the master suggests a replica", 0, true, ok, 2, false, false, readOutcome{next: 2}},
		{"the master keeps it", 0, true, ok, 0, false, false, readOutcome{}},
		{"the replica keeps it", 2, true, ok, 2, false, false, readOutcome{next: 2}},
		{"the replica sends it back", 2, true, ok, 0, false, false, readOutcome{}},
		{"a caught-up replica: back to the master now", 2, true, protocol.PullRetryImmediately, 0, false, false, readOutcome{masterBack: true}},
		{"a replica's batch matched none: it keeps the queue", 2, true, protocol.PullRetryImmediately, 2, true, false, readOutcome{next: 2}},
		{"nothing new at the master", 0, true, protocol.PullNotFound, 0, false, false, readOutcome{}},
		{"the master retries at once", 0, true, protocol.PullRetryImmediately, 0, false, false, readOutcome{}},
		{"an offset moved at the master", 0, true, protocol.PullOffsetMoved, 0, false, false, readOutcome{}},
		{"the replica failed: the master", 2, false, 0, 0, false, true, readOutcome{}},
		{"the master failed: replicas for a while", 0, false, 0, 0, false, true, readOutcome{masterFailed: true}},
		{"a replica refuses: the master", 2, true, protocol.SystemError, 0, false, false, readOutcome{}},
		{"a cancelled pull", 2, false, 0, 0, false, false, readOutcome{}},
		{"no member found: the master, and no fallback", noMember, false, 0, 0, false, true, readOutcome{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, nextRead(c.from, c.answered, c.code, c.suggest, c.advanced, c.failed))
		})
	}
}

// A pull's outcome moves the queue's next pull, opens and closes the broker's fallback to
// its replicas, and counts into ReadStats by the member that answered.
func TestPullOutcomesSteerTheQueueAndCountReads(t *testing.T) {
	l := newUnstarted(t)
	mq := MessageQueue{Topic: "t", BrokerName: "b", QueueID: 0}
	q := addActive(l, mq)
	answer := func(code protocol.ResponseCode) *protocol.Command {
		return &protocol.Command{Code: int32(code), Flag: 1}
	}
	note := func(from int64, resp *protocol.Command, res *pullResult, err error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.notePullLocked(q, from, resp, res, err)
	}
	down := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return time.Now().Before(l.masterDown["b"])
	}
	note(0, answer(protocol.Success), &pullResult{code: protocol.Success, suggest: 2, msgs: make([]*Message, 8)}, nil)
	assert.Equal(t, int64(2), q.readFrom)
	note(2, answer(protocol.Success), &pullResult{code: protocol.Success, suggest: 2, msgs: make([]*Message, 8)}, nil)
	note(2, answer(protocol.Success), &pullResult{code: protocol.Success, suggest: 0, msgs: make([]*Message, 3)}, nil)
	assert.Equal(t, int64(0), q.readFrom)

	note(0, nil, nil, errors.New("connection refused"))
	assert.True(t, down(), "the master failed")
	note(2, nil, nil, context.Canceled)
	assert.True(t, down(), "a cancelled pull says nothing about the master")
	note(2, answer(protocol.PullRetryImmediately), &pullResult{code: protocol.PullRetryImmediately, requested: 40, next: 72, suggest: 2}, nil)
	assert.True(t, down(), "a batch the filter matched none of does not end the fallback")
	note(2, answer(protocol.PullRetryImmediately), &pullResult{code: protocol.PullRetryImmediately, requested: 72, next: 72}, nil)
	assert.False(t, down(), "a caught-up replica sends the consumer back to the master")

	assert.Equal(t, []ReadStat{
		{BrokerName: "b", BrokerID: 0, Pulls: 1, Messages: 8},
		{BrokerName: "b", BrokerID: 2, Pulls: 4, Messages: 11},
	}, l.ReadStats())
}
