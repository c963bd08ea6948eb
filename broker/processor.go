package broker

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// brokerHandler is the broker listener's remoting.Handler: serveBroker, plus Inline, which
// lets the transport serve the sends that only append to the page cache on the connection's
// read goroutine.
type brokerHandler struct{ b *Broker }

func (h brokerHandler) ServeRemoting(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	return h.b.serveBroker(ctx, c, req)
}

func (h brokerHandler) Inline(req *protocol.Command) bool { return h.b.inline(req) }

// RawExt: the send handler decodes its header from the raw binary fields
// (protocol.DecodeSendHeader), without the ExtFields map.
func (h brokerHandler) RawExt(code protocol.RequestCode) bool {
	return code == protocol.SendMessageV2 || code == protocol.SendMessage || code == protocol.SendBatchMessage
}

// inline reports whether req never blocks, so that serving it on the connection's read
// goroutine costs less than handing it to another (remoting.InlineHandler): pop
// acknowledgements, a pop that finds messages at once (popInline), a send to an
// existing topic when the store has room in its active segment (Store.AppendReady; with
// SYNC_FLUSH, Store.PutAsyncReady: the send appends and its answer waits for the fsync
// deferred, see sendSyncFlush). Everything else is served on a goroutine of its own: a send
// that creates its topic writes the topic table, a send to a retry topic may create the
// dead-letter topic, a segment roll creates and syncs a file, and with SYNC_FLUSH a oneway
// send or a half message waits for its fsync. Half and delayed messages are plain appends
// too, and are inline with ASYNC_FLUSH.
func (b *Broker) inline(req *protocol.Command) bool {
	var topic, props string
	switch req.RequestCode() {
	case protocol.AckMessage, protocol.BatchAckMessage, protocol.ChangeMessageInvisibleTime:
		// In memory and one write to the pop journal's page cache, as an inline send.
		return true
	case protocol.PopMessage:
		return b.popInline(req)
	case protocol.SendMessageV2, protocol.SendBatchMessage:
		topic, props = req.Ext2("b", "i")
	case protocol.SendMessage:
		topic, props = req.Ext2("topic", "properties")
	default:
		return false
	}
	if strings.HasPrefix(topic, RetryTopicPrefix) {
		return false
	}
	if _, ok := b.topics.get(topic); !ok {
		return false
	}
	// A bound on the stored size: a batch's entries each grow by the stored header, the
	// topic and the broker's properties; a few KiB more keep inline sends off the end of a
	// segment.
	size := 4*len(req.Body) + 2*len(props) + len(topic) + 4096
	if b.syncReplicated() {
		// Only a single message's answer waits for its replicas deferred (sendReplicated);
		// a batch, a half message and a oneway send wait for them on their goroutine.
		return req.RequestCode() != protocol.SendBatchMessage && !req.IsOneway() && !isHalfRaw(sendSysFlag(req), props) && b.store.PutAsyncReady(size)
	}
	if b.store.SyncFlush() {
		// A SYNC_FLUSH send appends on the read goroutine and waits for its fsync deferred
		// (sendSyncFlush), unless it cannot be deferred (oneway) or is a half message,
		// whose bookkeeping waits for the fsync.
		sysFlag := "f"
		if req.RequestCode() == protocol.SendMessage {
			sysFlag = "sysFlag"
		}
		flag, _ := strconv.ParseInt(req.Ext(sysFlag), 10, 32)
		return !req.IsOneway() && !isHalfRaw(int32(flag), props) && b.store.PutAsyncReady(size)
	}
	return b.store.AppendReady(size)
}

