package protocol

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

// headerCase is one typed header: a fully populated value, the code it travels with, and the
// ext field names it must require.
type headerCase struct {
	name     string
	code     RequestCode // the request code, or the request a response answers
	response bool
	full     Header // every field set, including optional ones
	newZero  func() Header
	required []string
	// wire is the exact ExtFields full encodes to; checked against the field names used
	// by rocketmq-client-go (internal/request.go) and the Java broker's headers.
	wire map[string]string
}

func headerCases() []headerCase {
	return []headerCase{
		{
			name: "GetRouteInfoRequest", code: GetRouteInfoByTopic,
			full:     &GetRouteInfoRequestHeader{Topic: "TopicTest", AcceptStandardJSONOnly: true},
			newZero:  func() Header { return new(GetRouteInfoRequestHeader) },
			required: []string{"topic"},
			wire:     map[string]string{"topic": "TopicTest", "acceptStandardJsonOnly": "true"},
		},
		{
			name: "SendMessageRequest", code: SendMessage,
			full: &SendMessageRequestHeader{
				ProducerGroup: "pg", Topic: "TopicTest", DefaultTopic: AutoCreateTopicKey, DefaultTopicQueueNums: 4,
				QueueID: 2, SysFlag: MsgFlagCompressed, BornTimestamp: 1712345678901, Flag: -7,
				Properties: "TAGS\x01a\x02", ReconsumeTimes: 3, UnitMode: true, MaxReconsumeTimes: 16, Batch: true, BrokerName: "broker-a",
			},
			newZero:  func() Header { return new(SendMessageRequestHeader) },
			required: []string{"producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId", "sysFlag", "bornTimestamp", "flag"},
			wire: map[string]string{
				"producerGroup": "pg", "topic": "TopicTest", "defaultTopic": "TBW102", "defaultTopicQueueNums": "4",
				"queueId": "2", "sysFlag": "1", "bornTimestamp": "1712345678901", "flag": "-7", "properties": "TAGS\x01a\x02",
				"reconsumeTimes": "3", "unitMode": "true", "maxReconsumeTimes": "16", "batch": "true", "bname": "broker-a",
			},
		},
		{
			name: "SendMessageResponse", code: SendMessage, response: true,
			full:     &SendMessageResponseHeader{MsgID: "0A00000100002A9F0000000000000400", QueueID: 1, QueueOffset: 99, TransactionID: "tx", MsgRegion: "DefaultRegion", TraceOn: true},
			newZero:  func() Header { return new(SendMessageResponseHeader) },
			required: []string{"msgId", "queueId", "queueOffset"},
			wire:     map[string]string{"msgId": "0A00000100002A9F0000000000000400", "queueId": "1", "queueOffset": "99", "transactionId": "tx", "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"},
		},
		{
			name: "PullMessageRequest", code: PullMessage,
			full: &PullMessageRequestHeader{
				ConsumerGroup: "cg", Topic: "TopicTest", QueueID: 3, QueueOffset: 1 << 40, MaxMsgNums: 32,
				SysFlag: PullFlagSuspend | PullFlagSubscription, CommitOffset: -1, SuspendTimeoutMillis: 20000,
				Subscription: "a || b", SubVersion: 1712345678901234567, ExpressionType: ExpressionTag, MaxMsgBytes: 1 << 20, BrokerName: "broker-a",
			},
			newZero:  func() Header { return new(PullMessageRequestHeader) },
			required: []string{"consumerGroup", "topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis", "subVersion"},
			wire: map[string]string{
				"consumerGroup": "cg", "topic": "TopicTest", "queueId": "3", "queueOffset": "1099511627776", "maxMsgNums": "32",
				"sysFlag": "6", "commitOffset": "-1", "suspendTimeoutMillis": "20000", "subscription": "a || b",
				"subVersion": "1712345678901234567", "expressionType": "TAG", "maxMsgBytes": "1048576", "bname": "broker-a",
			},
		},
		{
			name: "PullMessageResponse", code: PullMessage, response: true,
			full:     &PullMessageResponseHeader{SuggestWhichBrokerID: 1, NextBeginOffset: 1032, MinOffset: 7, MaxOffset: 5000},
			newZero:  func() Header { return new(PullMessageResponseHeader) },
			required: []string{"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"},
			wire:     map[string]string{"suggestWhichBrokerId": "1", "nextBeginOffset": "1032", "minOffset": "7", "maxOffset": "5000"},
		},
		{
			name: "QueryConsumerOffsetRequest", code: QueryConsumerOffset,
			full:     &QueryConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: "t", QueueID: 1, SetZeroIfNotFound: ptr(false), BrokerName: "b"},
			newZero:  func() Header { return new(QueryConsumerOffsetRequestHeader) },
			required: []string{"consumerGroup", "topic", "queueId"},
			wire:     map[string]string{"consumerGroup": "cg", "topic": "t", "queueId": "1", "setZeroIfNotFound": "false", "bname": "b"},
		},
		{
			name: "OffsetResponse", code: QueryConsumerOffset, response: true,
			full:     &QueryConsumerOffsetResponseHeader{Offset: -1},
			newZero:  func() Header { return new(OffsetResponseHeader) },
			required: []string{"offset"},
			wire:     map[string]string{"offset": "-1"},
		},
		{
			name: "UpdateConsumerOffsetRequest", code: UpdateConsumerOffset,
			full:     &UpdateConsumerOffsetRequestHeader{ConsumerGroup: "cg", Topic: "t", QueueID: 0, CommitOffset: 42, BrokerName: "b"},
			newZero:  func() Header { return new(UpdateConsumerOffsetRequestHeader) },
			required: []string{"consumerGroup", "topic", "queueId", "commitOffset"},
			wire:     map[string]string{"consumerGroup": "cg", "topic": "t", "queueId": "0", "commitOffset": "42", "bname": "b"},
		},
		{
			name: "GetMaxOffsetRequest", code: GetMaxOffset,
			full:     &GetMaxOffsetRequestHeader{Topic: "t", QueueID: 7, BrokerName: "b"},
			newZero:  func() Header { return new(GetMaxOffsetRequestHeader) },
			required: []string{"topic", "queueId"},
			wire:     map[string]string{"topic": "t", "queueId": "7", "bname": "b"},
		},
		{
			name: "GetMinOffsetRequest", code: GetMinOffset,
			full:     &GetMinOffsetRequestHeader{Topic: "t", QueueID: 7},
			newZero:  func() Header { return new(GetMinOffsetRequestHeader) },
			required: []string{"topic", "queueId"},
			wire:     map[string]string{"topic": "t", "queueId": "7"},
		},
		{
			name: "SearchOffsetRequest", code: SearchOffsetByTimestamp,
			full:     &SearchOffsetRequestHeader{Topic: "t", QueueID: 2, Timestamp: 1712345678901, BoundaryType: "UPPER", BrokerName: "b"},
			newZero:  func() Header { return new(SearchOffsetRequestHeader) },
			required: []string{"topic", "queueId", "timestamp"},
			wire:     map[string]string{"topic": "t", "queueId": "2", "timestamp": "1712345678901", "boundaryType": "UPPER", "bname": "b"},
		},
		{
			name: "UnregisterClientRequest", code: UnregisterClient,
			full:     &UnregisterClientRequestHeader{ClientID: "10.0.0.7@1234", ProducerGroup: "pg", ConsumerGroup: "cg"},
			newZero:  func() Header { return new(UnregisterClientRequestHeader) },
			required: []string{"clientID"},
			wire:     map[string]string{"clientID": "10.0.0.7@1234", "producerGroup": "pg", "consumerGroup": "cg"},
		},
		{
			name: "ConsumerSendMsgBackRequest", code: ConsumerSendMsgBack,
			full:     &ConsumerSendMsgBackRequestHeader{Offset: 4096, Group: "cg", DelayLevel: 3, OriginMsgID: "m", OriginTopic: "t", UnitMode: true, MaxReconsumeTimes: 16, BrokerName: "b"},
			newZero:  func() Header { return new(ConsumerSendMsgBackRequestHeader) },
			required: []string{"offset", "group", "delayLevel"},
			wire:     map[string]string{"offset": "4096", "group": "cg", "delayLevel": "3", "originMsgId": "m", "originTopic": "t", "unitMode": "true", "maxReconsumeTimes": "16", "bname": "b"},
		},
		{
			name: "GetConsumerListByGroupRequest", code: GetConsumerListByGroup,
			full:     &GetConsumerListByGroupRequestHeader{ConsumerGroup: "cg"},
			newZero:  func() Header { return new(GetConsumerListByGroupRequestHeader) },
			required: []string{"consumerGroup"},
			wire:     map[string]string{"consumerGroup": "cg"},
		},
		{
			name: "NotifyConsumerIDsChangedRequest", code: NotifyConsumerIDsChanged,
			full:     &NotifyConsumerIDsChangedRequestHeader{ConsumerGroup: "cg"},
			newZero:  func() Header { return new(NotifyConsumerIDsChangedRequestHeader) },
			required: []string{"consumerGroup"},
			wire:     map[string]string{"consumerGroup": "cg"},
		},
		{
			name: "CreateTopicRequest", code: UpdateAndCreateTopic,
			full:     &CreateTopicRequestHeader{Topic: "t", ReadQueueNums: 8, WriteQueueNums: 8, Perm: PermRead | PermWrite, DefaultTopic: "TBW102", TopicFilterType: "MULTI_TAG", TopicSysFlag: 1, Order: true},
			newZero:  func() Header { return new(CreateTopicRequestHeader) },
			required: []string{"topic", "readQueueNums", "writeQueueNums", "perm"},
			wire:     map[string]string{"topic": "t", "readQueueNums": "8", "writeQueueNums": "8", "perm": "6", "defaultTopic": "TBW102", "topicFilterType": "MULTI_TAG", "topicSysFlag": "1", "order": "true"},
		},
		{
			name: "ViewMessageRequest", code: ViewMessageByID,
			full:     &ViewMessageRequestHeader{Offset: 123456, Topic: "t"},
			newZero:  func() Header { return new(ViewMessageRequestHeader) },
			required: []string{"offset"},
			wire:     map[string]string{"offset": "123456", "topic": "t"},
		},
		{
			name: "DeleteTopicRequest", code: DeleteTopicInNamesrv,
			full:     &DeleteTopicRequestHeader{Topic: "t", ClusterName: "DefaultCluster"},
			newZero:  func() Header { return new(DeleteTopicRequestHeader) },
			required: []string{"topic"},
			wire:     map[string]string{"topic": "t", "clusterName": "DefaultCluster"},
		},
		{
			name: "ResetOffsetRequest", code: ResetConsumerOffset,
			full:     &ResetOffsetRequestHeader{Topic: "t", Group: "cg", Timestamp: 1712345678901, IsForce: true},
			newZero:  func() Header { return new(ResetOffsetRequestHeader) },
			required: []string{"topic", "group", "timestamp", "isForce"},
			wire:     map[string]string{"topic": "t", "group": "cg", "timestamp": "1712345678901", "isForce": "true"},
		},
		{
			name: "GetConsumerRunningInfoRequest", code: GetConsumerRunningInfo,
			full:     &GetConsumerRunningInfoRequestHeader{ConsumerGroup: "cg", ClientID: "10.0.0.7@1234", JstackEnable: true},
			newZero:  func() Header { return new(GetConsumerRunningInfoRequestHeader) },
			required: []string{"consumerGroup", "clientId"},
			wire:     map[string]string{"consumerGroup": "cg", "clientId": "10.0.0.7@1234", "jstackEnable": "true"},
		},
	}
}

