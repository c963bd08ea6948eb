package consumer

import (
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/flowd-io/flowd/consumer/allocate"
	"github.com/flowd-io/flowd/protocol"
)

// hooks is the face the consumer shows the client core (clientcore.Consumer), kept off
// LitePull's own method set.
type hooks LitePull

func (h *hooks) ConsumerData() protocol.ConsumerData {
	l := (*LitePull)(h)
	l.mu.Lock()
	defer l.mu.Unlock()
	cd := protocol.ConsumerData{
		GroupName:           l.group,
		ConsumeType:         protocol.ConsumeActively,
		MessageModel:        l.cfg.model.String(),
		ConsumeFromWhere:    l.cfg.consumeFrom.String(),
		SubscriptionDataSet: []protocol.SubscriptionData{},
	}
	if l.cfg.model == Clustering {
		// Broadcasting members do not allocate: they have nothing to agree on.
		cd.Allocator = allocate.Identity(l.cfg.strategy)
	}
	for _, t := range slices.Sorted(maps.Keys(l.subs)) {
		cd.SubscriptionDataSet = append(cd.SubscriptionDataSet, l.subs[t].data())
	}
	return cd
}

func (h *hooks) NotifyConsumerIDsChanged() { (*LitePull)(h).triggerRebalance() }

// ConnectionLost: the broker dropped this member and released its queue locks when the
// connection closed, and another member may take them over at once. Stop handing out the
// queues of those brokers now, and have the rebalance goroutine heartbeat (rejoin) and renew
// the locks before they are read again; a queue whose lock went to another member is dropped
// without committing, as on any lost lock, and so is a queue whose lock is granted again: the
// lock was free meanwhile, another member may have read and committed the queue, so its
// cached messages go and its committed offset is read again before anything of it is handed
// out.
func (h *hooks) ConnectionLost(brokers []string) {
	l := (*LitePull)(h)
	l.mu.Lock()
	l.lockEpoch++
	for _, q := range l.queues {
		if q.locked && slices.Contains(brokers, q.mq.BrokerName) {
			q.lockValidUntil = time.Time{}
			q.lockLost = true
			l.renewNow = true
		}
	}
	l.needHeartbeat = true
	l.mu.Unlock()
	l.triggerRebalance()
}

func (h *hooks) RouteChanged(topic string, queues []protocol.MessageQueue) {
	(*LitePull)(h).setTopicQueues(topic, queues, true)
}

func (h *hooks) RunningInfo() *protocol.ConsumerRunningInfo {
	l := (*LitePull)(h)
	l.mu.Lock()
	defer l.mu.Unlock()
	info := &protocol.ConsumerRunningInfo{
		Properties: map[string]string{
			"PROP_CONSUME_TYPE":              protocol.ConsumeActively,
			"PROP_CONSUMER_START_TIMESTAMP":  strconv.FormatInt(l.started.UnixMilli(), 10),
			"PROP_CLIENT_VERSION":            "flowd",
			"PROP_THREADPOOL_CORE_SIZE":      strconv.Itoa(l.pullBound()),
			"messageModel":                   l.cfg.model.String(),
			"consumeFromWhere":               l.cfg.consumeFrom.String(),
			"allocateMessageQueueStrategy":   l.cfg.strategy.Name(),
			"allocator":                      allocate.Identity(l.cfg.strategy),
			"allocatorInUse":                 l.alloc.inUse,
			"allocatorMismatch":              l.alloc.mismatch,
			"handoverLocks":                  strconv.FormatBool(l.lockedMode()),
			"pullBatchSize":                  strconv.Itoa(l.cfg.pullBatchSize),
			"autoCommit":                     strconv.FormatBool(l.cfg.autoCommit),
			"autoCommitIntervalMillis":       strconv.FormatInt(l.cfg.autoCommitInt.Milliseconds(), 10),
			"pullThresholdForQueue":          strconv.Itoa(l.cfg.thresholdQueue),
			"pullThresholdSizeForQueueBytes": strconv.FormatInt(l.cfg.thresholdSize, 10),
		},
		MQTable: map[protocol.MessageQueue]protocol.ProcessQueueInfo{},
	}
	for _, t := range slices.Sorted(maps.Keys(l.subs)) {
		info.SubscriptionSet = append(info.SubscriptionSet, l.subs[t].data())
	}
	for mq, q := range l.queues {
		pi := protocol.ProcessQueueInfo{
			CommitOffset:       q.consumeOffset,
			CachedMsgCount:     int64(q.count),
			CachedMsgSizeInMiB: q.bytes >> 20,
			Locked:             q.locked,
			Dropped:            q.dropped,
			LastPullTimestamp:  q.lastPull.UnixMilli(),
		}
		if first, last, ok := q.span(); ok {
			pi.CachedMsgMinOffset, pi.CachedMsgMaxOffset = first, last
		}
		info.MQTable[mq] = pi
	}
	return info
}

func (h *hooks) ResetOffset(topic string, offsets map[protocol.MessageQueue]int64) {
	l := (*LitePull)(h)
	for mq, off := range offsets {
		if mq.Topic != topic {
			continue
		}
		if err := l.seekTo(mq, off); err != nil {
			l.log.Debug("reset offset of a queue not owned", "queue", mq.String(), "offset", off)
		}
	}
}

// span returns the first and last offsets of q's cached messages.
func (q *queue) span() (first, last int64, ok bool) {
	for _, b := range q.cache {
		if len(b.msgs) > 0 {
			if !ok {
				first, ok = b.msgs[0].QueueOffset, true
			}
			last = b.msgs[len(b.msgs)-1].QueueOffset
		}
	}
	return first, last, ok
}

// pullBound is how many pulls may be in flight at once: WithPullGoroutines, or by default
// the owned queues (one each). l.mu is held.
func (l *LitePull) pullBound() int {
	if l.cfg.pullGoroutines > 0 {
		return l.cfg.pullGoroutines
	}
	return len(l.queues)
}
