package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// fakePipelines is a pipeline.Controller holding states by name and recording seeks. The
// daemon's end-to-end tests run the real pipeline.Manager.
type fakePipelines struct {
	mu    sync.Mutex
	state map[string]pipeline.State
	seeks []pipeline.SeekRequest
	// fail holds the error Resume and Seek of a name return.
	fail map[string]error
}

func (f *fakePipelines) status(name string) (pipeline.Status, error) {
	st, ok := f.state[name]
	if !ok {
		return pipeline.Status{}, fmt.Errorf("pipeline %s: %w", name, pipeline.ErrNotFound)
	}
	return pipeline.Status{Name: name, State: st}, nil
}

func (f *fakePipelines) Start(context.Context, pipeline.Definition) error { return nil }
func (f *fakePipelines) Stop(context.Context, string) error               { return nil }

func (f *fakePipelines) set(name string, to pipeline.State) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, err := f.status(name)
	if err != nil {
		return err
	}
	// As the Manager: pausing a paused pipeline is no error, a stopped one is.
	if st.State != pipeline.StateRunning && st.State != pipeline.StatePaused {
		return fmt.Errorf("pipeline %s is %s: %w", name, st.State, pipeline.ErrNotRunning)
	}
	f.state[name] = to
	return nil
}

func (f *fakePipelines) Pause(_ context.Context, name string) error {
	return f.set(name, pipeline.StatePaused)
}

func (f *fakePipelines) Resume(_ context.Context, name string) error {
	if err := f.fail[name]; err != nil {
		return err
	}
	return f.set(name, pipeline.StateRunning)
}

func (f *fakePipelines) Seek(_ context.Context, name string, req pipeline.SeekRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, err := f.status(name); err != nil {
		return err
	}
	if err := f.fail[name]; err != nil {
		return err
	}
	f.seeks = append(f.seeks, req)
	return nil
}

func (f *fakePipelines) Get(_ context.Context, name string) (pipeline.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status(name)
}

func (f *fakePipelines) List(context.Context) ([]pipeline.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := []pipeline.Status{}
	for _, n := range []string{"a", "b"} {
		if st, err := f.status(n); err == nil {
			out = append(out, st)
		}
	}
	return out, nil
}

func TestPipelineCommands(t *testing.T) {
	f := &fakePipelines{state: map[string]pipeline.State{"a": pipeline.StateRunning, "b": pipeline.StateRunning}}
	e := start(t, func(c *control.ServiceConfig) { c.Pipelines = f })

	var list control.PipelineListReply
	e.ok("pipeline.list", ``, &list)
	require.Len(t, list.Pipelines, 2)
	assert.Equal(t, "a", list.Pipelines[0].Name)
	e.ok("pipeline.list", `{"name":"b"}`, &list)
	require.Len(t, list.Pipelines, 1)
	assert.Equal(t, "b", list.Pipelines[0].Name)

	var r control.PipelineReply
	e.ok("pipeline.pause", `{"name":"a"}`, &r)
	assert.Equal(t, pipeline.StatePaused, r.Pipeline.State)
	assert.Equal(t, "local", r.Cluster)
	e.ok("pipeline.pause", `{"name":"a"}`, &r)
	f.mu.Lock()
	f.state["b"] = pipeline.StateFailed
	f.mu.Unlock()
	assert.Contains(t, e.fail("pipeline.pause", `{"name":"b"}`, control.CodeConflict), "not running")
	e.ok("pipeline.resume", `{"name":"a"}`, &r)
	assert.Equal(t, pipeline.StateRunning, r.Pipeline.State)

	e.ok("pipeline.seek", `{"name":"a","position":"offset","offset":7,"queue":{"topic":"orders","brokerName":"broker-a","queueId":1}}`, &r)
	e.ok("pipeline.seek", `{"name":"a","position":"first"}`, nil)
	f.mu.Lock()
	require.Len(t, f.seeks, 2)
	assert.Equal(t, int64(7), f.seeks[0].Offset)
	assert.Equal(t, 1, f.seeks[0].Queue.QueueID)
	assert.Nil(t, f.seeks[1].Queue)
	f.mu.Unlock()

	for _, tc := range []struct{ cmd, body, want string }{
		{"pipeline.pause", `{}`, `field "name": required`},
		{"pipeline.resume", `{"name":1}`, `field "name"`},
		{"pipeline.list", `{"colour":"red"}`, `field "colour": unknown field`},
		{"pipeline.seek", `{"name":"a"}`, `field "position": required`},
		{"pipeline.seek", `{"name":"a","position":"middle"}`, `field "position": "middle" is not`},
		{"pipeline.seek", `{"name":"a","position":"timestamp"}`, `field "timestamp": required`},
		{"pipeline.seek", `{"name":"a","position":"offset","offset":3}`, `field "queue": required`},
		{"pipeline.seek", `{"name":"a","position":"offset","offset":-1,"queue":{"topic":"t","queueId":0}}`, `field "offset"`},
	} {
		assert.Contains(t, e.fail(tc.cmd, tc.body, control.CodeBadRequest), tc.want, tc.body)
	}
	for _, cmd := range []string{"pipeline.pause", "pipeline.resume", "pipeline.list"} {
		assert.Contains(t, e.fail(cmd, `{"name":"nope"}`, control.CodeNotFound), "nope", cmd)
	}
	e.fail("pipeline.seek", `{"name":"nope","position":"last"}`, control.CodeNotFound)
}

