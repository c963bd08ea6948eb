package broker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/flowd-io/flowd/broker/store"
	"github.com/flowd-io/flowd/internal/remoting"
	"github.com/flowd-io/flowd/protocol"
)

// processSend serves SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE.
func (b *Broker) processSend(ctx context.Context, c *remoting.Conn, req *protocol.Command) *protocol.Command {
	h, err := protocol.DecodeSendHeader(req)
	if err != nil {
		return errorResponse(req, protocol.InvalidParameter, err)
	}
	if isSystemTopic(h.Topic) {
		return errorResponse(req, protocol.NoPermission, fmt.Errorf("topic %q is reserved for the broker", h.Topic))
	}
	if b.cfg.Replication != nil {
		if err := b.cfg.Replication.Writable(); err != nil {
			return replicationRefusal(req, err)
		}
	}
	// The producer's properties are stored as they came, with the broker's appended
	// (stampStoredRaw), unless the message is a half or delayed one: those are rewritten
	// property by property, on a map. A batch's own properties are its entries'.
	if err := protocol.CheckProperties(h.Properties); err != nil {
		return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("properties: %w", err))
	}
	batch := req.RequestCode() == protocol.SendBatchMessage || h.Batch
	half := isHalfRaw(h.SysFlag, h.Properties)
	level := delayLevel(h.Properties)
	var props map[string]string
	var raw []byte
	if half || level > 0 {
		if props, err = protocol.DecodeProperties([]byte(h.Properties)); err != nil {
			return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("properties: %w", err))
		}
		// CLUSTER on every message, as Java's broker stamps it (request-reply needs it).
		props = b.stampStored(c, h.ProducerGroup, props)
	} else {
		raw = b.stampStoredRaw(make([]byte, 0, len(h.Properties)+len(protocol.PropertyCluster)+len(b.cfg.Cluster)+3), c, h.ProducerGroup, h.Properties)
	}
	if err := checkTransactionType(h.Topic, h.SysFlag); err != nil { // before it creates a topic
		return errorResponse(req, protocol.MessageIllegal, err)
	}
	if half && batch {
		return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("transactional messages cannot be batched (topic %q)", h.Topic))
	}
	tc, errResp := b.topicForSend(req, h)
	if errResp != nil {
		return errResp
	}
	queueID := h.QueueID
	if queueID < 0 {
		queueID = rand.Int32N(int32(tc.WriteQueueNums))
	}
	if int(queueID) >= tc.WriteQueueNums {
		return errorResponse(req, protocol.InvalidParameter, fmt.Errorf("queueId %d is illegal: topic %q has %d write queues", queueID, h.Topic, tc.WriteQueueNums))
	}
	base := protocol.MessageExt{
		Message:        protocol.Message{Topic: h.Topic, Flag: h.Flag, Properties: props},
		RawProperties:  raw,
		QueueID:        queueID,
		SysFlag:        h.SysFlag,
		BornTimestamp:  h.BornTimestamp,
		BornHost:       addrPort(c.RemoteAddr()),
		ReconsumeTimes: h.ReconsumeTimes,
	}
	if strings.HasPrefix(h.Topic, RetryTopicPrefix) {
		// A client that could not send a message back sends it to the retry topic itself;
		// past the maximum it belongs in the dead-letter topic.
		maxTimes := int(h.MaxReconsumeTimes)
		if maxTimes <= 0 {
			maxTimes = b.cfg.MaxReconsumeTimes
		}
		if int(h.ReconsumeTimes) >= maxTimes {
			dlq, err := b.internalTopic(DLQTopicPrefix + strings.TrimPrefix(h.Topic, RetryTopicPrefix))
			if err != nil {
				return errorResponse(req, protocol.SystemError, err)
			}
			base.Topic, base.QueueID = dlq.Name, 0
		}
	}

	if batch {
		return b.sendBatch(ctx, req, &base)
	}
	if len(req.Body) == 0 {
		return errorResponse(req, protocol.MessageIllegal, errors.New("message body is empty"))
	}
	if len(req.Body) > b.cfg.MaxMessageSize {
		return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("message body of %d bytes exceeds the %d-byte limit", len(req.Body), b.cfg.MaxMessageSize))
	}
	m := base
	m.Body = req.Body
	if half {
		// Stored in the half topic until END_TRANSACTION; the answer carries the real queue
		// and the half queue offset, which the producer's END_TRANSACTION names.
		b.producers.seen(cmp.Or(props[protocol.PropertyProducerGroup], h.ProducerGroup), "", c, time.Now())
		res, err := b.putHalf(ctx, &m, h.ProducerGroup)
		if err != nil && !storedUnflushed(err, res.MsgID != "") {
			return storeErrorResponse(req, err)
		}
		resp := storedResponse(req, err, &protocol.SendMessageResponseHeader{MsgID: res.MsgID, QueueID: queueID, QueueOffset: res.QueueOffset})
		if rerr := b.awaitReplicated(ctx, res.CommitLogOffset+int64(res.Size)); rerr != nil {
			return replicaTimeoutAnswer(resp, rerr)
		}
		return resp
	}
	if level > 0 && !strings.HasPrefix(m.Topic, DLQTopicPrefix) {
		b.delayed(&m, level)
	}
	if b.syncReplicated() {
		return b.sendReplicated(ctx, req, &m)
	}
	if b.store.SyncFlush() && b.sendSyncFlush(ctx, req, &m) {
		return nil // answered by the store's group commit
	}
	res, err := b.store.PutUnnamed(ctx, &m)
	return b.answerOne(req, m.Topic, m.QueueID, len(m.Body), res, err)
}

