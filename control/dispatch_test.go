package control_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
)

// TestDoAnswersAsTheNATSEndpoint holds the one dispatch table: for the same request, Do's
// code and body are the NATS endpoint's error code and reply, byte for byte.
func TestDoAnswersAsTheNATSEndpoint(t *testing.T) {
	e := start(t, func(c *control.ServiceConfig) { c.Disabled = []string{"topic.delete"} })
	code, body := e.svc.Do(context.Background(), "topic.create", []byte(`{"topic":"orders","queues":2}`))
	require.Equal(t, 200, code, string(body))
	var created control.TopicReply
	require.NoError(t, json.Unmarshal(body, &created))
	assert.Equal(t, "orders", created.Topic.Topic)

	for _, tc := range []struct{ cmd, body string }{
		{"topic.list", ``},
		{"topic.describe", `{"topic":"orders"}`},
		{"topic.describe", `{"topic":"missing"}`},
		{"topic.create", `{"topic":"orders","queues":2}`},
		{"topic.create", `{"topic":"x","queues":"two"}`},
		{"topic.create", `not json`},
		{"group.list", `{}`},
		{"topic.delete", `{"topic":"orders"}`},
	} {
		msg := e.request(tc.cmd, tc.body)
		natsCode := 200
		if h := msg.Header.Get(micro.ErrorCodeHeader); h != "" {
			var err error
			natsCode, err = strconv.Atoi(h)
			require.NoError(t, err)
		}
		code, body := e.svc.Do(context.Background(), tc.cmd, []byte(tc.body))
		assert.Equal(t, natsCode, code, "%s %s", tc.cmd, tc.body)
		assert.Equal(t, string(msg.Data), string(body), "%s %s", tc.cmd, tc.body)
	}
}

func TestDoRefusesUnservedCommands(t *testing.T) {
	e := start(t, nil)
	code, body := e.svc.Do(context.Background(), "topic.explode", nil)
	assert.Equal(t, control.CodeNotFound, code)
	var reply control.ErrorReply
	require.NoError(t, json.Unmarshal(body, &reply))
	assert.Contains(t, reply.Error.Message, "no command topic.explode")
	// Without a registry the plugin commands are not served, over NATS or here.
	code, _ = e.svc.Do(context.Background(), "plugin.list", nil)
	assert.Equal(t, control.CodeNotFound, code)
}
