package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Do runs one command ("topic.create") with a request body as its NATS endpoint would, and
// returns the code and the reply body the endpoint sends: 200 and the reply, or the error's
// code and its ErrorReply. It is the one dispatch table behind the NATS service and the
// console's HTTP API, so both answer the same request alike. A command the service does not
// serve (unknown, or a plugin or pipeline command without its registry) is 404; a disabled
// one 403. ctx bounds the command with the service's own context and RequestTimeout.
func (s *Service) Do(ctx context.Context, name string, data []byte) (int, []byte) {
	cmds := served(s.cfg)
	var found *command
	for i := range cmds {
		if cmds[i].name() == name {
			found = &cmds[i]
		}
	}
	if found == nil {
		return s.doError(name, data, &cmdError{code: CodeNotFound, msg: fmt.Sprintf("no command %s on this node", strings.TrimSpace(name))})
	}
	// The table was checked by StartService: an error here cannot happen.
	if disabled, _ := disabledSet(s.cfg.Disabled, cmds); disabled[name] {
		return s.doError(name, data, &cmdError{code: CodeDisabled, msg: fmt.Sprintf("command %s is disabled on this node", name)})
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel) // the service stopping fails the command too
	defer stop()
	reply, err := found.handle(s, ctx, data)
	if err != nil {
		return s.doError(name, data, err)
	}
	body, err := json.Marshal(reply)
	if err != nil {
		return s.doError(name, data, fmt.Errorf("encode reply: %w", err))
	}
	return 200, body
}

// doError is Do's error reply: the code and the ErrorReply respondError sends over NATS,
// without NATS's max payload (HTTP has none).
func (s *Service) doError(name string, data []byte, err error) (int, []byte) {
	var ce *cmdError
	if !errors.As(err, &ce) {
		ce = &cmdError{code: CodeInternal, msg: err.Error()}
	}
	msg := clipEchoes(ce.msg, data)
	if ce.code == CodeInternal {
		s.log.Error("control command failed", "command", name, "err", msg)
	}
	_, body := s.errorReply(ce.code, msg)
	return ce.code, body
}

// Stats returns what the service's STATS carry (every group's lag, every topic's messages
// and rate), for readers that are not NATS clients, such as the console's HTTP API.
func (s *Service) Stats() StatsData { return s.statsData() }
