// Package httpflow puts leapflow in front of net/http handlers: each request
// enters a resource (by default its ServeMux route pattern), optionally
// under a caller key for PerKey rules; a blocked request gets 429 Too Many
// Requests with Retry-After and the IETF RateLimit fields (503 Service
// Unavailable when a circuit breaker refused it); 5xx responses and
// panics are counted as exceptions, the failures a circuit breaker
// counts (WithExceptions chooses the statuses).
//
//	mux := http.NewServeMux()
//	mux.Handle("GET /items/{id}", items)
//	handler := httpflow.New(eng, httpflow.WithMux(mux), httpflow.WithKey(httpflow.ClientIP())).Middleware(mux)
//
// # Naming
//
// A request's resource is the pattern of the route that serves it, as
// registered ("GET /items/{id}", or "/items/{id}" for a route of any
// method), however the muxes nest:
//   - Wrap a mux: Middleware(mux) asks the mux for the pattern
//     (mux.Handler(r)) before it runs, which matches the route a second
//     time (a few hundred nanoseconds for a small mux); where its pattern
//     leads to another ServeMux (top.Handle("/api/", api)), that mux's
//     pattern, and so on. WithMux(mux) does the same for a middleware that
//     wraps something else in front of mux. An outer mux's pattern
//     (Request.Pattern, "/" for top.Handle("/", mw(mux))) never names the
//     request when the inner mux is known.
//   - Wrap each route: mux.Handle("GET /items/{id}", mw(items)); the
//     middleware then runs after the match and reads Request.Pattern, the
//     innermost mux's.
//
// A mux behind http.StripPrefix cannot be seen into: register the inner
// routes with their full paths (ServeMux patterns can), or wrap the inner
// mux itself. chi, gin, echo and fiber have adapters of their own (see
// docs/routers.md), which name requests the same way: the method, a
// space, and the route's pattern.
//
// A request no pattern matches enters the resource Unmatched. While
// requests go there, a rule whose resource sees none cannot take effect
// as named (flow.Engine.Unreached): the Limiter logs each such rule once
// (WithLogger), checking at most every 10 s. WithResource
// names requests by any function; MethodPath names them by method and
// path, which is only safe where paths are few: every distinct name is a
// resource, and the registry refuses new ones past its cap. A request whose
// resource cannot be made (the registry is full) is let through, counted
// in Stats.FailedOpen, unless WithFailClosed.
//
// # Blocked
//
// The default block handler answers 429 Too Many Requests (503 Service
// Unavailable for a circuit breaker, and for a Concurrency rule with
// WithConcurrency503), with:
//   - Retry-After: the seconds, rounded up and at least 1, until the rule
//     would admit the request (QPS Reject rules: until enough of the window
//     has left it; Throttle: until its slot is within the queue), when the
//     rule can say (a circuit breaker: until its next probe);
//   - RateLimit-Policy and RateLimit as defined by
//     draft-ietf-httpapi-ratelimit-headers-09 (structured-field Lists of one
//     item named after the rule, with q and w; r and t). The draft counts
//     windows and resets in whole seconds: a window shorter than a second
//     is given as its quota per second, rounded down, over w=1, and t is
//     rounded up.
//
// WithHeadersOnAdmit sets the RateLimit fields on admitted responses too:
// RateLimit-Policy and RateLimit (r and t) of the rule with the least left
// for the caller after the request (flow.Engine.Left: window, PerKey
// window and GCRA rules; it costs about another admission), or, on a
// resource where none of those is, RateLimit-Policy of its strictest QPS
// rule (Engine.Policy). WithBlockHandler replaces the whole answer.
//
// # Cost
//
// On the HTTP/1 server an admitted request allocates nothing in the
// middleware: its writer gets a pooled wrapper with exactly the optional
// interfaces the server's has (Flusher, Hijacker, io.ReaderFrom, ...,
// and Unwrap for http.ResponseController). Other writers (HTTP/2, other
// middleware's) are wrapped by github.com/felixge/httpsnoop, which keeps
// whatever interfaces they have, at a few allocations. A handler must not
// use its writer after it returns (net/http's own rule): the wrapper goes
// back to the pool.
package httpflow

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/felixge/httpsnoop"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/callerkey"
	"github.com/leapflow/leapflow/internal/unreached"
)

// Unmatched is the resource of requests no ServeMux pattern matched.
const Unmatched = "http:unmatched"

