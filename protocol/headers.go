package protocol

// headers.go and headers_*.go hold one type per request or response header of RocketMQ's
// remoting protocol (headers_send.go, headers_consume.go, headers_admin.go). Field names on the wire
// are RocketMQ's (checked against the Java broker's header classes and rocketmq-client-go's
// internal/request.go). Required fields are those the Java broker marks @CFNotNull; a decoder
// reports them missing with ErrMissingField. Optional fields take the default documented on the
// struct field when absent.
//
// Several RocketMQ 5 headers carry "bname" (the broker name, used by proxies). The Go client
// sends it on most requests; it is kept here as BrokerName and is always optional.

var (
	_ Header = (*GetRouteInfoRequestHeader)(nil)
	_ Header = (*SendMessageRequestHeader)(nil)
	_ Header = (*SendMessageResponseHeader)(nil)
	_ Header = (*PullMessageRequestHeader)(nil)
	_ Header = (*PullMessageResponseHeader)(nil)
	_ Header = (*QueryConsumerOffsetRequestHeader)(nil)
	_ Header = (*OffsetResponseHeader)(nil)
	_ Header = (*UpdateConsumerOffsetRequestHeader)(nil)
	_ Header = (*GetMaxOffsetRequestHeader)(nil)
	_ Header = (*GetMinOffsetRequestHeader)(nil)
	_ Header = (*SearchOffsetRequestHeader)(nil)
	_ Header = (*UnregisterClientRequestHeader)(nil)
	_ Header = (*ConsumerSendMsgBackRequestHeader)(nil)
	_ Header = (*GetConsumerListByGroupRequestHeader)(nil)
	_ Header = (*NotifyConsumerIDsChangedRequestHeader)(nil)
	_ Header = (*CreateTopicRequestHeader)(nil)
	_ Header = (*ViewMessageRequestHeader)(nil)
	_ Header = (*DeleteTopicRequestHeader)(nil)
	_ Header = (*ResetOffsetRequestHeader)(nil)
	_ Header = (*GetConsumerRunningInfoRequestHeader)(nil)
)

// Header field names shared by several headers.
const (
	fieldTopic         = "topic"
	fieldQueueID       = "queueId"
	fieldConsumerGroup = "consumerGroup"
	fieldBrokerName    = "bname"
	fieldOffset        = "offset"
)

// GetRouteInfoRequestHeader is GET_ROUTEINFO_BY_TOPIC (105).
type GetRouteInfoRequestHeader struct {
	Topic string
	// AcceptStandardJSONOnly asks a RocketMQ 5 name server for standard JSON instead of
	// fastjson's unquoted integer keys. flowd always answers standard JSON.
	AcceptStandardJSONOnly bool
}

func (h *GetRouteInfoRequestHeader) Encode() map[string]string {
	m := make(map[string]string, 2)
	h.EncodeTo(m)
	return m
}

func (h *GetRouteInfoRequestHeader) EncodeTo(ext map[string]string) {
	ext[fieldTopic] = h.Topic
	if h.AcceptStandardJSONOnly {
		putBool(ext, "acceptStandardJsonOnly", true)
	}
}

func (h *GetRouteInfoRequestHeader) Decode(ext map[string]string) error {
	r := fieldReader{ext: ext}
	h.Topic = r.str(fieldTopic, true)
	h.AcceptStandardJSONOnly = r.bool("acceptStandardJsonOnly", false)
	return r.err
}
