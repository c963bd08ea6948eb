package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"time"

	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/fields"
	"github.com/flowd-io/flowd/pipeline"
)

// PipelineRequest is the request of pipeline.pause and pipeline.resume.
type PipelineRequest struct {
	Name string `json:"name"`
}

// PipelineListRequest is the request of pipeline.list; Name, when set, lists one pipeline
// (404 when there is none of that name).
type PipelineListRequest struct {
	Name string `json:"name,omitempty"`
}

// PipelineListReply is the reply of pipeline.list, sorted by name.
type PipelineListReply struct {
	Origin
	Pipelines []pipeline.Status `json:"pipelines"`
}

// PipelineSeekRequest is the request of pipeline.seek: the pipeline and where to move it,
// in one queue (Queue) or in every queue it owns now.
type PipelineSeekRequest struct {
	Name string `json:"name"`
	// Queue is the queue to move; absent: every queue the pipeline owns. Required with
	// position offset.
	Queue *consumer.MessageQueue `json:"queue,omitempty"`
	// Position is first, last, timestamp or offset.
	Position string `json:"position"`
	// Timestamp (RFC 3339) is the store time to move to, with position timestamp.
	Timestamp time.Time `json:"timestamp,omitzero"`
	// Offset is the queue offset to move to, with position offset.
	Offset int64 `json:"offset,omitempty"`
}

// PipelineReply is the reply of pipeline.pause, pipeline.resume and pipeline.seek: the
// pipeline's status after the command.
type PipelineReply struct {
	Origin
	Pipeline pipeline.Status `json:"pipeline"`
}

func decodePipelineName(data []byte) (string, error) {
	var req PipelineRequest
	if err := decode(data, &req); err != nil {
		return "", err
	}
	if req.Name == "" {
		return "", badField("name", "required")
	}
	return req.Name, nil
}

func (s *Service) pipelineList(ctx context.Context, data []byte) (any, error) {
	var req PipelineListRequest
	if err := decode(data, &req); err != nil {
		return nil, err
	}
	out := PipelineListReply{Origin: s.origin(), Pipelines: []pipeline.Status{}}
	if req.Name != "" {
		st, err := s.cfg.Pipelines.Get(ctx, req.Name)
		if err != nil {
			return nil, pipelineError(err, "name")
		}
		out.Pipelines = append(out.Pipelines, st)
		return out, nil
	}
	all, err := s.cfg.Pipelines.List(ctx)
	if err != nil {
		return nil, pipelineError(err, "")
	}
	out.Pipelines = append(out.Pipelines, all...)
	return out, nil
}

func (s *Service) pipelinePause(ctx context.Context, data []byte) (any, error) {
	name, err := decodePipelineName(data)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Pipelines.Pause(ctx, name); err != nil {
		return nil, pipelineError(err, "name")
	}
	return s.pipelineReply(ctx, name)
}

func (s *Service) pipelineResume(ctx context.Context, data []byte) (any, error) {
	name, err := decodePipelineName(data)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.Pipelines.Resume(ctx, name); err != nil {
		return nil, pipelineError(err, "name")
	}
	return s.pipelineReply(ctx, name)
}

// pipelineSeekWire is a pipeline.seek request as it is read: the timestamp raw, so that a
// bad one is a 400 naming it rather than a JSON error naming no field.
type pipelineSeekWire struct {
	PipelineSeekRequest
	Timestamp json.RawMessage `json:"timestamp,omitempty"`
}

func (s *Service) pipelineSeek(ctx context.Context, data []byte) (any, error) {
	var wire pipelineSeekWire
	if err := decode(data, &wire); err != nil {
		return nil, err
	}
	req := wire.PipelineSeekRequest
	if req.Name == "" {
		return nil, badField("name", "required")
	}
	ts, err := parseSeekTimestamp(wire.Timestamp)
	if err != nil {
		return nil, err
	}
	req.Timestamp = ts
	// Checked here as well as by the pipeline, so that the reply names the field.
	switch req.Position {
	case pipeline.SeekFirst, pipeline.SeekLast:
	case pipeline.SeekTimestamp:
		if req.Timestamp.IsZero() {
			return nil, badField("timestamp", "required with position timestamp")
		}
	case pipeline.SeekOffset:
		if req.Queue == nil {
			return nil, badField("queue", "required with position offset")
		}
		if req.Offset < 0 {
			return nil, badField("offset", "%d is negative", req.Offset)
		}
	case "":
		return nil, badField("position", "required")
	default:
		return nil, badField("position", "%q is not first, last, timestamp or offset", req.Position)
	}
	if req.Queue != nil && (req.Queue.Topic == "" || req.Queue.QueueID < 0) {
		return nil, badField("queue", "needs topic, brokerName and a queueId of 0 or more")
	}
	// Queue ids travel as int32 on the wire: a larger one would name another queue.
	if req.Queue != nil && req.Queue.QueueID > math.MaxInt32 {
		return nil, badField("queue", "queueId %d is past the largest queue id, %d", req.Queue.QueueID, math.MaxInt32)
	}
	sr := pipeline.SeekRequest{Queue: req.Queue, Position: req.Position, Timestamp: req.Timestamp, Offset: req.Offset}
	if err := s.cfg.Pipelines.Seek(ctx, req.Name, sr); err != nil {
		return nil, pipelineError(err, "position")
	}
	return s.pipelineReply(ctx, req.Name)
}

