package control

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/flowd-io/flowd/fields"
)

// Addresses are the node's listening addresses.
type Addresses struct {
	// Broker is the advertised RocketMQ remoting address.
	Broker string `json:"broker"`
	// Namesrv is the built-in name service's address; absent when it is off.
	Namesrv string `json:"namesrv,omitempty"`
	// NATS is the NATS server the control service is connected to.
	NATS string `json:"nats,omitempty"`
}

// StoreView is the store's positions and counters.
type StoreView struct {
	CommitLogMinOffset int64 `json:"commit_log_min_offset"`
	CommitLogMaxOffset int64 `json:"commit_log_max_offset"`
	DispatchedOffset   int64 `json:"dispatched_offset"`
	FlushedOffset      int64 `json:"flushed_offset"`
	Segments           int   `json:"segments"`
	Fsyncs             int64 `json:"fsyncs"`
	ConsumeQueues      int   `json:"consume_queues"`
	// WriteFailure is the error that stopped the store taking writes; absent when it takes them.
	WriteFailure string `json:"write_failure,omitempty"`
}

// StatusReply is the reply of broker.status.
type StatusReply struct {
	Origin
	BrokerName    string    `json:"broker_name"`
	Addresses     Addresses `json:"addresses"`
	Started       time.Time `json:"started"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	Topics        int       `json:"topics"`
	Groups        int       `json:"groups"`
	// Clients counts the distinct consumer clients with live group members; Members counts
	// their memberships.
	Clients      int   `json:"clients"`
	Members      int   `json:"members"`
	LockedQueues int   `json:"locked_queues"`
	WaitingPulls int64 `json:"waiting_pulls"`
	// EventsDropped counts the broker events dropped because a subscriber (the NATS event
	// publisher) fell behind.
	EventsDropped uint64    `json:"events_dropped"`
	Store         StoreView `json:"store"`
	// Brokers is, in a cluster, every answering node's status (this node's as above
	// included), one entry per node by broker name; absent otherwise.
	Brokers []StatusReply `json:"brokers,omitempty"`
	Coverage
}

// StatusRequest is the request of broker.status and cluster.status: nothing, or a scope
// (see Scope).
type StatusRequest struct {
	Local   bool             `json:"local,omitempty"`
	Timeout *fields.Duration `json:"timeout,omitempty"`
}

func (s *Service) brokerStatus(ctx context.Context, data []byte) (any, error) {
	var req StatusRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	gather, bound, err := s.gathers(ctx, Scope(req))
	if err != nil {
		return nil, err
	}
	out := s.localStatus()
	if !gather {
		return out, nil
	}
	answers, cov := gatherFrom[StatusReply](s, "broker.status", data, bound)
	out.Brokers = []StatusReply{out}
	for _, a := range answers {
		out.Brokers = append(out.Brokers, a.reply)
	}
	slices.SortFunc(out.Brokers, func(x, y StatusReply) int { return cmp.Compare(x.BrokerName, y.BrokerName) })
	out.Coverage = cov
	return out, nil
}

// localStatus is this node's broker.status.
func (s *Service) localStatus() StatusReply {
	st := s.b.Status()
	out := StatusReply{
		Origin: s.origin(), BrokerName: st.BrokerName,
		Addresses:     Addresses{Broker: st.Addr, Namesrv: st.NamesrvAddr, NATS: s.nc.ConnectedUrlRedacted()},
		Started:       st.Started.UTC(),
		UptimeSeconds: time.Since(st.Started).Seconds(),
		Topics:        st.Topics, Groups: st.Groups, Clients: st.Clients, Members: st.Members,
		LockedQueues: st.LockedQueues, WaitingPulls: st.WaitingPulls, EventsDropped: st.EventsDropped,
		Store: StoreView{
			CommitLogMinOffset: st.Store.CommitLogMinOffset, CommitLogMaxOffset: st.Store.CommitLogMaxOffset,
			DispatchedOffset: st.Store.DispatchedOffset, FlushedOffset: st.Store.FlushedOffset,
			Segments: st.Store.Segments, Fsyncs: st.Store.Fsyncs, ConsumeQueues: st.Store.ConsumeQueues,
		},
	}
	if st.Store.WriteFailure != nil {
		out.Store.WriteFailure = st.Store.WriteFailure.Error()
	}
	return out
}