// An error of the pipeline package naming fields, a definition's or a request's, is a 400
// naming the first and saying what is wrong with each, on one line.
func TestPipelineFieldErrorsAreNamed(t *testing.T) {
	bad := pipeline.Definition{Name: "a b", Topics: []string{"t"}}.Validate()
	require.Len(t, pipeline.FieldErrors(bad), 2)
	f := &fakePipelines{
		state: map[string]pipeline.State{"def": pipeline.StateFailed, "seek": pipeline.StateRunning},
		fail: map[string]error{
			"def":  fmt.Errorf("pipeline def: restart: %w", bad),
			"seek": fmt.Errorf("seek: %w", &pipeline.FieldError{Field: "offset", Msg: "past the end", Kind: pipeline.ErrInvalidArgument}),
		},
	}
	e := start(t, func(c *control.ServiceConfig) { c.Pipelines = f })
	assert.Equal(t, `field "name": "a b" must be 1-128 letters, digits, '-', '_' or '.'; field "sink.type": required`,
		e.fail("pipeline.resume", `{"name":"def"}`, control.CodeBadRequest))
	assert.Equal(t, `field "offset": past the end`,
		e.fail("pipeline.seek", `{"name":"seek","position":"offset","offset":5,"queue":{"topic":"t","queueId":0}}`, control.CodeBadRequest))
}

func TestPipelineCommandsServedOnlyWithAController(t *testing.T) {
	e := start(t, func(c *control.ServiceConfig) { c.Pipelines = &fakePipelines{state: map[string]pipeline.State{}} })
	msg, err := e.cl.Request("$SRV.INFO.flowd", nil, wait)
	require.NoError(t, err)
	var info micro.Info
	require.NoError(t, json.Unmarshal(msg.Data, &info))
	subjects := map[string]string{}
	for _, ep := range info.Endpoints {
		subjects[ep.Subject] = ep.Metadata["read_only"]
	}
	assert.Equal(t, "true", subjects["flowd.ctl.v1.local.pipeline.list"])
	assert.Equal(t, "false", subjects["flowd.ctl.v1.local.pipeline.pause"])
	assert.Equal(t, "false", subjects["flowd.ctl.v1.local.pipeline.resume"])
	assert.Equal(t, "false", subjects["flowd.ctl.v1.local.pipeline.seek"])

	without := start(t, nil)
	_, err = without.cl.Request("flowd.ctl.v1.local.pipeline.list", nil, wait/10)
	require.Error(t, err, "no responders without a pipeline controller")
}