// Blocked is what a block handler is told about a blocked request.
type Blocked = flow.Refusal

// Options.
type config struct {
	resource    func(*http.Request) string
	mux         *http.ServeMux
	key         func(*http.Request) string
	block       func(http.ResponseWriter, *http.Request, Blocked)
	conc503     bool
	onAdmit     bool
	failClosed  bool
	isException func(status int) bool
	logger      *slog.Logger
}

// Option configures a Middleware.
type Option func(*config)

// WithResource names each request's resource (default: its route pattern).
func WithResource(fn func(*http.Request) string) Option {
	return func(c *config) { c.resource = fn }
}

// WithMux makes a middleware around mux name requests by the pattern mux
// will route them to (see the package doc for the cost).
func WithMux(mux *http.ServeMux) Option { return func(c *config) { c.mux = mux } }

// WithKey names each request's caller for PerKey rules ("" for none): see
// ClientIP and Header.
func WithKey(fn func(*http.Request) string) Option { return func(c *config) { c.key = fn } }

// WithBlockHandler replaces the answer to a blocked request.
func WithBlockHandler(fn func(http.ResponseWriter, *http.Request, Blocked)) Option {
	return func(c *config) { c.block = fn }
}

// WithConcurrency503 answers requests a Concurrency rule blocked with 503
// Service Unavailable instead of 429.
func WithConcurrency503() Option { return func(c *config) { c.conc503 = true } }

// WithHeadersOnAdmit sets the RateLimit fields on admitted responses too
// (see the package doc).
func WithHeadersOnAdmit() Option { return func(c *config) { c.onAdmit = true } }

// WithFailClosed answers 503 to a request whose resource cannot be made
// (a full registry) instead of letting it through.
func WithFailClosed() Option { return func(c *config) { c.failClosed = true } }

// WithExceptions decides which response statuses count as exceptions,
// the failures circuit breakers count (default: 500 and above).
func WithExceptions(fn func(status int) bool) Option {
	return func(c *config) { c.isException = fn }
}

// WithLogger sets where the Limiter logs rules that cannot take effect
// (see the package doc; default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// MethodPath names a request by its method and path: for few, known
// paths only (see the package doc).
func MethodPath(r *http.Request) string { return r.Method + " " + r.URL.Path }

// Limiter admits HTTP requests through an engine: Middleware and Handler
// wrap handlers so that each request enters the engine first, and Stats
// counts what it did besides admitting and blocking. It is safe for
// simultaneous use; one Limiter may wrap any number of handlers.
type Limiter struct {
	eng *flow.Engine
	cfg config
	// failedOpen and failedClosed back Stats.
	failedOpen, failedClosed atomic.Int64
	unreached                *unreached.Reporter
}

// New returns a Limiter on eng.
func New(eng *flow.Engine, opts ...Option) *Limiter {
	m := &Limiter{eng: eng}
	for _, o := range opts {
		if o != nil {
			o(&m.cfg)
		}
	}
	if m.cfg.block == nil {
		m.cfg.block = m.defaultBlock
	}
	if m.cfg.isException == nil {
		m.cfg.isException = func(status int) bool { return status >= 500 }
	}
	m.unreached = unreached.New(eng, m.cfg.logger, Unmatched)
	return m
}

// Middleware wraps next so that each request enters the engine first,
// under the resource WithResource (or the request's pattern) names.
func (m *Limiter) Middleware(next http.Handler) http.Handler {
	mux := m.cfg.mux
	if inner, ok := next.(*http.ServeMux); ok && mux == nil {
		mux = inner
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next, m.name(r, mux)) })
}

// Handler wraps h under the resource named resource.
func (m *Limiter) Handler(resource string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, h, resource) })
}

// Stats counts what a Limiter did besides admitting and blocking.
type Stats struct {
	// FailedOpen counts requests let through because their resource could
	// not be made; FailedClosed those answered 503 for it.
	FailedOpen, FailedClosed int64
}

// Stats returns the Limiter's counts so far.
func (m *Limiter) Stats() Stats {
	return Stats{FailedOpen: m.failedOpen.Load(), FailedClosed: m.failedClosed.Load()}
}

