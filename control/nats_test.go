package control

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/broker"
)

// The embedded server listens where asked, so a separate client (the nats CLI) can connect,
// and JetStream keeps its data under StoreDir.
func TestEmbeddedServerListensAndRunsJetStream(t *testing.T) {
	addr := freeAddr(t)
	dir := t.TempDir()
	n := openEmbedded(t, func(c *NATSConfig) { c.Listen = addr; c.StoreDir = dir })
	require.True(t, n.Embedded())
	assert.Equal(t, "nats://"+addr, n.ListenURL())

	nc, err := nats.Connect(n.ListenURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acct, err := js.AccountInfo(ctx)
	require.NoError(t, err)
	assert.Zero(t, acct.Streams)

	off := openEmbedded(t, func(c *NATSConfig) { c.Listen = "off" })
	assert.Empty(t, off.ListenURL())
	assert.True(t, off.Conn().IsConnected(), "flowd's own connection is in-process")
}

// A listener on a non-loopback address without authentication is refused before anything
// binds, with a message that says how to configure it.
func TestUnauthenticatedNonLoopbackListenerIsRefused(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:4222", "[::]:4222", ":4222", "192.0.2.10:4222"} {
		_, err := Open(context.Background(), NATSConfig{Listen: listen, StoreDir: t.TempDir(), Logger: discardLogger()})
		require.ErrorIs(t, err, ErrInsecureListener, listen)
		assert.Contains(t, err.Error(), "--nats-token", listen)
	}
	_, err := Open(context.Background(), NATSConfig{Listen: "0.0.0.0:4222", Token: "t", Users: []NATSUser{{Name: "a", Password: "p", Role: RoleAdmin}}, Logger: discardLogger()})
	assert.ErrorIs(t, err, ErrBadConfig, "a token and users together")
	_, err = Open(context.Background(), NATSConfig{Listen: "127.0.0.1:1", Users: []NATSUser{{Name: "a", Password: "p", Role: "root"}}, Logger: discardLogger()})
	assert.ErrorIs(t, err, ErrBadConfig, "an unknown role")
}

// A listener address already taken fails Open with the server's reason (it waited out the
// start timeout and said only "not ready").
func TestEmbeddedServerOnABusyPortFailsWithTheReason(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	_, err = Open(context.Background(), NATSConfig{Listen: ln.Addr().String(), StoreDir: t.TempDir(), Logger: discardLogger()})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "address already in use")
}