// TestHeaderRoundTrip encodes every header, checks the exact wire fields, sends it through a
// whole frame in both serializations, and decodes it back.
func TestHeaderRoundTrip(t *testing.T) {
	for _, tc := range headerCases() {
		for _, st := range []SerializeType{JSON, RocketMQ} {
			t.Run(tc.name+"/"+st.String(), func(t *testing.T) {
				ext := map[string]string{}
				tc.full.EncodeTo(ext)
				require.Equal(t, tc.wire, ext)
				require.Equal(t, tc.wire, tc.full.Encode(), "Encode and EncodeTo agree")

				cmd := NewRequestWith(tc.code, tc.full, []byte("body"))
				cmd.Opaque = 77
				cmd.Serialize = st
				if tc.response {
					resp := NewResponse(cmd, Success, "OK")
					tc.full.EncodeTo(resp.ExtFields)
					cmd = resp
				}
				frame, err := cmd.AppendFrame(nil)
				require.NoError(t, err)
				got, err := DecodeFrame(frame[4:])
				require.NoError(t, err)
				require.Equal(t, cmd, got)

				h := tc.newZero()
				require.NoError(t, got.DecodeHeader(h))
				require.Equal(t, tc.full, h)
			})
		}
	}
}

// TestHeaderRequiredFields removes each required field in turn and each optional one.
func TestHeaderRequiredFields(t *testing.T) {
	for _, tc := range headerCases() {
		t.Run(tc.name, func(t *testing.T) {
			required := map[string]bool{}
			for _, name := range tc.required {
				required[name] = true
			}
			for name := range tc.wire {
				ext := tc.full.Encode()
				delete(ext, name)
				err := tc.newZero().Decode(ext)
				if !required[name] {
					require.NoError(t, err, "optional field %q", name)
					continue
				}
				require.ErrorIs(t, err, ErrMissingField, name)
				require.EqualError(t, err, fmt.Sprintf("header field %q: missing", name))
				var fe *FieldError
				require.True(t, errors.As(err, &fe))
				require.Equal(t, name, fe.Field)
			}
			for _, name := range tc.required {
				_, ok := tc.wire[name]
				require.True(t, ok, "required field %q is encoded", name)
			}
		})
	}
}

