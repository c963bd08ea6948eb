package control

import (
	"context"
	"time"
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
}

func (s *Service) brokerStatus(_ context.Context, data []byte) (any, error) {
	if err := decode(data, &struct{}{}); err != nil {
		return nil, err
	}
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
	return out, nil
}
