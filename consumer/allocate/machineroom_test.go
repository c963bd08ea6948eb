package allocate

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/protocol"
)

// brokerRoom follows Java's brokerName.split("@") then length == 2. (The Java golden vectors
// confirm the odd cases end to end.)
func TestBrokerRoom(t *testing.T) {
	tests := []struct {
		name string
		room string
		ok   bool
	}{
		{"room1@broker-a", "room1", true},
		{"room1@broker-c@", "room1", true}, // trailing empty part dropped
		{"room2@@", "", false},             // ["room2"]
		{"@broker-d", "", true},            // ["", "broker-d"]
		{"room1@x@y", "", false},
		{"room1@", "", false},
		{"@", "", false}, // [] in Java
		{"nobroker", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		room, ok := brokerRoom(tt.name)
		assert.Equal(t, tt.ok, ok, tt.name)
		assert.Equal(t, tt.room, room, tt.name)
	}
}

func TestByMachineRoomNoQueuesInRooms(t *testing.T) {
	req := Request{Group: "g", Queues: propertyQueues(9), ClientIDs: propertyClients(2)}
	for _, rooms := range [][]string{nil, {"elsewhere"}} {
		all := allocateAll(t, ByMachineRoom(rooms), req)
		for id, qs := range all {
			assert.NotNil(t, qs, id)
			assert.Empty(t, qs, id)
		}
	}
	// Only room r1's 3 queues, among 2 members.
	all := allocateAll(t, ByMachineRoom([]string{"r1"}), req)
	assert.Len(t, all[req.ClientIDs[0]], 2)
	assert.Len(t, all[req.ClientIDs[1]], 1)
}

// mapResolver resolves from maps; missing entries resolve to "".
type mapResolver struct {
	brokers map[string]string
	clients map[string]string
}

func (r mapResolver) BrokerRoom(q protocol.MessageQueue) string { return r.brokers[q.BrokerName] }
func (r mapResolver) ClientRoom(id string) string               { return r.clients[id] }

func TestMachineRoomNearby(t *testing.T) {
	// hz: 4 queues, 2 members. sh: 3 queues, 1 member. bj: 2 queues, no member.
	var qs []protocol.MessageQueue
	for _, b := range []struct {
		name string
		n    int
	}{{"bj-broker", 2}, {"hz-broker", 4}, {"sh-broker", 3}} {
		for i := range b.n {
			qs = append(qs, protocol.MessageQueue{Topic: "T", BrokerName: b.name, QueueID: i})
		}
	}
	res := mapResolver{
		brokers: map[string]string{"bj-broker": "bj", "hz-broker": "hz", "sh-broker": "sh"},
		clients: map[string]string{"a": "hz", "b": "sh", "c": "hz"},
	}
	all := allocateAll(t, MachineRoomNearby(Averagely(), res), Request{Group: "g", Queues: qs, ClientIDs: []string{"a", "b", "c"}})
	names := func(qs []protocol.MessageQueue) []string {
		out := []string{}
		for _, q := range qs {
			out = append(out, q.BrokerName[:2]+string(rune('0'+q.QueueID)))
		}
		return out
	}
	// bj's 2 orphaned queues go averagely to all of a, b, c; hz's 4 to a and c; sh's 3 to b.
	assert.Equal(t, []string{"bj0", "hz0", "hz1"}, names(all["a"]))
	assert.Equal(t, []string{"bj1", "sh0", "sh1", "sh2"}, names(all["b"]))
	assert.Equal(t, []string{"hz2", "hz3"}, names(all["c"]))
}

func TestMachineRoomNearbyErrors(t *testing.T) {
	qs := []protocol.MessageQueue{{Topic: "T", BrokerName: "hz-broker"}, {Topic: "T", BrokerName: "xx-broker"}}
	req := Request{Group: "g", ClientID: "a", Queues: qs, ClientIDs: []string{"a", "b"}}

	res := mapResolver{brokers: map[string]string{"hz-broker": "hz"}, clients: map[string]string{"a": "hz", "b": "hz"}}
	_, err := MachineRoomNearby(Averagely(), res).Allocate(context.Background(), req)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "no machine room for MessageQueue [topic=T, brokerName=xx-broker, queueId=0]")

	res = mapResolver{brokers: map[string]string{"hz-broker": "hz", "xx-broker": "xx"}, clients: map[string]string{"a": "hz"}}
	_, err = MachineRoomNearby(Averagely(), res).Allocate(context.Background(), req)
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), `no machine room for client "b"`)

	// Inner errors come back wrapped with the room, still matchable.
	res = mapResolver{brokers: map[string]string{"hz-broker": "hz", "xx-broker": "xx"}, clients: map[string]string{"a": "hz", "b": "hz"}}
	_, err = MachineRoomNearby(failing{}, res).Allocate(context.Background(), req)
	require.ErrorIs(t, err, errFailing)
	assert.Contains(t, err.Error(), `MACHINE_ROOM_NEARBY-FAIL: room "hz"`)
}

var errFailing = errors.New("inner failed")

type failing struct{}

func (failing) Name() string { return "FAIL" }
func (failing) Allocate(context.Context, Request) ([]protocol.MessageQueue, error) {
	return nil, errFailing
}