// parseSeekTimestamp reads pipeline.seek's timestamp: an RFC 3339 string; absent is the
// zero time.
func parseSeekTimestamp(raw json.RawMessage) (time.Time, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return time.Time{}, nil
	}
	var str string
	if err := json.Unmarshal(raw, &str); err != nil {
		return time.Time{}, badField("timestamp", "must be an RFC 3339 time (a string), not %s", clip(string(raw), echoLimit))
	}
	t, err := time.Parse(time.RFC3339Nano, str)
	if err != nil {
		return time.Time{}, badField("timestamp", "must be an RFC 3339 time: %s", err)
	}
	if t.UnixMilli() <= 0 {
		return time.Time{}, badField("timestamp", "must be after 1970, not %s", str)
	}
	return t, nil
}

func (s *Service) pipelineReply(ctx context.Context, name string) (any, error) {
	st, err := s.cfg.Pipelines.Get(ctx, name)
	if err != nil {
		return nil, pipelineError(err, "name")
	}
	return PipelineReply{Origin: s.origin(), Pipeline: st}, nil
}

// pipelineError maps a pipeline error to a reply; field names the request field a malformed
// request concerns when the error does not name one.
func pipelineError(err error, field string) error {
	if fr := fieldReply(err, ""); fr != nil {
		return fr
	}
	switch {
	case errors.Is(err, pipeline.ErrNotFound):
		return &cmdError{code: CodeNotFound, msg: err.Error()}
	case errors.Is(err, pipeline.ErrNotRunning), errors.Is(err, pipeline.ErrExists):
		return &cmdError{code: CodeConflict, msg: err.Error()}
	case errors.Is(err, pipeline.ErrInvalidArgument), errors.Is(err, pipeline.ErrInvalidDefinition):
		return badField(field, "%s", err)
	}
	return &cmdError{code: CodeInternal, msg: err.Error()}
}

// PipelineDefinitions is what pipeline.create and pipeline.delete work on: the definitions
// created over NATS, which the daemon keeps in JetStream KV and runs on every node that has
// them (beside the ones of its configuration file). Errors wrapping pipeline.ErrExists
// answer 409, pipeline.ErrNotFound 404, a field error (an invalid definition) 400 naming
// the field under "definition"; any other 500.
type PipelineDefinitions interface {
	Create(ctx context.Context, def pipeline.Definition) error
	Delete(ctx context.Context, name string) error
}

// PipelineCreateRequest is the request of pipeline.create.
type PipelineCreateRequest struct {
	// Definition is the pipeline's definition (docs/pipelines.md), as a JSON object with
	// the keys of the configuration file's pipelines.
	Definition *pipeline.Definition `json:"definition"`
}

// PipelineDefinitionReply is the reply of pipeline.create: the definition stored. Every
// node holding it starts it once its watch brings it; pipeline.list tells when.
type PipelineDefinitionReply struct {
	Origin
	Definition pipeline.Definition `json:"definition"`
}

// PipelineDeleteReply is the reply of pipeline.delete: the name deleted. Every node stops
// the pipeline, draining it, once its watch brings the deletion.
type PipelineDeleteReply struct {
	Origin
	Name string `json:"name"`
}

func (s *Service) pipelineCreate(ctx context.Context, data []byte) (any, error) {
	var wire struct {
		Definition json.RawMessage `json:"definition"`
	}
	if err := decode(data, &wire); err != nil {
		return nil, err
	}
	def, err := decodeDefinition(wire.Definition)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.PipelineDefinitions.Create(ctx, def); err != nil {
		if fr := fieldReply(err, "definition"); fr != nil {
			return nil, fr
		}
		return nil, pipelineError(err, "definition")
	}
	return PipelineDefinitionReply{Origin: s.origin(), Definition: def}, nil
}

// decodeDefinition reads pipeline.create's definition on its own, so that an unknown key
// is named under "definition" as every other fault of it is.
func decodeDefinition(raw json.RawMessage) (pipeline.Definition, error) {
	var def pipeline.Definition
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return def, badField("definition", "required")
	}
	if raw[0] != '{' {
		return def, badField("definition", "must be an object, not %s", clip(string(raw), echoLimit))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&def); err != nil {
		if fe := fields.FromJSON(nil, err); fe != nil {
			return def, fieldReply(fe, "definition")
		}
		return def, badField("definition", "%s", err)
	}
	return def, nil
}

func (s *Service) pipelineDelete(ctx context.Context, data []byte) (any, error) {
	name, err := decodePipelineName(data)
	if err != nil {
		return nil, err
	}
	if err := s.cfg.PipelineDefinitions.Delete(ctx, name); err != nil {
		return nil, pipelineError(err, "name")
	}
	return PipelineDeleteReply{Origin: s.origin(), Name: name}, nil
}