// answerOne answers the send of one message (of n body bytes, to topic and queueID) from
// its store result: the store's error when the message was not stored, else SUCCESS or
// FLUSH_DISK_TIMEOUT with its id, queue and offset. Written straight into the frame:
// nothing reads a send's answer before it goes out; the msgId too, from the store host and
// the commit-log offset (see sendAnswer), so res.MsgID is not read.
func (b *Broker) answerOne(req *protocol.Command, topic string, queueID int32, n int, res store.PutResult, err error) *protocol.Command {
	if err != nil && !storedUnflushed(err, res.Size > 0) {
		return storeErrorResponse(req, err)
	}
	if o := b.cfg.Observer; o != nil {
		o.MessagesIn(topic, 1, n)
	}
	a := sendAnswer(req, err, protocol.SendMessageResponseHeader{QueueID: queueID, QueueOffset: res.QueueOffset})
	if res.Size > 0 {
		a.idFrom, a.idHost, a.idOffset = true, b.store.StoreHost(), res.CommitLogOffset
	}
	return &a.cmd
}

// delayLevel is the DELAY property of a raw property block, 0 when absent or not a number.
func delayLevel[P ~string | ~[]byte](raw P) int {
	v, ok := protocol.PropertyIn(raw, protocol.PropertyDelayLevel)
	if !ok {
		return 0
	}
	lvl, _ := strconv.Atoi(string(v))
	return lvl
}

// sendAnswer is storedResponse with h (as protocol.NewResponseWith makes it), the response
// and its header in one allocation: a send's answer is made for every message.
//
// Instead of h.MsgID, the caller may set idFrom, idHost and idOffset, and the msgId is then
// written from them into the frame (protocol.AppendOffsetMsgID), without the string (one
// allocation per message) that Put makes.
func sendAnswer(req *protocol.Command, err error, h protocol.SendMessageResponseHeader) *answer {
	a := &answer{hdr: h}
	code, remark := protocol.Success, ""
	if err != nil {
		code, remark = protocol.FlushDiskTimeout, err.Error()
	}
	a.cmd = protocol.Command{
		Code: int32(code), Language: protocol.LangGo, Version: protocol.Version, Opaque: req.Opaque,
		Flag: protocol.FlagResponse, Remark: remark, Fields: a, Serialize: req.Serialize,
	}
	return a
}

// answer is a send's answer: the command and its header in one allocation.
type answer struct {
	cmd      protocol.Command
	hdr      protocol.SendMessageResponseHeader
	idFrom   bool           // the msgId is made from idHost and idOffset, not hdr.MsgID
	idHost   netip.AddrPort // the store host
	idOffset int64          // the commit-log offset
}

