package control_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// fakeDefinitions is a control.PipelineDefinitions over a map, refusing what the daemon's
// does (an invalid definition, a name taken, an unknown name); the daemon's tests run the
// real one, over JetStream.
type fakeDefinitions struct {
	mu   sync.Mutex
	defs map[string]pipeline.Definition
}

func (f *fakeDefinitions) Create(_ context.Context, def pipeline.Definition) error {
	if err := def.Validate(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.defs[def.Name]; ok {
		return fmt.Errorf("pipeline %q exists: %w", def.Name, pipeline.ErrExists)
	}
	f.defs[def.Name] = def
	return nil
}

func (f *fakeDefinitions) Delete(_ context.Context, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.defs[name]; !ok {
		return fmt.Errorf("pipeline %q: %w", name, pipeline.ErrNotFound)
	}
	delete(f.defs, name)
	return nil
}

func TestPipelineCreateAndDelete(t *testing.T) {
	f := &fakeDefinitions{defs: map[string]pipeline.Definition{}}
	e := start(t, func(c *control.ServiceConfig) {
		c.Pipelines = &fakePipelines{state: map[string]pipeline.State{}}
		c.PipelineDefinitions = f
	})
	var created control.PipelineDefinitionReply
	e.ok("pipeline.create", `{"definition":{"name":"p","topics":["orders"],"retry_backoff":"1s","sink":{"type":"topic","topic":"out"}}}`, &created)
	assert.Equal(t, "p", created.Definition.Name)
	assert.Equal(t, pipeline.Duration(1e9), created.Definition.RetryBackoff)
	f.mu.Lock()
	assert.Equal(t, []string{"orders"}, f.defs["p"].Topics)
	assert.Equal(t, "out", f.defs["p"].Sink.Topic)
	f.mu.Unlock()

	assert.Contains(t, e.fail("pipeline.create", `{"definition":{"name":"p","topics":["t"],"sink":{"type":"stdout"}}}`, control.CodeConflict), `"p" exists`)

	for _, tc := range []struct{ body, want string }{
		{`{}`, `field "definition": required`},
		{`{"definition":{"name":"q","topics":["t"],"sink":{"type":"topic"}}}`, `field "definition.sink.topic"`},
		{`{"definition":{"name":"q b","topics":["t"],"sink":{"type":"stdout"}}}`, `field "definition.name"`},
		{`{"definition":{"name":"q","topics":["t"],"colour":"red","sink":{"type":"stdout"}}}`, `field "definition.colour": unknown`},
		{`{"definition":{"name":"q","topics":["t"],"parallelism":"lots","sink":{"type":"stdout"}}}`, `field "definition.parallelism": must be a number`},
		{`{"definition":"q"}`, `field "definition": must be an object`},
	} {
		msg := e.fail("pipeline.create", tc.body, control.CodeBadRequest)
		assert.Contains(t, msg, tc.want, tc.body)
	}
	f.mu.Lock()
	assert.Len(t, f.defs, 1, "nothing stored of a refused definition")
	f.mu.Unlock()

	var deleted control.PipelineDeleteReply
	e.ok("pipeline.delete", `{"name":"p"}`, &deleted)
	assert.Equal(t, "p", deleted.Name)
	assert.Contains(t, e.fail("pipeline.delete", `{"name":"p"}`, control.CodeNotFound), `"p"`)
	assert.Contains(t, e.fail("pipeline.delete", `{}`, control.CodeBadRequest), `field "name": required`)
}

func TestPipelineCreateServedOnlyWithDefinitions(t *testing.T) {
	e := start(t, func(c *control.ServiceConfig) { c.Pipelines = &fakePipelines{state: map[string]pipeline.State{}} })
	_, err := e.cl.Request("flowd.ctl.v1.local.pipeline.create", []byte(`{}`), wait/10)
	require.Error(t, err, "no responders without pipeline definitions")
	e.ok("pipeline.list", ``, nil)
}