// name is the resource of r, a request mux (nil: none known) will serve.
func (m *Limiter) name(r *http.Request, mux *http.ServeMux) string {
	if m.cfg.resource != nil {
		return m.cfg.resource(r)
	}
	if mux != nil {
		return routePattern(mux, r)
	}
	if r.Pattern != "" {
		return r.Pattern
	}
	return Unmatched
}

// routePattern returns the pattern of the route mux serves r by, looking
// into each ServeMux a pattern leads to (at most 8 deep), or Unmatched
// when none matches.
func routePattern(mux *http.ServeMux, r *http.Request) string {
	for range 8 {
		h, pattern := mux.Handler(r)
		if pattern == "" || r.Method == http.MethodConnect && !strings.HasPrefix(pattern, http.MethodConnect+" ") {
			// A CONNECT request that no CONNECT pattern matches: for one
			// that would be redirected, ServeMux gives the path itself as
			// the pattern, a name per request.
			return Unmatched
		}
		inner, ok := h.(*http.ServeMux)
		if !ok {
			return pattern
		}
		mux = inner
	}
	return Unmatched
}

// errStatus is the exception of a response with a status counted as one.
type errStatus int

func (e errStatus) Error() string { return "httpflow: response status " + strconv.Itoa(int(e)) }

// errPanic is the exception of a handler that panicked.
var errPanic = errors.New("httpflow: handler panicked")

func (m *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler, resource string) {
	opts := [2]flow.EntryOption{flow.WithContext(r.Context())}
	n := 1
	if m.cfg.key != nil {
		if key := m.cfg.key(r); key != "" {
			// A key from the request is bounded: longer than 256 bytes,
			// it is its start and a hash (callerkey.Bound).
			opts[1] = flow.WithKey(callerkey.Bound(key))
			n = 2
		}
	}
	en, err := m.eng.Entry(resource, opts[:n]...)
	if resource == Unmatched {
		// Counted: the engine sees the unmatched traffic it reports on.
		m.unreached.Check()
	}
	if err != nil {
		var be *flow.BlockError
		switch {
		case errors.As(err, &be):
			m.cfg.block(w, r, en.Refusal())
			return
		case r.Context().Err() != nil:
			// The wait ended with the request's context (the client went
			// away, or a server deadline passed): never an empty 200.
			m.failedClosed.Inc()
			http.Error(w, "request ended while queued", http.StatusServiceUnavailable)
			return
		case m.cfg.failClosed:
			m.failedClosed.Inc()
			http.Error(w, "rate limiter unavailable", http.StatusServiceUnavailable)
			return
		}
		// The resource could not be made (a full registry) or the key
		// was refused: let the request through, counted.
		m.failedOpen.Inc()
		next.ServeHTTP(w, r)
		return
	}
	if m.cfg.onAdmit {
		m.admitHeaders(w.Header(), resource, opts[:n])
	}
	tr := trackers.Get().(*tracker)
	tr.status, tr.sent = http.StatusOK, false
	var ww http.ResponseWriter
	if isHTTP1(w) {
		tr.w = w
		ww = (*http1Writer)(tr)
	} else {
		ww = httpsnoop.Wrap(w, *tr.snoopHooks())
	}
	defer func() {
		status := tr.status
		tr.w, tr.next, tr.nextWrite, tr.nextFlush, tr.nextReadFrom = nil, nil, nil, nil, nil
		trackers.Put(tr)
		if v := recover(); v != nil {
			en.Exit(errPanic)
			panic(v)
		}
		if m.cfg.isException(status) {
			en.Exit(errStatus(status))
			return
		}
		en.Exit(nil)
	}()
	next.ServeHTTP(ww, r)
}

// tracker records a response's status: as the HTTP/1 server's writer's
// wrapper (http1Writer), or through httpsnoop's WriteHeader and Write
// hooks for any other writer. Trackers are pooled, and each keeps its
// hooks and the functions they return, made once: an HTTP/1 request
// allocates nothing in the middleware, any other adds only httpsnoop's
// wrapper.
type tracker struct {
	w         http.ResponseWriter // under an http1Writer
	status    int
	sent      bool // the final status went out (a header or a first Write)
	next      httpsnoop.WriteHeaderFunc
	nextWrite httpsnoop.WriteFunc
	header    httpsnoop.WriteHeaderFunc
	write     httpsnoop.WriteFunc
	// Flush and ReadFrom send the status too (200 if none was set).
	nextFlush    httpsnoop.FlushFunc
	nextReadFrom httpsnoop.ReadFromFunc
	flush        httpsnoop.FlushFunc
	readFrom     httpsnoop.ReadFromFunc
	hooks        *httpsnoop.Hooks // made on first use (snoopHooks)
}