// AppendFields writes the answer's header, its msgId made from idHost and idOffset if
// idFrom.
func (a *answer) AppendFields(w protocol.FieldWriter) protocol.FieldWriter {
	if !a.idFrom {
		return a.hdr.AppendFields(w)
	}
	// h and the id's bytes stay on the stack (an IPv4 id's string fits the compiler's
	// stack buffer for conversions that do not escape).
	var id [64]byte
	h := a.hdr
	h.MsgID = string(protocol.AppendOffsetMsgID(id[:0], a.idHost, a.idOffset))
	return h.AppendFields(w)
}

func (b *Broker) sendBatch(ctx context.Context, req *protocol.Command, base *protocol.MessageExt) *protocol.Command {
	entries, err := protocol.DecodeBatchEntries(req.Body)
	if err != nil {
		return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("batch body: %w", err))
	}
	if len(entries) == 0 {
		return errorResponse(req, protocol.MessageIllegal, errors.New("batch is empty"))
	}
	// One allocation each for the messages, their pointers and every entry's properties.
	n := 0
	for _, e := range entries {
		n += len(e.Properties) + 1 + len(protocol.PropertyCluster) + 2 + len(b.cfg.Cluster)
	}
	props := make([]byte, 0, n)
	stored := make([]protocol.MessageExt, len(entries))
	ms := make([]*protocol.MessageExt, len(entries))
	for i, e := range entries {
		if len(e.Body) > b.cfg.MaxMessageSize {
			return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("batch message %d: body of %d bytes exceeds the %d-byte limit", i, len(e.Body), b.cfg.MaxMessageSize))
		}
		if delayLevel(e.Properties) > 0 {
			return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("batch message %d: delayed messages cannot be batched", i))
		}
		if isHalfRaw(base.SysFlag, e.Properties) {
			return errorResponse(req, protocol.MessageIllegal, fmt.Errorf("batch message %d: transactional messages cannot be batched (topic %q)", i, base.Topic))
		}
		m := &stored[i]
		*m = *base
		at := len(props)
		props = protocol.AppendSetProperty(props, e.Properties, protocol.PropertyCluster, b.cfg.Cluster)
		m.Flag, m.Properties, m.RawProperties, m.Body = e.Flag, nil, props[at:len(props):len(props)], e.Body
		ms[i] = m
	}
	bodies := 0
	for _, m := range ms {
		bodies += len(m.Body)
	}
	if b.store.SyncFlush() && !b.syncReplicated() {
		// Answered by the store's group commit once the fsync covering the batch finished
		// (see sendSyncFlush), unless the request cannot be deferred.
		if d, ok := remoting.DeferInFlight(ctx, nil); ok {
			stub := answerStub(req)
			topic, queueID, n := base.Topic, base.QueueID, len(ms)
			b.store.PutBatchAsync(ctx, ms, func(res []store.PutResult, err error) {
				d.Respond(b.batchAnswer(stub, topic, queueID, n, bodies, res, err))
			})
			return nil
		}
	}
	res, err := b.store.PutBatch(ctx, ms)
	resp := b.batchAnswer(req, base.Topic, base.QueueID, len(ms), bodies, res, err)
	if len(res) == len(ms) && (err == nil || storedUnflushed(err, true)) {
		last := res[len(res)-1]
		if rerr := b.awaitReplicated(ctx, last.CommitLogOffset+int64(last.Size)); rerr != nil {
			return replicaTimeoutAnswer(resp, rerr)
		}
	}
	return resp
}

// batchAnswer is the answer to a batch of n messages to topic and queueID (bodies bytes of
// bodies) that the store put with res and err.
func (b *Broker) batchAnswer(req *protocol.Command, topic string, queueID int32, n, bodies int, res []store.PutResult, err error) *protocol.Command {
	if err != nil && !storedUnflushed(err, len(res) == n) {
		return storeErrorResponse(req, err)
	}
	if o := b.cfg.Observer; o != nil {
		o.MessagesIn(topic, n, bodies)
	}
	ids := make([]string, len(res))
	for i, r := range res {
		ids[i] = r.MsgID
	}
	return storedResponse(req, err, &protocol.SendMessageResponseHeader{MsgID: strings.Join(ids, ","), QueueID: queueID, QueueOffset: res[0].QueueOffset})
}

