package protocol

import "strconv"

// RequestCode identifies what a request asks for. The numbers are RocketMQ's.
type RequestCode int32

// Request codes flowd serves or sends (RocketMQ's numbers).
const (
	SendMessage              RequestCode = 10
	PullMessage              RequestCode = 11
	QueryConsumerOffset      RequestCode = 14
	UpdateConsumerOffset     RequestCode = 15
	UpdateAndCreateTopic     RequestCode = 17
	SearchOffsetByTimestamp  RequestCode = 29
	GetMaxOffset             RequestCode = 30
	GetMinOffset             RequestCode = 31
	ViewMessageByID          RequestCode = 33
	HeartBeat                RequestCode = 34
	UnregisterClient         RequestCode = 35
	ConsumerSendMsgBack      RequestCode = 36
	GetConsumerListByGroup   RequestCode = 38
	NotifyConsumerIDsChanged RequestCode = 40
	LockBatchMQ              RequestCode = 41
	UnlockBatchMQ            RequestCode = 42
	GetRouteInfoByTopic      RequestCode = 105
	DeleteTopicInBroker      RequestCode = 215
	DeleteTopicInNamesrv     RequestCode = 216
	ResetConsumerOffset      RequestCode = 220
	GetConsumerRunningInfo   RequestCode = 307
	SendMessageV2            RequestCode = 310
	SendBatchMessage         RequestCode = 320
)

// RocketMQ 5's pop consumption codes (4.9.3 has the first three). They do not fit the
// binary header's 16-bit code field: a command with one goes out with a JSON header (see
// Command.AppendFrame), as RocketMQ's clients send them with their default serialization.
const (
	PopMessage                 RequestCode = 200050
	AckMessage                 RequestCode = 200051
	ChangeMessageInvisibleTime RequestCode = 200053
	BatchAckMessage            RequestCode = 200151
)

var requestCodeNames = map[RequestCode]string{
	SendMessage:              "SEND_MESSAGE",
	PullMessage:              "PULL_MESSAGE",
	QueryMessage:             "QUERY_MESSAGE",
	QueryConsumerOffset:      "QUERY_CONSUMER_OFFSET",
	UpdateConsumerOffset:     "UPDATE_CONSUMER_OFFSET",
	UpdateAndCreateTopic:     "UPDATE_AND_CREATE_TOPIC",
	SearchOffsetByTimestamp:  "SEARCH_OFFSET_BY_TIMESTAMP",
	GetMaxOffset:             "GET_MAX_OFFSET",
	GetMinOffset:             "GET_MIN_OFFSET",
	ViewMessageByID:          "VIEW_MESSAGE_BY_ID",
	HeartBeat:                "HEART_BEAT",
	UnregisterClient:         "UNREGISTER_CLIENT",
	ConsumerSendMsgBack:      "CONSUMER_SEND_MSG_BACK",
	EndTransaction:           "END_TRANSACTION",
	GetConsumerListByGroup:   "GET_CONSUMER_LIST_BY_GROUP",
	CheckTransactionState:    "CHECK_TRANSACTION_STATE",
	NotifyConsumerIDsChanged: "NOTIFY_CONSUMER_IDS_CHANGED",
	LockBatchMQ:              "LOCK_BATCH_MQ",
	UnlockBatchMQ:            "UNLOCK_BATCH_MQ",
	GetRouteInfoByTopic:      "GET_ROUTEINFO_BY_TOPIC",
	DeleteTopicInBroker:      "DELETE_TOPIC_IN_BROKER",
	DeleteTopicInNamesrv:     "DELETE_TOPIC_IN_NAMESRV",
	ResetConsumerOffset:      "RESET_CONSUMER_OFFSET",
	GetConsumerRunningInfo:   "GET_CONSUMER_RUNNING_INFO",
	SendMessageV2:            "SEND_MESSAGE_V2",
	SendBatchMessage:         "SEND_BATCH_MESSAGE",
	GetLockOwners:            "FLOWD_GET_LOCK_OWNERS",

	GetAllTopicConfig:                "GET_ALL_TOPIC_CONFIG",
	GetBrokerRuntimeInfo:             "GET_BROKER_RUNTIME_INFO",
	GetBrokerClusterInfo:             "GET_BROKER_CLUSTER_INFO",
	UpdateAndCreateSubscriptionGroup: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
	GetAllSubscriptionGroupConfig:    "GET_ALL_SUBSCRIPTIONGROUP_CONFIG",
	GetTopicStatsInfo:                "GET_TOPIC_STATS_INFO",
	GetConsumerConnectionList:        "GET_CONSUMER_CONNECTION_LIST",
	GetAllTopicListFromNamesrv:       "GET_ALL_TOPIC_LIST_FROM_NAMESERVER",
	DeleteSubscriptionGroup:          "DELETE_SUBSCRIPTIONGROUP",
	GetConsumeStats:                  "GET_CONSUME_STATS",
	InvokeBrokerToResetOffset:        "INVOKE_BROKER_TO_RESET_OFFSET",
	GetTopicsByCluster:               "GET_TOPICS_BY_CLUSTER",
	SendReplyMessage:                 "SEND_REPLY_MESSAGE",
	SendReplyMessageV2:               "SEND_REPLY_MESSAGE_V2",
	PushReplyMessageToClient:         "PUSH_REPLY_MESSAGE_TO_CLIENT",

	PopMessage:                 "POP_MESSAGE",
	AckMessage:                 "ACK_MESSAGE",
	ChangeMessageInvisibleTime: "CHANGE_MESSAGE_INVISIBLETIME",
	BatchAckMessage:            "BATCH_ACK_MESSAGE",
}

