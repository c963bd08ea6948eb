package protocol

// Transactional messages (RocketMQ 4.9's two-phase send). A producer sends a half message
// (sysFlag MsgTransactionPrepared, property TRAN_MSG=true, PGROUP=its group); the broker keeps
// it in TransactionHalfTopic, out of consumers' sight, until END_TRANSACTION commits or rolls
// it back. A half message left without an outcome is checked back with
// CHECK_TRANSACTION_STATE, which the broker sends to a producer of the group.

// Request codes of transactions.
const (
	// EndTransaction (37) commits or rolls back a half message; clients usually send it oneway.
	EndTransaction RequestCode = 37
	// CheckTransactionState (39) is a oneway request from broker to producer asking for the
	// outcome of a half message; the producer answers with EndTransaction.
	CheckTransactionState RequestCode = 39
)

// Properties of transactional messages.
const (
	// PropertyProducerGroup (PGROUP) names the producer group of a half message: the broker
	// checks the transaction back with a member of it.
	PropertyProducerGroup = "PGROUP"
	// PropertyTransactionID is the client-side transaction id some clients set.
	PropertyTransactionID = "__transactionId__"
	// PropertyTransactionCheckTimes counts the check-backs of a half message.
	PropertyTransactionCheckTimes = "TRANSACTION_CHECK_TIMES"
	// PropertyCheckImmunityTime (seconds) delays a half message's first check-back beyond the
	// broker's transaction timeout.
	PropertyCheckImmunityTime = "CHECK_IMMUNITY_TIME_IN_SECONDS"
)

// System topics of transactions (RocketMQ's names).
const (
	// TransactionHalfTopic holds half messages, in queue 0, with their real topic and queue in
	// REAL_TOPIC and REAL_QID.
	TransactionHalfTopic = "RMQ_SYS_TRANS_HALF_TOPIC"
	// TransactionOpTopic holds one op message per resolved half message: tag
	// TransactionOpTag, body the half message's queue offset in decimal.
	TransactionOpTopic = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
	// TransactionOpTag is the tag of op messages ("d", for delete).
	TransactionOpTag = "d"
)

// EndTransactionRequestHeader is END_TRANSACTION (37).
type EndTransactionRequestHeader struct {
	ProducerGroup string
	// TranStateTableOffset is the half message's offset in TransactionHalfTopic's queue:
	// the queueOffset of the half send's answer.
	TranStateTableOffset int64
	// CommitLogOffset is the half message's commit-log offset (from its offsetMsgId).
	CommitLogOffset int64
	// CommitOrRollback is MsgTransactionCommit, MsgTransactionRollback, or
	// MsgTransactionNone (the producer does not know yet).
	CommitOrRollback int32
	// FromTransactionCheck is true when the producer answers a check-back.
	FromTransactionCheck bool
	MsgID                string // optional: the message's unique id
	TransactionID        string // optional
	BrokerName           string // optional ("bname")
}

func (h *EndTransactionRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 8)
	h.EncodeTo(m)
	return m
}

func (h *EndTransactionRequestHeader) EncodeTo(ext map[string]string) {
	ext["producerGroup"] = h.ProducerGroup
	putInt(ext, "tranStateTableOffset", h.TranStateTableOffset)
	putInt(ext, "commitLogOffset", h.CommitLogOffset)
	putInt(ext, "commitOrRollback", int64(h.CommitOrRollback))
	putBool(ext, "fromTransactionCheck", h.FromTransactionCheck)
	putStr(ext, "msgId", h.MsgID)
	putStr(ext, "transactionId", h.TransactionID)
	putStr(ext, "bname", h.BrokerName)
}

func (h *EndTransactionRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.ProducerGroup = r.str("producerGroup", true)
	h.TranStateTableOffset = r.i64("tranStateTableOffset", true)
	h.CommitLogOffset = r.i64("commitLogOffset", true)
	h.CommitOrRollback = r.i32("commitOrRollback", true)
	h.FromTransactionCheck = r.bool("fromTransactionCheck", false)
	h.MsgID = r.str("msgId", false)
	h.TransactionID = r.str("transactionId", false)
	h.BrokerName = r.str("bname", false)
	return r.err
}

// CheckTransactionStateRequestHeader is CHECK_TRANSACTION_STATE (39); the body is the half
// message in the stored format, with its real topic and queue.
type CheckTransactionStateRequestHeader struct {
	TranStateTableOffset int64
	CommitLogOffset      int64
	MsgID                string // the message's unique id
	TransactionID        string // optional
	OffsetMsgID          string // the half message's offsetMsgId
}

func (h *CheckTransactionStateRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 5)
	h.EncodeTo(m)
	return m
}

func (h *CheckTransactionStateRequestHeader) EncodeTo(ext map[string]string) {
	putInt(ext, "tranStateTableOffset", h.TranStateTableOffset)
	putInt(ext, "commitLogOffset", h.CommitLogOffset)
	putStr(ext, "msgId", h.MsgID)
	putStr(ext, "transactionId", h.TransactionID)
	putStr(ext, "offsetMsgId", h.OffsetMsgID)
}

func (h *CheckTransactionStateRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.TranStateTableOffset = r.i64("tranStateTableOffset", true)
	h.CommitLogOffset = r.i64("commitLogOffset", true)
	h.MsgID = r.str("msgId", false)
	h.TransactionID = r.str("transactionId", false)
	h.OffsetMsgID = r.str("offsetMsgId", false)
	return r.err
}
