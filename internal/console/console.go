// Package console is flowd's web console: the JSON HTTP API under /api/v1/ and the page
// at / that uses it, served by the daemon's HTTP listener. The API runs the command
// service's own handlers (control.Service.Do), so a request over HTTP is answered exactly
// as the same request over NATS; live updates are the broker's events as Server-Sent
// Events. The page's assets are embedded, so the console works offline.
package console

import (
	"context"
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/flowd-io/flowd/control"
)

//go:embed assets
var assets embed.FS

// maxBody bounds a request body: a plugin module (base64) is the largest thing sent.
const maxBody = 64 << 20

// Config configures the console. Service is required.
type Config struct {
	// Service returns the command service serving now, or nil while none does (NATS off,
	// or the service restarting on a reload). The daemon restarts the service when the
	// disabled commands change, so the console asks for it on every request.
	Service func() *control.Service

	// Events is the connection the event stream (/api/v1/events) subscribes with; nil: the
	// stream answers 503.
	Events *nats.Conn

	// Cluster names the cluster whose events are streamed (flowd.evt.<cluster>.>).
	Cluster string

	// Token, when set, is a credential of the admin role (the NATS token), presented as
	// "Authorization: Bearer <token>" or exchanged for a session.
	Token string

	// Users are credentials with a role (the NATS users), presented with HTTP Basic
	// authentication or exchanged for a session. With neither Token nor Users every request
	// has the admin role, which the daemon allows only on a loopback listener.
	Users []User

	// Version is the daemon's version, shown by the page.
	Version string

	// SessionTTL is how long a session lasts after sign-in. Default 12 h.
	SessionTTL time.Duration

	// Logger receives the console's logs. Default slog.Default().
	Logger *slog.Logger
}

// User is a name, password and role, as the NATS users are configured.
type User struct {
	Name     string
	Password string
	Role     control.Role
}

// Server is the console's HTTP handler. Close ends the event streams it is serving.
type Server struct {
	cfg      Config
	log      *slog.Logger
	handler  http.Handler
	sessions *sessions

	closeOnce sync.Once
	done      chan struct{}
}

// New builds the console.
func New(cfg Config) (*Server, error) {
	if cfg.Service == nil {
		return nil, fmt.Errorf("console: Config.Service is required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = 12 * time.Hour
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for i, u := range cfg.Users {
		if u.Name == "" || u.Password == "" || (u.Role != control.RoleAdmin && u.Role != control.RoleRead) {
			return nil, fmt.Errorf("console: users[%d]: needs name, password and role admin or read", i)
		}
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "console"), sessions: newSessions(cfg.SessionTTL),
		done: make(chan struct{})}
	s.handler = s.routes()
	return s, nil
}

// ServeHTTP serves the page and the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Close ends the event streams being served, so that the HTTP server's shutdown does not
// wait for them.
func (s *Server) Close() { s.closeOnce.Do(func() { close(s.done) }) }

func (s *Server) routes() http.Handler {
	static, _ := fs.Sub(assets, "assets") // the directory is embedded: this cannot fail
	api := http.NewServeMux()
	api.HandleFunc("GET /api/v1/openapi.json", s.openAPI)
	api.HandleFunc("GET /api/v1/session", s.authed(s.whoami))
	api.HandleFunc("POST /api/v1/session", s.signIn)
	api.HandleFunc("DELETE /api/v1/session", s.signOut)
	api.HandleFunc("GET /api/v1/events", s.authed(s.events))
	api.HandleFunc("GET /api/v1/stats", s.authed(s.stats))
	api.HandleFunc("GET /api/v1/commands", s.authed(s.commandList))
	api.HandleFunc("GET /api/v1/{noun}/{verb}", s.authed(s.command))
	api.HandleFunc("POST /api/v1/{noun}/{verb}", s.authed(s.command))
	api.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no API endpoint %s %s", r.Method, r.URL.Path))
	})
	files := http.FileServerFS(static)
	api.Handle("GET /assets/", http.StripPrefix("/assets/", noCache(files)))
	api.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		http.ServeFileFS(w, r, static, "index.html")
	})
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusForbidden, "cross-origin request refused: a change must come from the console's own page or a non-browser client")
	}))
	return s.hostCheck(cop.Handler(api))
}