var trackers = sync.Pool{New: func() any { return &tracker{} }}

// snoopHooks returns the tracker's httpsnoop hooks, made on its first
// request through httpsnoop (an HTTP/1 server never needs them).
func (tr *tracker) snoopHooks() *httpsnoop.Hooks {
	if tr.hooks != nil {
		return tr.hooks
	}
	tr.header = func(code int) {
		// Only the first final status counts, as only it goes out.
		if !tr.sent && code >= 200 {
			tr.status, tr.sent = code, true
		}
		tr.next(code)
	}
	tr.write = func(b []byte) (int, error) {
		tr.sent = true // a Write with no header sends 200
		return tr.nextWrite(b)
	}
	tr.flush = func() {
		tr.sent = true
		tr.nextFlush()
	}
	tr.readFrom = func(r io.Reader) (int64, error) {
		tr.sent = true
		return tr.nextReadFrom(r)
	}
	tr.hooks = &httpsnoop.Hooks{
		WriteHeader: func(next httpsnoop.WriteHeaderFunc) httpsnoop.WriteHeaderFunc {
			tr.next = next
			return tr.header
		},
		Write: func(next httpsnoop.WriteFunc) httpsnoop.WriteFunc {
			tr.nextWrite = next
			return tr.write
		},
		Flush: func(next httpsnoop.FlushFunc) httpsnoop.FlushFunc {
			tr.nextFlush = next
			return tr.flush
		},
		ReadFrom: func(next httpsnoop.ReadFromFunc) httpsnoop.ReadFromFunc {
			tr.nextReadFrom = next
			return tr.readFrom
		},
	}
	return tr.hooks
}

// defaultBlock answers 429 (or 503) with Retry-After and the RateLimit
// fields.
func (m *Limiter) defaultBlock(w http.ResponseWriter, _ *http.Request, b Blocked) {
	status, fields := RefusalFields(b, m.cfg.conc503)
	h := w.Header()
	for _, f := range fields {
		h.Set(f[0], f[1])
	}
	http.Error(w, http.StatusText(status), status)
}

// admitHeaders sets the RateLimit fields of an admitted request of
// resource with opts: RateLimit-Policy and RateLimit of the rule with the
// least left for it (flow.Engine.Left), or, when none is read, the
// RateLimit-Policy of the strictest QPS rule.
func (m *Limiter) admitHeaders(h http.Header, resource string, opts []flow.EntryOption) {
	l, ok := m.eng.Left(resource, opts...)
	if !ok {
		m.policyHeader(h, resource)
		return
	}
	quota, window := l.Err.Quota()
	name := policyName(l.Err)
	q, win := policyQuota(quota, window)
	h.Set("RateLimit-Policy", policyField(name, q, win))
	h.Set("RateLimit", name+";r="+strconv.FormatInt(min(l.Remaining, q), 10)+";t="+strconv.FormatInt(ceilSeconds(l.Reset), 10))
}

// policyHeader sets RateLimit-Policy for an admitted request of resource,
// from the resource's strictest QPS rule in force.
func (m *Limiter) policyHeader(h http.Header, resource string) {
	name, quota, window, ok := m.eng.Policy(resource)
	if !ok {
		return
	}
	q, win := policyQuota(quota, window)
	h.Set("RateLimit-Policy", policyField(sfString(name), q, win))
}

// policyField is a RateLimit-Policy value.
func policyField(name string, q, w int64) string {
	b := make([]byte, 0, len(name)+48)
	b = append(b, name...)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, q, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, w, 10)
	return string(b)
}

// policyQuota expresses quota per window in whole seconds (the draft's
// w): a window shorter than a second as its quota per second.
func policyQuota(quota int64, window time.Duration) (q, w int64) {
	if window >= time.Second {
		return quota, ceilSeconds(window)
	}
	return int64(float64(quota) * float64(time.Second) / float64(window)), 1
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

func policyName(be *flow.BlockError) string { return sfString(be.Rule.Name()) }

// sfString is s as a structured-field String: quoted, with '"' and '\'
// escaped; other characters outside printable ASCII are dropped (the
// field cannot carry them).
func sfString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c >= 0x20 && c < 0x7f:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
