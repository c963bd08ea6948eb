package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/flowd-io/flowd/control"
)

// sessionCookie carries a signed-in browser's session id. It is HttpOnly and SameSite=Strict,
// and the API refuses cross-origin changes besides (http.CrossOriginProtection).
const sessionCookie = "flowd_session"

// principal is who a request comes from and the role it has.
type principal struct {
	User string       `json:"user,omitempty"`
	Role control.Role `json:"role"`
}

func (p principal) who() string {
	if p.User == "" {
		return "anonymous"
	}
	return p.User
}

// authOn reports whether the console asks for credentials.
func (s *Server) authOn() bool { return s.cfg.Token != "" || len(s.cfg.Users) > 0 }

// authed wraps a handler that needs a principal: without credentials configured every
// request is admin; else a bearer token, HTTP Basic credentials or a session cookie is
// required (401 otherwise).
func (s *Server) authed(h func(http.ResponseWriter, *http.Request, principal)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.principal(r)
		if !ok {
			// No WWW-Authenticate: Basic, so that a browser shows the page's sign-in form
			// rather than its own dialog.
			writeError(w, http.StatusUnauthorized, "sign in: this console needs a token, or a user name and password")
			return
		}
		h(w, r, p)
	}
}

func (s *Server) principal(r *http.Request) (principal, bool) {
	if !s.authOn() {
		return principal{Role: control.RoleAdmin}, true
	}
	if h := r.Header.Get("Authorization"); h != "" {
		if tok, ok := strings.CutPrefix(h, "Bearer "); ok {
			return s.check("", "", tok)
		}
		if user, pass, ok := r.BasicAuth(); ok {
			return s.check(user, pass, "")
		}
		return principal{}, false
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		return s.sessions.get(c.Value)
	}
	return principal{}, false
}

// check finds the principal of a token or of a user name and password. Comparisons take
// constant time.
func (s *Server) check(user, pass, token string) (principal, bool) {
	if token != "" {
		if s.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.cfg.Token)) == 1 {
			return principal{User: "token", Role: control.RoleAdmin}, true
		}
		return principal{}, false
	}
	for _, u := range s.cfg.Users {
		nameOK := subtle.ConstantTimeCompare([]byte(user), []byte(u.Name)) == 1
		passOK := subtle.ConstantTimeCompare([]byte(pass), []byte(u.Password)) == 1
		if nameOK && passOK {
			return principal{User: u.Name, Role: u.Role}, true
		}
	}
	return principal{}, false
}

// sessionReply is the body of the session endpoints.
type sessionReply struct {
	principal
	// Auth says whether the console asks for credentials at all.
	Auth    bool   `json:"auth"`
	Version string `json:"version,omitempty"`
}

func (s *Server) whoami(w http.ResponseWriter, _ *http.Request, p principal) {
	writeJSON(w, http.StatusOK, sessionReply{principal: p, Auth: s.authOn(), Version: s.cfg.Version})
}

// signIn exchanges {"token"} or {"user","password"} for a session cookie.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) {
	if !s.authOn() {
		writeJSON(w, http.StatusOK, sessionReply{principal: principal{Role: control.RoleAdmin}, Version: s.cfg.Version})
		return
	}
	var req struct {
		Token    string `json:"token"`
		User     string `json:"user"`
		Password string `json:"password"`
	}
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sign in: the request must be {\"token\"} or {\"user\",\"password\"}: %v", err))
		return
	}
	p, ok := s.check(req.User, req.Password, req.Token)
	if !ok || (req.Token == "" && req.User == "") {
		s.log.Warn("console sign-in refused", "user", req.User, "remote", r.RemoteAddr)
		writeError(w, http.StatusUnauthorized, "sign in: wrong token, or wrong user name or password")
		return
	}
	id := s.sessions.add(p)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/api/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: int(s.cfg.SessionTTL.Seconds())})
	s.log.Info("console sign-in", "user", p.who(), "role", p.Role, "remote", r.RemoteAddr)
	writeJSON(w, http.StatusOK, sessionReply{principal: p, Auth: true, Version: s.cfg.Version})
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sessions.remove(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/api/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	w.WriteHeader(http.StatusNoContent)
}

// hostCheck refuses, when the console asks for no credentials, a request whose Host is not
// a loopback name or address: a page of another site that rebinds its DNS name to 127.0.0.1
// would otherwise be same-origin with the console.
func (s *Server) hostCheck(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authOn() && !loopbackHost(r.Host) {
			writeError(w, http.StatusForbidden, fmt.Sprintf("host %q refused: without credentials configured the console answers loopback names only", r.Host))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// sessions are the signed-in browsers, in memory: a restart signs everyone out.
type sessions struct {
	ttl time.Duration
	mu  sync.Mutex
	m   map[string]session
}

type session struct {
	p       principal
	expires time.Time
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, m: map[string]session{}}
}

func (ss *sessions) add(p principal) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	id := base64.RawURLEncoding.EncodeToString(b)
	now := time.Now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for k, v := range ss.m { // expired sessions go as new ones come
		if now.After(v.expires) {
			delete(ss.m, k)
		}
	}
	ss.m[id] = session{p: p, expires: now.Add(ss.ttl)}
	return id
}

func (ss *sessions) get(id string) (principal, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	v, ok := ss.m[id]
	if !ok || time.Now().After(v.expires) {
		return principal{}, false
	}
	return v.p, true
}

func (ss *sessions) remove(id string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, id)
}