// TestHeaderMalformedFields feeds bad numbers and booleans to every numeric and boolean field.
func TestHeaderMalformedFields(t *testing.T) {
	for _, tc := range headerCases() {
		t.Run(tc.name, func(t *testing.T) {
			for name, v := range tc.wire {
				var bad []string
				switch {
				case v == "true" || v == "false":
					bad = []string{"yes", "1", "", "tru"}
				case isDecimal(v):
					bad = []string{"", "1.5", "0x10", " 1", "1e3", "99999999999999999999", "abc"}
				default:
					continue
				}
				for _, b := range bad {
					ext := tc.full.Encode()
					ext[name] = b
					err := tc.newZero().Decode(ext)
					require.ErrorIs(t, err, ErrBadField, "%s=%q", name, b)
					require.Contains(t, err.Error(), fmt.Sprintf("header field %q", name))
				}
			}
		})
	}
}

func isDecimal(s string) bool {
	if s == "" {
		return false
	}
	if s[0] == '-' {
		s = s[1:]
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

func TestHeaderNumberRanges(t *testing.T) {
	tests := []struct {
		value string
		ok    bool
		want  int32
	}{
		{"2147483647", true, 2147483647},
		{"-2147483648", true, -2147483648},
		{"+5", true, 5}, // Java's Integer.parseInt accepts a plus sign too
		{"2147483648", false, 0},
		{"-2147483649", false, 0},
		{"007", true, 7},
		{"", false, 0},
		{"٣", false, 0}, // Arabic-Indic three: Java accepts it, flowd does not
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			var h GetMaxOffsetRequestHeader
			err := h.Decode(map[string]string{"topic": "t", "queueId": tt.value})
			if !tt.ok {
				require.ErrorIs(t, err, ErrBadField)
				require.EqualError(t, err, fmt.Sprintf(`header field "queueId": %q is not a valid int32`, tt.value))
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, h.QueueID)
		})
	}
}