// noCache has the browser revalidate the assets, so that a new daemon's page is never mixed
// with an old script.
func noCache(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		h.ServeHTTP(w, r)
	})
}

// errorBody is the body of an error the console answers itself (no command ran): the
// shape of control.ErrorReply without the node.
type errorBody struct {
	Error control.ErrorBody `json:"error"`
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, errorBody{Error: control.ErrorBody{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		code, body = http.StatusInternalServerError, []byte(`{"error":{"code":500,"message":"encode reply"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// noService is the answer while no command service runs.
func noService(w http.ResponseWriter) {
	writeError(w, http.StatusServiceUnavailable, "no daemon answers: the command service is not running (nats.enabled is false, or it is restarting)")
}

// command runs noun.verb through the command service: the body of a POST, or the query
// parameters of a GET (read-only verbs only), as the request.
func (s *Server) command(w http.ResponseWriter, r *http.Request, p principal) {
	noun, verb := r.PathValue("noun"), r.PathValue("verb")
	name := noun + "." + verb
	readOnly := control.IsReadOnly(verb)
	if r.Method == http.MethodGet && !readOnly {
		w.Header().Set("Allow", "POST")
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s changes state: send it with POST", name))
		return
	}
	if !readOnly && p.Role != control.RoleAdmin {
		writeError(w, http.StatusForbidden, fmt.Sprintf("you need the admin role for %s (signed in as %s, role %s)", name, p.who(), p.Role))
		return
	}
	var body []byte
	if r.Method == http.MethodPost {
		var err error
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("read request: %v", err))
			return
		}
	} else {
		body = queryJSON(r)
	}
	svc := s.cfg.Service()
	if svc == nil {
		noService(w)
		return
	}
	code, reply := svc.Do(r.Context(), name, body)
	if !readOnly && code == http.StatusOK {
		s.log.Info("console command", "command", name, "user", p.who())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(reply)
}

// stringParam reports the request fields that are strings whatever they look like, so that a
// topic named "42" stays a string in a GET's query.
func stringParam(k string) bool {
	switch k {
	case "topic", "group", "name", "key", "msg_id", "version", "to", "expression", "type", "filter", "sql92", "broker", "timeout", "body", "tags":
		return true
	}
	return false
}

// queryJSON turns a GET's query parameters into a request object: true, false and integers
// become JSON values (except for the fields that are always strings), anything else a
// string. A repeated parameter keeps its last value.
func queryJSON(r *http.Request) []byte {
	q := r.URL.Query()
	obj := make(map[string]any, len(q))
	for k, vs := range q {
		v := vs[len(vs)-1]
		switch {
		case stringParam(k):
			obj[k] = v
		case v == "true" || v == "false":
			obj[k] = v == "true"
		default:
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				obj[k] = n
			} else {
				obj[k] = v
			}
		}
	}
	body, _ := json.Marshal(obj) // strings, bools and integers only
	return body
}

// commandInfo is one line of /api/v1/commands.
type commandInfo struct {
	Name     string `json:"name"`
	ReadOnly bool   `json:"read_only"`
	Allowed  bool   `json:"allowed"`
}

// commandList answers the commands and whether the caller may send each, which the page
// reads to show or hide its change buttons.
func (s *Server) commandList(w http.ResponseWriter, r *http.Request, p principal) {
	var out []commandInfo
	for _, name := range control.Commands() {
		_, verb, _ := strings.Cut(name, ".")
		ro := control.IsReadOnly(verb)
		out = append(out, commandInfo{Name: name, ReadOnly: ro, Allowed: ro || p.Role == control.RoleAdmin})
	}
	writeJSON(w, http.StatusOK, map[string]any{"commands": out})
}

// stats answers the command service's STATS data: every topic's messages and rate, every
// group's lag and members.
func (s *Server) stats(w http.ResponseWriter, r *http.Request, _ principal) {
	svc := s.cfg.Service()
	if svc == nil {
		noService(w)
		return
	}
	writeJSON(w, http.StatusOK, svc.Stats())
}

// shutdownContext is cancelled when the request ends or the console closes.
func (s *Server) shutdownContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}
