package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go/micro"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/fields"
)

// ErrorReply is the body of an error reply. The same code and message travel in the
// Nats-Service-Error-Code and Nats-Service-Error headers.
type ErrorReply struct {
	Origin
	Error ErrorBody `json:"error"`
}

// ErrorBody is an error's code and message.
type ErrorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// cmdError is an error a command answers with.
type cmdError struct {
	code int
	msg  string
}

func (e *cmdError) Error() string { return strconv.Itoa(e.code) + " " + e.msg }

func badRequest(format string, args ...any) error {
	return &cmdError{code: CodeBadRequest, msg: fmt.Sprintf(format, args...)}
}

// badField is a 400 naming the field at fault.
func badField(field, format string, args ...any) error {
	return fieldReply(fields.Errorf(nil, field, format, args...), "")
}

// fieldReply is the 400 of an error that names fields, or nil when err names none: the one
// mapping of a *fields.Error (a request's JSON, a pipeline definition or request, a plugin
// manifest) to a reply, for every command. under is where the fields sit in the request
// ("manifest"), "" for the request's own. The message names each field and says what is
// wrong with it, the first field first.
func fieldReply(err error, under string) error {
	fes := fields.Errors(err)
	if len(fes) == 0 {
		return nil
	}
	parts := make([]string, len(fes))
	for i, fe := range fes {
		parts[i] = fmt.Sprintf("field %q: %s", fields.Join(under, fe.Field), fe.Detail())
	}
	return &cmdError{code: CodeBadRequest, msg: strings.Join(parts, "; ")}
}

// tooLarge is the error that replaces a reply of n bytes over the max payload.
func tooLarge(n, maxPayload int64) *cmdError {
	return &cmdError{code: CodeTooLarge, msg: fmt.Sprintf("reply too large (%d bytes > max payload %d)", n, maxPayload)}
}

// brokerError maps a broker error to a reply: its sentinel decides the code, field names the
// request field it concerns (for 400s), and the message keeps the broker's text.
func brokerError(err error, field string) error {
	switch {
	case errors.Is(err, broker.ErrNotFound):
		return &cmdError{code: CodeNotFound, msg: err.Error()}
	case errors.Is(err, broker.ErrExists):
		return &cmdError{code: CodeConflict, msg: err.Error()}
	case errors.Is(err, broker.ErrReserved):
		return badField(field, "%s", err)
	case errors.Is(err, broker.ErrBadTopic), errors.Is(err, broker.ErrBadOffset):
		return badField(field, "%s", err)
	}
	return &cmdError{code: CodeInternal, msg: err.Error()}
}

func (s *Service) handler(c command) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.RequestTimeout)
		defer cancel()
		reply, err := c.handle(s, ctx, req.Data())
		if err != nil {
			s.respondError(req, c, err)
			return
		}
		body, err := json.Marshal(reply)
		if err != nil {
			s.respondError(req, c, fmt.Errorf("encode reply: %w", err))
			return
		}
		// NATS refuses to send a message over the max payload, and the requester would
		// wait for its timeout: it gets an error it can read instead.
		if n, limit := int64(len(body)), s.nc.MaxPayload(); n > limit {
			s.log.Warn("control reply too large", "command", c.name(), "bytes", n, "max_payload", limit)
			s.respondError(req, c, tooLarge(n, limit))
			return
		}
		if err := req.Respond(body); err != nil {
			s.log.Warn("control reply not sent", "command", c.name(), "err", err)
		}
	})
}

func (s *Service) disabledHandler(c command) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		s.respondError(req, c, &cmdError{code: CodeDisabled, msg: fmt.Sprintf("command %s is disabled on this node", c.name())})
	})
}

// respondError answers req with err: its code, and its message with the request's long
// values clipped. An error reply that still does not fit the max payload (a server
// configured with a tiny one) is replaced by the short "reply too large".
func (s *Service) respondError(req micro.Request, c command, err error) {
	var ce *cmdError
	if !errors.As(err, &ce) {
		ce = &cmdError{code: CodeInternal, msg: err.Error()}
	}
	msg := clipEchoes(ce.msg, req.Data())
	if ce.code == CodeInternal {
		s.log.Error("control command failed", "command", c.name(), "err", msg)
	}
	code := ce.code
	header, body := s.errorReply(code, msg)
	limit := s.nc.MaxPayload()
	if n := errorReplySize(code, header, body); n > limit {
		s.log.Warn("control error reply too large", "command", c.name(), "code", code, "bytes", n, "max_payload", limit)
		short := tooLarge(n, limit)
		code = short.code
		header, body = s.errorReply(code, short.msg)
		if errorReplySize(code, header, body) > limit {
			body = nil // the headers alone still carry the code and the message
		}
	}
	if err := req.Error(strconv.Itoa(code), header, body); err != nil {
		s.log.Warn("control error reply not sent", "command", c.name(), "err", err)
	}
}

// errorReply returns the header value and the body of an error reply.
func (s *Service) errorReply(code int, msg string) (string, []byte) {
	body, _ := json.Marshal(ErrorReply{Origin: s.origin(), Error: ErrorBody{Code: code, Message: msg}})
	// A header value must be one line.
	return strings.NewReplacer("\r", " ", "\n", " ").Replace(msg), body
}

// errorReplySize is the size NATS checks against the max payload for an error reply: the
// body and the header block ("NATS/1.0\r\n", one "Key: value\r\n" per header, "\r\n").
func errorReplySize(code int, header string, body []byte) int64 {
	n := len("NATS/1.0\r\n") + len("\r\n")
	n += len(micro.ErrorHeader) + len(": \r\n") + len(header)
	n += len(micro.ErrorCodeHeader) + len(": \r\n") + len(strconv.Itoa(code))
	return int64(n + len(body))
}

// Bounds of what an error message echoes of a request.
const (
	// echoLimit is how much of a long request value an error message shows.
	echoLimit = 128
	// messageLimit bounds a whole error message, whatever the texts it joins echo.
	messageLimit = 2048
	// echoesSought is how many of the request's longest values are looked for in a message:
	// a message echoes a few of them, and the search must stay cheap on any request.
	echoesSought = 8
)

// clip returns s if it has at most limit bytes, else its first limit bytes (cut at a rune
// boundary), an ellipsis and its length.
func clip(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := limit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// clipEchoes shortens, in msg, the request's long values that it echoes (in full, or
// quoted), then msg itself: an error reply stays short whatever the request carried, and
// whichever package's error text repeats it.
func clipEchoes(msg string, request []byte) string {
	if len(msg) <= echoLimit {
		return msg // too short to echo anything long
	}
	for _, v := range longValues(request) {
		if q := strconv.Quote(v); strings.Contains(msg, q) {
			msg = strings.ReplaceAll(msg, q, strconv.Quote(clip(v, echoLimit)))
		}
		msg = strings.ReplaceAll(msg, v, clip(v, echoLimit))
	}
	return clip(msg, messageLimit)
}

// longValues returns the longest strings of a JSON request (object keys, string values,
// number literals) over echoLimit bytes, longest first, at most echoesSought of them. It
// reads what it can: a request that is not JSON yields the values before the fault.
func longValues(request []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(request))
	dec.UseNumber()
	var out []string
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		var v string
		switch t := tok.(type) {
		case string:
			v = t
		case json.Number:
			v = string(t)
		}
		if len(v) > echoLimit {
			out = append(out, v)
		}
	}
	slices.SortFunc(out, func(a, b string) int {
		if d := len(b) - len(a); d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	out = slices.Compact(out)
	return out[:min(len(out), echoesSought)]
}