func (c RequestCode) String() string {
	if n, ok := requestCodeNames[c]; ok {
		return n
	}
	return "REQUEST_CODE_" + strconv.Itoa(int(c))
}

// ResponseCode is the outcome carried in a response's code field.
type ResponseCode int32

// Response codes (RocketMQ's numbers).
//
// FlushDiskTimeout, SlaveNotAvailable and FlushSlaveTimeout answer a send whose message is
// stored but not yet flushed or replicated as the broker is configured to: like Success they
// carry msgId, queueId and queueOffset, and a client must not send the message again.
const (
	Success                   ResponseCode = 0
	SystemError               ResponseCode = 1
	SystemBusy                ResponseCode = 2
	RequestCodeNotSupported   ResponseCode = 3
	FlushDiskTimeout          ResponseCode = 10
	SlaveNotAvailable         ResponseCode = 11
	FlushSlaveTimeout         ResponseCode = 12
	MessageIllegal            ResponseCode = 13
	ServiceNotAvailable       ResponseCode = 14
	NoPermission              ResponseCode = 16
	TopicNotExist             ResponseCode = 17
	PullNotFound              ResponseCode = 19
	PullRetryImmediately      ResponseCode = 20
	PullOffsetMoved           ResponseCode = 21
	QueryNotFound             ResponseCode = 22
	SubscriptionParseFailed   ResponseCode = 23
	SubscriptionNotExist      ResponseCode = 24
	SubscriptionGroupNotExist ResponseCode = 26
	InvalidParameter          ResponseCode = 29
	FlowControl               ResponseCode = 215
	// NoMessage answers an acknowledgement or change of invisibility whose message is not
	// in flight under that receipt (acknowledged, redelivered, or past its invisibility).
	NoMessage ResponseCode = 208
	// PollingFull and PollingTimeout answer a pop that found nothing: too many pops parked,
	// or none arrived within its poll time.
	PollingFull    ResponseCode = 209
	PollingTimeout ResponseCode = 210
)

var responseCodeNames = map[ResponseCode]string{
	Success:                   "SUCCESS",
	SystemError:               "SYSTEM_ERROR",
	SystemBusy:                "SYSTEM_BUSY",
	RequestCodeNotSupported:   "REQUEST_CODE_NOT_SUPPORTED",
	FlushDiskTimeout:          "FLUSH_DISK_TIMEOUT",
	SlaveNotAvailable:         "SLAVE_NOT_AVAILABLE",
	FlushSlaveTimeout:         "FLUSH_SLAVE_TIMEOUT",
	MessageIllegal:            "MESSAGE_ILLEGAL",
	ServiceNotAvailable:       "SERVICE_NOT_AVAILABLE",
	NoPermission:              "NO_PERMISSION",
	TopicNotExist:             "TOPIC_NOT_EXIST",
	PullNotFound:              "PULL_NOT_FOUND",
	PullRetryImmediately:      "PULL_RETRY_IMMEDIATELY",
	PullOffsetMoved:           "PULL_OFFSET_MOVED",
	QueryNotFound:             "QUERY_NOT_FOUND",
	SubscriptionParseFailed:   "SUBSCRIPTION_PARSE_FAILED",
	SubscriptionNotExist:      "SUBSCRIPTION_NOT_EXIST",
	SubscriptionGroupNotExist: "SUBSCRIPTION_GROUP_NOT_EXIST",
	ConsumerNotOnline:         "CONSUMER_NOT_ONLINE",
	InvalidParameter:          "INVALID_PARAMETER",
	FlowControl:               "FLOW_CONTROL",
	NoMessage:                 "NO_MESSAGE",
	PollingFull:               "POLLING_FULL",
	PollingTimeout:            "POLLING_TIMEOUT",
}