// sendSyncFlush puts m, with a store in SYNC_FLUSH, without anyone waiting for the fsync
// that acknowledges it: the request is deferred (remoting.DeferInFlight) and the store's
// group-commit goroutine answers it, with SUCCESS once an fsync covers m, or
// FLUSH_DISK_TIMEOUT, as Put's result would be answered. The connection's read goroutine
// (the send is served inline, see inline) thus goes on reading while earlier sends wait
// for their fsync, and no goroutine per send waits. The deferred request keeps its
// in-flight slot, so a connection has at most MaxInFlightPerConn sends waiting.
//
// It reports false, having done nothing, when the request cannot be deferred (a oneway
// send, a closed connection, a Handler called directly): the caller then waits for the
// fsync with Put.
func (b *Broker) sendSyncFlush(ctx context.Context, req *protocol.Command, m *protocol.MessageExt) bool {
	d, ok := remoting.DeferInFlight(ctx, nil)
	if !ok {
		return false
	}
	// What the answer needs, without the request: its body may be lent (inline).
	stub := answerStub(req)
	topic, queueID, n := m.Topic, m.QueueID, len(m.Body)
	b.store.PutAsync(ctx, m, func(res store.PutResult, err error) {
		d.Respond(b.answerOne(stub, topic, queueID, n, res, err))
	})
	return true
}

// answerStub is what answering req later needs of it: its code, opaque, flag and serialize
// type.
func answerStub(req *protocol.Command) *protocol.Command {
	return &protocol.Command{Code: req.Code, Opaque: req.Opaque, Serialize: req.Serialize, Flag: req.Flag}
}

// topicForSend finds the topic a send goes to, creating it from the auto-create key when the
// producer asks for that and the broker allows it.
func (b *Broker) topicForSend(req *protocol.Command, h *protocol.SendMessageRequestHeader) (TopicConfig, *protocol.Command) {
	if tc, ok := b.topics.get(h.Topic); ok {
		if !tc.Writable() {
			return tc, errorResponse(req, protocol.NoPermission, fmt.Errorf("topic %q is not writable (perm %d)", h.Topic, tc.Perm))
		}
		return tc, nil
	}
	// Only a topic not in the table needs its name checked (every name in it was checked when
	// it was created), which keeps the regexp off the path of every send.
	if err := ValidateTopic(h.Topic); err != nil {
		return TopicConfig{}, errorResponse(req, protocol.MessageIllegal, err)
	}
	if strings.HasPrefix(h.Topic, RetryTopicPrefix) || strings.HasPrefix(h.Topic, DLQTopicPrefix) {
		tc, err := b.internalTopic(h.Topic)
		if err != nil {
			return tc, errorResponse(req, protocol.SystemError, err)
		}
		return tc, nil
	}
	if b.cfg.DisableAutoCreateTopics || h.DefaultTopic == "" {
		return TopicConfig{}, errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic %q does not exist; create it first", h.Topic))
	}
	def, ok := b.topics.get(h.DefaultTopic)
	if !ok || def.Perm&protocol.PermInherit == 0 {
		return TopicConfig{}, errorResponse(req, protocol.TopicNotExist, fmt.Errorf("topic %q does not exist and default topic %q cannot create it", h.Topic, h.DefaultTopic))
	}
	n := int(h.DefaultTopicQueueNums)
	if n <= 0 {
		n = b.cfg.DefaultTopicQueues
	}
	n = min(n, def.WriteQueueNums)
	tc, err := b.topicForWrite(h.Topic, n)
	if err != nil {
		return tc, errorResponse(req, protocol.SystemError, err)
	}
	return tc, nil
}

// checkTransactionType refuses a message sent with the rolled-back transaction type: only
// END_TRANSACTION resolves a half message, and a rolled-back message must never be stored
// where a consumer could read it.
func checkTransactionType(topic string, sysFlag int32) error {
	if sysFlag&protocol.MsgTransactionMask == protocol.MsgTransactionRollback {
		return fmt.Errorf("a rolled-back transactional message cannot be sent (topic %q, sysFlag %#x): send a half message and roll it back with END_TRANSACTION", topic, sysFlag)
	}
	return nil
}