// The read role may send read-only verbs and subscribe to events, but publishing an admin
// verb is a permission violation; the admin role may send both.
func TestReadRoleCannotSendAdminVerbs(t *testing.T) {
	n := openEmbedded(t, func(c *NATSConfig) {
		c.Users = []NATSUser{{Name: "op", Password: "op-secret", Role: RoleAdmin}, {Name: "viewer", Password: "v-secret", Role: RoleRead}}
	})
	received := make(chan string, 16)
	_, err := n.Conn().Subscribe(CommandSubjectPrefix+".>", func(m *nats.Msg) { received <- m.Subject })
	require.NoError(t, err)
	require.NoError(t, n.Conn().Flush())

	_, err = nats.Connect(n.ListenURL())
	require.Error(t, err, "users are required")

	connect := func(user, pass string) (*nats.Conn, chan error) {
		errs := make(chan error, 16)
		nc, err := nats.Connect(n.ListenURL(), nats.UserInfo(user, pass),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		return nc, errs
	}
	viewer, viewerErrs := connect("viewer", "v-secret")
	_, err = viewer.SubscribeSync("flowd.evt.>")
	require.NoError(t, err)
	require.NoError(t, viewer.Publish("flowd.ctl.local.topic.delete", nil))
	require.NoError(t, viewer.Flush())
	select {
	case err := <-viewerErrs:
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
		assert.Contains(t, err.Error(), "flowd.ctl.local.topic.delete")
	case <-time.After(10 * time.Second):
		t.Fatal("publishing an admin verb as a read user was not refused")
	}
	for _, verb := range ReadOnlyVerbs() {
		require.NoError(t, viewer.Publish("flowd.ctl.local.topic."+verb, nil))
	}
	require.NoError(t, viewer.Publish("flowd.ctl.local.status", nil))
	require.NoError(t, viewer.Flush())
	for _, verb := range append(ReadOnlyVerbs(), "status") {
		select {
		case got := <-received:
			assert.True(t, strings.HasSuffix(got, "."+verb), "%s delivered, not an admin verb", got)
		case <-time.After(10 * time.Second):
			t.Fatalf("read verb %s was not delivered", verb)
		}
	}
	select {
	case err := <-viewerErrs:
		t.Fatalf("read verbs refused: %v", err)
	default:
	}

	op, _ := connect("op", "op-secret")
	require.NoError(t, op.Publish("flowd.ctl.local.topic.delete", nil))
	require.NoError(t, op.Flush())
	select {
	case got := <-received:
		assert.Equal(t, "flowd.ctl.local.topic.delete", got)
	case <-time.After(10 * time.Second):
		t.Fatal("the admin's command was not delivered")
	}
}

func TestReadOnlyVerbsCannotBeChangedByCallers(t *testing.T) {
	v := ReadOnlyVerbs()
	assert.Equal(t, []string{"list", "describe", "get", "query", "status", "browse", "search"}, v)
	v[0] = "delete"
	assert.False(t, IsReadOnly("delete"))
	assert.True(t, IsReadOnly("list"))
}

// With URLs flowd connects to an existing server (here one with a token) and starts none;
// events flow through it.
func TestExternalNATSWithToken(t *testing.T) {
	ext := startExternal(t, "s3cret")
	_, err := Open(context.Background(), NATSConfig{URLs: []string{ext.url()}, Token: "wrong", Logger: discardLogger()})
	require.Error(t, err, "a wrong token")

	n, err := Open(context.Background(), NATSConfig{URLs: []string{ext.url()}, Token: "s3cret", Logger: discardLogger()})
	require.NoError(t, err)
	defer func() { require.NoError(t, n.Close(context.Background())) }()
	assert.False(t, n.Embedded())
	assert.Nil(t, n.Server())

	events := subscribeEvents(t, ext.url(), nats.Token("s3cret"))
	b := newBroker(t, nil)
	startPublisher(t, n, b, nil)
	newRocketMQ(t, b).createTopic("remote", 1)
	m, _ := events.wait(t, "flowd.evt.local.topic.created", func(d EventData) bool { return d.Topic == "remote" })
	assert.Equal(t, "io.flowd.topic.v1.created", m.Header.Get("ce-type"))
}

// When the NATS server goes away the broker keeps serving, events wait in the bounded
// buffer (the oldest are dropped and counted), and on reconnect the buffered events are
// published in order followed by an events_dropped event.
func TestNATSOutageBuffersEventsAndReportsDrops(t *testing.T) {
	ext := startExternal(t, "")
	n, err := Open(context.Background(), NATSConfig{URLs: []string{ext.url()}, ReconnectWait: 20 * time.Millisecond, Logger: discardLogger()})
	require.NoError(t, err)
	defer func() { require.NoError(t, n.Close(context.Background())) }()
	b := newBroker(t, nil)
	p := startPublisher(t, n, b, func(c *EventsConfig) { c.Stream = true; c.Buffer = 3 })
	rmq := newRocketMQ(t, b)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(n.Conn())
	require.NoError(t, err)
	stream, err := js.Stream(ctx, EventsStreamName)
	require.NoError(t, err)
	lastTopic := func() string {
		m, err := stream.GetLastMsgForSubject(ctx, "flowd.evt.local.topic.created")
		if err != nil {
			return ""
		}
		var d EventData
		require.NoError(t, jsonUnmarshal(m.Data, &d))
		return d.Topic
	}
	rmq.createTopic("before", 1)
	require.Eventually(t, func() bool { return lastTopic() == "before" }, 10*time.Second, 5*time.Millisecond)

	ext.stop()
	require.Eventually(t, func() bool { return !n.Conn().IsConnected() }, 10*time.Second, 5*time.Millisecond)
	for i := range 5 {
		rmq.createTopic(fmt.Sprintf("during-%d", i), 1) // the broker keeps serving
	}
	// Events reach the publisher asynchronously: wait for all five (three kept, two dropped)
	// before reading the figures.
	require.Eventually(t, func() bool { return p.Buffered() == 3 && p.Dropped() == 2 }, 10*time.Second, 5*time.Millisecond)
	st := p.Stats()
	assert.False(t, st.Connected)
	assert.Equal(t, 3, st.Buffered)
	assert.Equal(t, uint64(2), st.Dropped)

	ext.start()
	require.Eventually(t, func() bool { return n.Conn().IsConnected() }, 10*time.Second, 5*time.Millisecond)
	var dropped *jetstream.RawStreamMsg
	require.Eventually(t, func() bool {
		dropped, err = stream.GetLastMsgForSubject(ctx, "flowd.evt.local.broker.events_dropped")
		return err == nil
	}, 10*time.Second, 5*time.Millisecond)
	var d EventData
	require.NoError(t, jsonUnmarshal(dropped.Data, &d))
	assert.Equal(t, uint64(2), d.Dropped)
	assert.Equal(t, uint64(2), d.DroppedTotal)
	assert.Equal(t, 0, p.Buffered())

	// The stream holds "before" and the three newest topics of the outage, in order.
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"flowd.evt.local.topic.created"}})
	require.NoError(t, err)
	var topics []string
	for len(topics) < 4 {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		var d EventData
		require.NoError(t, jsonUnmarshal(m.Data(), &d))
		if d.Topic != broker.ScheduleTopic && !strings.HasPrefix(d.Topic, "TBW") {
			topics = append(topics, d.Topic)
		}
	}
	assert.Equal(t, []string{"before", "during-2", "during-3", "during-4"}, topics)

	rmq.createTopic("after", 1)
	require.Eventually(t, func() bool { return lastTopic() == "after" }, 10*time.Second, 5*time.Millisecond)
}

