package control

// PopQueueView is a pop-consuming group's progress in one queue (RocketMQ 5 consumers over
// the gRPC endpoint): what it holds in flight and what it acknowledged.
type PopQueueView struct {
	// InFlight messages are handed out and neither acknowledged nor expired.
	InFlight int `json:"in_flight"`
	// Visible messages are read and not done, waiting to be handed out (their invisibility
	// expired, or a FIFO message group holds them).
	Visible int `json:"visible"`
	// Acked, DeadLettered and Redelivered count since the progress was made.
	Acked        uint64 `json:"acked"`
	DeadLettered uint64 `json:"dead_lettered"`
	Redelivered  uint64 `json:"redelivered"`
	// ConsumedOffset: every message below it is acknowledged or dead-lettered; NextOffset:
	// the next one read fresh.
	ConsumedOffset int64 `json:"consumed_offset"`
	NextOffset     int64 `json:"next_offset"`
}

// addPop adds the group's pop progress to out: each queue it pops from gets its Pop view,
// and its lag is counted from the consumed offset, so unacknowledged messages are lag.
func (s *Service) addPop(out *GroupDescribeReply, group string) {
	stats := s.b.PopStats(group)
	if len(stats) == 0 {
		return
	}
	topics := map[string]int{}
	for i, t := range out.Topics {
		topics[t.Topic] = i
	}
	for _, st := range stats {
		ti, ok := topics[st.Topic]
		if !ok {
			out.Topics = append(out.Topics, GroupTopicView{Topic: st.Topic, Queues: []GroupQueueView{}})
			ti = len(out.Topics) - 1
			topics[st.Topic] = ti
		}
		t := &out.Topics[ti]
		qi := -1
		for i, q := range t.Queues {
			if q.Queue == st.QueueID {
				qi = i
			}
		}
		if qi < 0 {
			t.Queues = append(t.Queues, GroupQueueView{Queue: st.QueueID, MaxOffset: st.MaxOffset})
			qi = len(t.Queues) - 1
		}
		q := &t.Queues[qi]
		q.Pop = &PopQueueView{
			InFlight: st.InFlight, Visible: st.Visible, Acked: st.Acked, DeadLettered: st.DeadLettered,
			Redelivered: st.Redelivered, ConsumedOffset: st.ConsumedOffset, NextOffset: st.NextOffset,
		}
		if q.Committed == nil {
			q.Lag = max(st.MaxOffset-st.ConsumedOffset, 0)
		}
	}
	out.Lag = 0
	for i := range out.Topics {
		t := &out.Topics[i]
		t.Lag = 0
		for _, q := range t.Queues {
			t.Lag += q.Lag
		}
		out.Lag += t.Lag
	}
}