func TestHeaderBooleans(t *testing.T) {
	for _, v := range []string{"true", "TRUE", "True"} {
		var h ResetOffsetRequestHeader
		require.NoError(t, h.Decode(map[string]string{"topic": "t", "group": "g", "timestamp": "1", "isForce": v}))
		require.True(t, h.IsForce, v)
	}
	var h ResetOffsetRequestHeader
	require.NoError(t, h.Decode(map[string]string{"topic": "t", "group": "g", "timestamp": "1", "isForce": "False"}))
	require.False(t, h.IsForce)
}

func TestHeaderOptionalDefaults(t *testing.T) {
	t.Run("SendMessage", func(t *testing.T) {
		h := SendMessageRequestHeader{ProducerGroup: "pg", Topic: "t", DefaultTopic: "TBW102", DefaultTopicQueueNums: 4, MaxReconsumeTimes: -1}
		ext := h.Encode()
		for _, absent := range []string{"properties", "maxReconsumeTimes", "bname"} {
			require.NotContains(t, ext, absent)
		}
		var got SendMessageRequestHeader
		require.NoError(t, got.Decode(ext))
		require.Equal(t, h, got)
		require.Equal(t, int32(-1), got.MaxReconsumeTimes, "absent maxReconsumeTimes")
	})
	t.Run("QueryConsumerOffset", func(t *testing.T) {
		var h QueryConsumerOffsetRequestHeader
		require.NoError(t, h.Decode(map[string]string{"consumerGroup": "g", "topic": "t", "queueId": "0"}))
		require.Nil(t, h.SetZeroIfNotFound, "absent is not false")
		require.NotContains(t, h.Encode(), "setZeroIfNotFound")
		require.NoError(t, h.Decode(map[string]string{"consumerGroup": "g", "topic": "t", "queueId": "0", "setZeroIfNotFound": "true"}))
		require.Equal(t, ptr(true), h.SetZeroIfNotFound)
	})
	t.Run("ConsumerSendMsgBack", func(t *testing.T) {
		var h ConsumerSendMsgBackRequestHeader
		require.NoError(t, h.Decode(map[string]string{"offset": "1", "group": "g", "delayLevel": "0"}))
		require.Equal(t, int32(-1), h.MaxReconsumeTimes)
		require.NotContains(t, h.Encode(), "maxReconsumeTimes")
	})
	t.Run("CreateTopic writes Java's required defaults", func(t *testing.T) {
		h := CreateTopicRequestHeader{Topic: "t", ReadQueueNums: 4, WriteQueueNums: 4, Perm: 6}
		ext := h.Encode()
		require.Equal(t, "TBW102", ext["defaultTopic"])
		require.Equal(t, "SINGLE_TAG", ext["topicFilterType"])
		require.Equal(t, "false", ext["order"])
	})
	t.Run("PullMessage omits maxMsgBytes when 0", func(t *testing.T) {
		h := PullMessageRequestHeader{}
		require.NotContains(t, h.Encode(), "maxMsgBytes")
	})
}