// Close drains the connection and stops the embedded server; a second Open on the same
// address then succeeds.
func TestCloseStopsTheEmbeddedServer(t *testing.T) {
	addr := freeAddr(t)
	cfg := NATSConfig{Listen: addr, StoreDir: t.TempDir(), Logger: discardLogger()}
	n, err := Open(context.Background(), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, n.Close(ctx))
	assert.True(t, n.Conn().IsClosed())
	_, err = nats.Connect("nats://"+addr, nats.MaxReconnects(0))
	require.Error(t, err, "the listener is gone")

	n, err = Open(context.Background(), cfg)
	require.NoError(t, err)
	require.NoError(t, n.Close(ctx))
}

// A read user can follow the events stream with an ephemeral consumer but cannot delete it.
func TestReadRoleReadsTheEventsStreamButCannotChangeIt(t *testing.T) {
	n := openEmbedded(t, func(c *NATSConfig) {
		c.Users = []NATSUser{{Name: "viewer", Password: "v-secret", Role: RoleRead}}
	})
	b := newBroker(t, nil)
	startPublisher(t, n, b, func(c *EventsConfig) { c.Stream = true })
	newRocketMQ(t, b).createTopic("watched", 1)

	violations := make(chan error, 16)
	nc, err := nats.Connect(n.ListenURL(), nats.UserInfo("viewer", "v-secret"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, EventsStreamName)
	require.NoError(t, err)
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{"flowd.evt.local.topic.created"}})
	require.NoError(t, err)
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		var d EventData
		require.NoError(t, jsonUnmarshal(m.Data(), &d))
		if d.Topic == "watched" {
			break
		}
	}
	// The server answers a forbidden request with an asynchronous violation, not a reply.
	dctx, dcancel := context.WithCancel(ctx)
	deleted := make(chan error, 1)
	go func() { deleted <- js.DeleteStream(dctx, EventsStreamName) }()
	select {
	case err := <-violations:
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
		assert.Contains(t, err.Error(), "$JS.API.STREAM.DELETE."+EventsStreamName)
	case <-ctx.Done():
		t.Fatal("deleting the events stream as a read user was not refused")
	}
	dcancel()
	require.Error(t, <-deleted)
	_, err = js.Stream(ctx, EventsStreamName)
	require.NoError(t, err, "the stream is still there")
}

// Close while NATS is unreachable closes the connection at once rather than waiting for a
// drain that cannot happen.
func TestCloseWhileDisconnected(t *testing.T) {
	ext := startExternal(t, "")
	n, err := Open(context.Background(), NATSConfig{URLs: []string{ext.url()}, ReconnectWait: 20 * time.Millisecond, Logger: discardLogger()})
	require.NoError(t, err)
	ext.stop()
	require.Eventually(t, func() bool { return !n.Conn().IsConnected() }, 10*time.Second, 5*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, n.Close(ctx))
	assert.True(t, n.Conn().IsClosed())
}