func (c ResponseCode) String() string {
	if n, ok := responseCodeNames[c]; ok {
		return n
	}
	return "RESPONSE_CODE_" + strconv.Itoa(int(c))
}

// LanguageCode says which client implementation sent a command. It travels as a name in JSON
// headers and as a byte in binary ones.
type LanguageCode int8

// Language codes (RocketMQ's numbers).
const (
	LangJava LanguageCode = iota
	LangCPP
	LangDotNet
	LangPython
	LangDelphi
	LangErlang
	LangRuby
	LangOther
	LangHTTP
	LangGo
	LangPHP
	LangOMS
	LangRust
	LangNodeJS
)

var languageNames = [...]string{"JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS", "RUST", "NODE_JS"}

func (l LanguageCode) String() string {
	if l >= 0 && int(l) < len(languageNames) {
		return languageNames[l]
	}
	return "OTHER"
}

// ParseLanguage maps a language name to its code. Unknown names are LangOther: a peer's
// language is informational and never a reason to refuse it.
func ParseLanguage(name string) LanguageCode {
	for i, n := range languageNames {
		if n == name {
			return LanguageCode(i)
		}
	}
	return LangOther
}

// SerializeType is how a frame's header is encoded: the top byte of the header mark.
type SerializeType uint8

const (
	// JSON headers: what the Go client sends by default.
	JSON SerializeType = 0
	// RocketMQ is the compact binary header form.
	RocketMQ SerializeType = 1
)

func (s SerializeType) String() string {
	switch s {
	case JSON:
		return "JSON"
	case RocketMQ:
		return "ROCKETMQ"
	}
	return "SERIALIZE_TYPE_" + strconv.Itoa(int(s))
}

// Command flag bits.
const (
	FlagResponse = 1 << 0
	FlagOneway   = 1 << 1
)

// Pull request sysFlag bits.
const (
	PullFlagCommitOffset = 0x1
	PullFlagSuspend      = 0x2
	PullFlagSubscription = 0x4
	PullFlagClassFilter  = 0x8
	PullFlagLitePull     = 0x10
)

// Message sysFlag bits.
const (
	MsgFlagCompressed  = 0x1
	MsgFlagMultiTags   = 0x2
	MsgFlagBornHostV6  = 0x10
	MsgFlagStoreHostV6 = 0x20
)

// The transaction type of a message: sysFlag & MsgTransactionMask (RocketMQ's
// TRANSACTION_*_TYPE). A prepared (half) message must not be delivered until its producer
// commits it; a rolled-back one never. A RocketMQ broker keeps both out of consume queues.
const (
	MsgTransactionMask     = 0xC
	MsgTransactionNone     = 0x0
	MsgTransactionPrepared = 0x4 // 1 << 2
	MsgTransactionCommit   = 0x8 // 2 << 2
	MsgTransactionRollback = 0xC // 3 << 2
)

// Topic permission bits.
const (
	PermInherit = 1
	PermWrite   = 2
	PermRead    = 4
)

// AutoCreateTopicKey is the topic whose route a producer asks for when its own topic has none;
// a broker that auto-creates topics serves it and creates the real topic on the first send.
const AutoCreateTopicKey = "TBW102"

// ReaderGroup is the consumer group of stateless reads (flowd's consumer.NewReader, and
// "flowd consume" without --group): a flowd broker serves pulls under it without creating
// a subscription group or a retry topic, and refuses heartbeats, commits and send-backs
// naming it, so that such a read leaves nothing behind. The percent signs keep it apart
// from user groups, as RocketMQ's %RETRY% and %DLQ% prefixes do.
const ReaderGroup = "%READER%"