// TestSendHeaderV2 checks the one-letter form against the names rocketmq-client-go's
// SendMessageRequestV2Header writes, and DecodeSendHeader's choice by code.
func TestSendHeaderV2(t *testing.T) {
	h := SendMessageRequestHeader{
		ProducerGroup: "pg", Topic: "TopicTest", DefaultTopic: "TBW102", DefaultTopicQueueNums: 4, QueueID: 1,
		SysFlag: 0, BornTimestamp: 1712345678901, Flag: 0, Properties: "KEYS\x01k\x02", ReconsumeTimes: 0,
		UnitMode: false, MaxReconsumeTimes: 0, Batch: false, BrokerName: "broker-a",
	}
	want := map[string]string{
		"a": "pg", "b": "TopicTest", "c": "TBW102", "d": "4", "e": "1", "f": "0", "g": "1712345678901", "h": "0",
		"i": "KEYS\x01k\x02", "j": "0", "k": "false", "l": "0", "m": "false", "n": "broker-a",
	}
	require.Equal(t, want, h.EncodeV2())

	for _, tt := range []struct {
		code RequestCode
		ext  map[string]string
		want bool // Batch
	}{
		{SendMessage, h.Encode(), false},
		{SendMessageV2, h.EncodeV2(), false},
		{SendBatchMessage, h.EncodeV2(), true},
	} {
		t.Run(tt.code.String(), func(t *testing.T) {
			got, err := DecodeSendHeader(NewRequest(tt.code, tt.ext, nil))
			require.NoError(t, err)
			w := h
			w.Batch = tt.want
			require.Equal(t, &w, got)
		})
	}

	t.Run("V2 field missing", func(t *testing.T) {
		ext := h.EncodeV2()
		delete(ext, "e")
		_, err := DecodeSendHeader(NewRequest(SendMessageV2, ext, nil))
		require.ErrorIs(t, err, ErrMissingField)
		require.EqualError(t, err, `decode SEND_MESSAGE_V2 header: header field "e": missing`)
	})
	t.Run("long names under a V2 code", func(t *testing.T) {
		_, err := DecodeSendHeader(NewRequest(SendMessageV2, h.Encode(), nil))
		require.ErrorIs(t, err, ErrMissingField)
	})
	t.Run("not a send", func(t *testing.T) {
		_, err := DecodeSendHeader(NewRequest(PullMessage, nil, nil))
		require.ErrorContains(t, err, "PULL_MESSAGE is not a send request")
	})
}

func TestDecodeHeaderNamesTheCommand(t *testing.T) {
	cmd := NewRequest(PullMessage, map[string]string{"topic": "t"}, nil)
	err := cmd.DecodeHeader(new(PullMessageRequestHeader))
	require.EqualError(t, err, `decode PULL_MESSAGE header: header field "consumerGroup": missing`)

	resp := NewResponse(cmd, PullNotFound, "")
	err = resp.DecodeHeader(new(PullMessageResponseHeader))
	assert.EqualError(t, err, `decode PULL_NOT_FOUND header: header field "suggestWhichBrokerId": missing`)
}

func TestFieldErrorTruncatesHugeValues(t *testing.T) {
	var h OffsetResponseHeader
	big := make([]byte, 10000)
	for i := range big {
		big[i] = 'x'
	}
	err := h.Decode(map[string]string{"offset": string(big)})
	require.ErrorIs(t, err, ErrBadField)
	require.Less(t, len(err.Error()), 200)
}