// serveBroker serves the broker listener's requests: one call per request, each on its own
// goroutine (sends that never block aside, see inline), so a parked pull does not hold up
// the connection's other requests.
func (b *Broker) serveBroker(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	// Any request proves the client alive, not only a heartbeat: a member whose heartbeats
	// are refused or late but that pulls and commits must not expire.
	b.consumers.touch(c)
	switch req.RequestCode() {
	case protocol.SendMessage, protocol.SendMessageV2, protocol.SendBatchMessage:
		return b.processSend(ctx, c, req)
	case protocol.PullMessage:
		return b.processPull(ctx, c, req)
	case protocol.HeartBeat:
		return b.processHeartbeat(c, req)
	case protocol.UnregisterClient:
		return b.processUnregister(req)
	case protocol.GetConsumerListByGroup:
		return b.processConsumerList(req)
	case protocol.QueryConsumerOffset:
		return b.processQueryOffset(req)
	case protocol.UpdateConsumerOffset:
		return b.processUpdateOffset(c, req)
	case protocol.GetMaxOffset, protocol.GetMinOffset:
		return b.processMinMaxOffset(req)
	case protocol.SearchOffsetByTimestamp:
		return b.processSearchOffset(req)
	case protocol.ConsumerSendMsgBack:
		return b.processSendBack(ctx, c, req)
	case protocol.LockBatchMQ, protocol.UnlockBatchMQ:
		return b.processLock(c, req)
	case protocol.GetLockOwners:
		return b.processLockOwners(req)
	case protocol.EndTransaction:
		return b.processEndTransaction(ctx, req)
	case protocol.ViewMessageByID:
		return b.processViewMessage(req)
	case protocol.QueryMessage:
		return b.processQueryMessage(ctx, req)
	case protocol.SendReplyMessage, protocol.SendReplyMessageV2:
		return b.processSendReply(ctx, c, req)
	case protocol.GetTopicStatsInfo:
		return b.processTopicStats(req)
	case protocol.GetConsumeStats:
		return b.processConsumeStats(req)
	case protocol.GetConsumerConnectionList:
		return b.processConsumerConnectionList(req)
	case protocol.GetBrokerRuntimeInfo:
		return b.processRuntimeInfo(req)
	case protocol.GetAllTopicConfig:
		return b.processAllTopicConfig(req)
	case protocol.GetAllSubscriptionGroupConfig:
		return b.processAllGroupConfig(req)
	case protocol.UpdateAndCreateSubscriptionGroup:
		return b.processPutGroup(req)
	case protocol.DeleteSubscriptionGroup:
		return b.processDeleteGroup(req)
	case protocol.InvokeBrokerToResetOffset:
		return b.processInvokeReset(ctx, req)
	case protocol.PopMessage:
		return b.processPop(ctx, req)
	case protocol.AckMessage:
		return b.processAck(ctx, req)
	case protocol.BatchAckMessage:
		return b.processBatchAck(ctx, req)
	case protocol.ChangeMessageInvisibleTime:
		return b.processChangeInvisible(ctx, req)
	}
	return b.serveCommon(req)
}

// serveNamesrv is the name service listener's handler.
func (b *Broker) serveNamesrv(_ context.Context, _ *remoting.Conn, req *protocol.Command) *protocol.Command {
	return b.serveCommon(req)
}

// serveCommon answers what both listeners answer: routes, topic administration and the
// name-server inspection requests (cluster info, topic lists).
func (b *Broker) serveCommon(req *protocol.Command) *protocol.Command {
	switch req.RequestCode() {
	case protocol.GetRouteInfoByTopic:
		return b.processRoute(req)
	case protocol.UpdateAndCreateTopic:
		return b.processCreateTopic(req)
	case protocol.DeleteTopicInBroker, protocol.DeleteTopicInNamesrv:
		return b.processDeleteTopic(req)
	case protocol.GetBrokerClusterInfo:
		return b.processClusterInfo(req)
	case protocol.GetAllTopicListFromNamesrv:
		return b.processAllTopicList(req)
	case protocol.GetTopicsByCluster:
		return b.processTopicsByCluster(req)
	}
	return protocol.NewResponse(req, protocol.RequestCodeNotSupported, fmt.Sprintf("request code %d (%s) is not supported", req.Code, req.RequestCode()))
}

// checkQueue refuses a request about a queue that cannot exist: a topic name RocketMQ would
// refuse, a negative queue id, or a queue id beyond an existing topic's read queues. A valid
// name of a topic that does not exist (yet) passes: RocketMQ answers offset queries about it
// with 0, and clients ask before the first send creates the topic.
func (b *Broker) checkQueue(req *protocol.Command, topic string, queueID int32) *protocol.Command {
	if err := ValidateTopic(topic); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if queueID < 0 || queueID >= maxQueues {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("queueId %d is illegal: it must be within 0..%d", queueID, maxQueues-1))
	}
	if tc, ok := b.topics.get(topic); ok && int(queueID) >= tc.ReadQueueNums {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("queueId %d is illegal: topic %q has %d read queues", queueID, topic, tc.ReadQueueNums))
	}
	return nil
}

// checkOffsetRequest is checkQueue plus the group name, for requests that read or write a
// group's committed offset: the group is part of the key persisted in consumerOffset.json.
func (b *Broker) checkOffsetRequest(req *protocol.Command, group, topic string, queueID int32) *protocol.Command {
	if err := ValidateGroup(group); err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	return b.checkQueue(req, topic, queueID)
}

// LendInlineBody lets an inline send borrow its body from the connection's read buffer
// (remoting.LendingInlineHandler): the send copies it into the commit log before it
// returns and answers without it, so the transport need not copy it first.
func (h brokerHandler) LendInlineBody() {}
