// Package dashboard serves a live, read-only page of an engine: a table of
// its resources with pass, block, success and exception per second, mean
// and minimum response time, requests in flight and the rules in force,
// and a chart of the last minutes of a selected resource, updated every
// second over Server-Sent Events.
//
//	http.Handle("/leapflow/", http.StripPrefix("/leapflow", dashboard.New(eng, dashboard.WithToken(secret))))
//
// Everything it serves is embedded (no CDN: it works offline) and it has
// no way to change anything: only GET. The figures are the engine's
// completed seconds (flow.Feed): each row shows a resource's latest
// completed second, a second or two behind the clock. The table holds the
// resources with rules and those that counted anything in the last minute,
// at most MaxRows of them, busiest first; the chart's history is kept in
// memory for the last HistorySeconds (bounded by MaxHistoryPoints in all),
// and can be seeded from a metric log at start (HistoryFile).
//
// Mount it on an internal port, or set Token (callers send
// "Authorization: Bearer <token>" or ?token=<token>; a page opened with
// ?token= gets it as a same-site, HTTP-only cookie for its own requests)
// or BasicAuth; credentials are compared in constant time (their SHA-256
// digests, so not even their length shows). Resource names are shown as
// text, never as markup, and the page's Content-Security-Policy allows no
// script but its own.
//
// Limits: at most MaxStreams event streams at once (default 64; 503
// beyond), each fed the latest tick only, so a viewer that reads slowly
// or not at all holds neither the engine, nor the feed, nor the other
// viewers (a stream no one reads is ended after 10 s); a request with a
// body is refused (413), one whose URL passes 2 KiB (414) or whose header
// fields pass 8 KiB in all (431) too (the server's MaxHeaderBytes bounds
// what it reads before that); only the embedded files and the API are
// served, never a path outside them.
package dashboard

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/breakers"
	"github.com/leapflow/leapflow/metriclog"
	"github.com/leapflow/leapflow/stat"
)

//go:embed assets
var assets embed.FS

// Option shapes a dashboard (see New).
type Option func(*config)

// config is a dashboard's options, defaults filled in.
type config struct {
	maxStreams                       int
	token                            string
	basicAuthUser, basicAuthPassword string
	basicAuth                        bool
	maxRows                          int
	historySeconds, maxHistoryPoints int
	historyFile                      string
}

// WithToken asks every request for token: "Authorization: Bearer <token>"
// or ?token=<token>.
func WithToken(token string) Option { return func(c *config) { c.token = token } }

// WithBasicAuth asks every request for user and password (HTTP basic
// authentication); both must be given.
func WithBasicAuth(user, password string) Option {
	return func(c *config) { c.basicAuth, c.basicAuthUser, c.basicAuthPassword = true, user, password }
}

// WithMaxStreams bounds the event streams open at once (default 64; at
// least 1): one more is answered 503.
func WithMaxStreams(n int) Option { return func(c *config) { c.maxStreams = n } }

// WithMaxRows bounds the table (default 500; at least 1).
func WithMaxRows(n int) Option { return func(c *config) { c.maxRows = n } }

// WithHistorySeconds sets how far back the chart goes (default 300; at
// least 1).
func WithHistorySeconds(n int) Option { return func(c *config) { c.historySeconds = n } }

// WithMaxHistoryPoints bounds the points kept for all resources together
// (default 200,000; at least 1): the oldest seconds go first.
func WithMaxHistoryPoints(n int) Option { return func(c *config) { c.maxHistoryPoints = n } }

// WithHistoryFile seeds the chart at start with the last history seconds
// of a metric log (metriclog) at path.
func WithHistoryFile(path string) Option { return func(c *config) { c.historyFile = path } }

// newConfig applies opts over the defaults and validates the result.
func newConfig(opts []Option) (config, error) {
	c := config{maxRows: 500, historySeconds: 300, maxHistoryPoints: 200_000, maxStreams: 64}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.maxStreams < 1:
		return c, fmt.Errorf("dashboard: WithMaxStreams must be >= 1, got %d", c.maxStreams)
	case c.maxRows < 1:
		return c, fmt.Errorf("dashboard: WithMaxRows must be >= 1, got %d", c.maxRows)
	case c.historySeconds < 1:
		return c, fmt.Errorf("dashboard: WithHistorySeconds must be >= 1, got %d", c.historySeconds)
	case c.maxHistoryPoints < 1:
		return c, fmt.Errorf("dashboard: WithMaxHistoryPoints must be >= 1, got %d", c.maxHistoryPoints)
	case c.basicAuth && (c.basicAuthUser == "" || c.basicAuthPassword == ""):
		return c, errors.New("dashboard: WithBasicAuth needs both a user and a password")
	}
	return c, nil
}

// Point is one resource's completed second, as the page gets it.
type Point struct {
	Time      int64   `json:"t"` // Unix milliseconds
	Pass      int64   `json:"pass"`
	Block     int64   `json:"block"`
	Success   int64   `json:"success"`
	Exception int64   `json:"exception"`
	AvgRT     float64 `json:"avgRT"` // milliseconds
	MinRT     float64 `json:"minRT"` // milliseconds
}

// Row is a line of the table.
type Row struct {
	Resource string `json:"resource"`
	Point
	Inflight int64  `json:"inflight"`
	Rules    string `json:"rules"`
	// Unreached is set when a rule of the resource cannot take effect as
	// named: the resource sees no request while a catch-all resource
	// (http:unmatched) does (flow.Engine.Unreached). The page shows a
	// badge.
	Unreached bool `json:"unreached,omitempty"`
	// Breaker is the state of the resource's circuit breakers
	// (Rule.Breaker): "closed", "open" or "half-open", the one that
	// refuses most where it has several; empty without one. The page
	// shows a badge. BreakerRetryMS is, when not closed, the milliseconds
	// until its next probe may go.
	Breaker        string `json:"breaker,omitempty"`
	BreakerRetryMS int64  `json:"breakerRetryMs,omitempty"`
	// System is set on a resource with system rules (Rule.System): the
	// CPU usage they read, the BBR estimate of how many requests may be
	// in flight, and whether a SystemBBR rule sheds. The page shows a
	// badge.
	System *System `json:"system,omitempty"`
}

// System is what a resource's system rules read (flow.SystemStatus).
type System struct {
	CPU      float64 `json:"cpu"`
	Limit    int64   `json:"limit"`
	Shedding bool    `json:"shedding"`
	Refusing bool    `json:"refusing"`
}

// Tick is what the page gets every second.
type Tick struct {
	Time int64 `json:"t"`
	Rows []Row `json:"rows"`
}

type server struct {
	eng  *flow.Engine
	opts config
	mux  *http.ServeMux

	mu sync.Mutex
	// latest is each resource's last completed second, and when it was
	// last active (engine seconds).
	latest map[string]Point
	// history holds the recent deliveries, oldest first.
	history [][]histPoint
	points  int
	tick    []byte // the latest tick, JSON
	clients map[chan []byte]struct{}
	// refusedStreams counts streams refused at MaxStreams (tests).
	refusedStreams atomic.Int64
}

type histPoint struct {
	resource string
	Point
}

// New returns the dashboard of eng. It subscribes to the engine's feed and
// starts it. It returns an error naming the option and value when one is
// bad.
func New(eng *flow.Engine, options ...Option) (http.Handler, error) {
	opts, err := newConfig(options)
	if err != nil {
		return nil, err
	}
	s := &server{eng: eng, opts: opts, latest: map[string]Point{}, clients: map[chan []byte]struct{}{}}
	if opts.historyFile != "" {
		if err := s.seed(opts.historyFile); err != nil {
			return nil, err
		}
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	s.mux = http.NewServeMux()
	s.mux.Handle("GET /", http.FileServerFS(static))
	s.mux.HandleFunc("GET /api/tick", s.serveTick)
	s.mux.HandleFunc("GET /api/events", s.serveEvents)
	s.mux.HandleFunc("GET /api/history", s.serveHistory)
	s.tick = s.buildTick(time.Now().UnixMilli())
	feed := eng.Feed()
	feed.Subscribe(s.add)
	feed.Start()
	return s, nil
}

// seed fills the history from a metric log.
func (s *server) seed(path string) error {
	since := time.Now().Add(-time.Duration(s.opts.historySeconds) * time.Second)
	var batch []histPoint
	var at time.Time
	err := metriclog.ReadFilesSkipBad(path, func(l metriclog.Line) error {
		if l.Time.Before(since) {
			return nil
		}
		if !l.Time.Equal(at) && len(batch) > 0 {
			s.keep(batch)
			batch = nil
		}
		at = l.Time
		batch = append(batch, histPoint{l.Resource, Point{Time: l.Time.UnixMilli(), Pass: l.Pass, Block: l.Block,
			Success: l.Success, Exception: l.Exception, AvgRT: float64(l.AvgRT) / 1e6}})
		return nil
	})
	if len(batch) > 0 {
		s.keep(batch)
	}
	if err != nil {
		return fmt.Errorf("dashboard: HistoryFile: %w", err)
	}
	return nil
}

// keep appends a delivery to the history, dropping the oldest beyond the
// bounds. Called with mu held, or before serving.
func (s *server) keep(batch []histPoint) {
	if len(batch) > s.opts.maxHistoryPoints {
		batch = batch[:s.opts.maxHistoryPoints] // one delivery larger than the whole bound
	}
	s.history = append(s.history, batch)
	s.points += len(batch)
	cutoff := batch[0].Time - int64(s.opts.historySeconds)*1000
	for len(s.history) > 1 && (s.points > s.opts.maxHistoryPoints || s.history[0][0].Time < cutoff) {
		s.points -= len(s.history[0])
		s.history[0] = nil
		s.history = s.history[1:]
	}
}

// add takes a delivery from the feed and tells the pages.
func (s *server) add(batch []stat.Second) {
	pts := make([]histPoint, 0, len(batch))
	for _, sec := range batch {
		p := Point{Time: sec.Time.UnixMilli(), Pass: sec.Pass, Block: sec.Block, Success: sec.Success,
			Exception: sec.Exception, MinRT: ms(sec.MinRT)}
		if sec.Success > 0 {
			p.AvgRT = ms(sec.RT) / float64(sec.Success)
		}
		pts = append(pts, histPoint{sec.Resource, p})
	}
	s.mu.Lock()
	for _, p := range pts {
		s.latest[p.resource] = p.Point
	}
	if len(pts) > 0 {
		s.keep(pts)
	}
	s.mu.Unlock()
	msg := s.buildTick(time.Now().UnixMilli())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick = msg
	for c := range s.clients {
		select { // only the latest matters: replace what the client did not take
		case <-c:
		default:
		}
		c <- msg
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// buildTick makes the table: resources with rules or a second in the last
// minute, busiest first, at most MaxRows.
func (s *server) buildTick(now int64) []byte {
	rules := map[string][]string{}
	for _, r := range s.eng.Rules() {
		if !r.DryRun {
			rules[r.Resource] = append(rules[r.Resource], r.String())
		}
	}
	for _, d := range s.eng.DryRuns() {
		rules[d.Rule.Resource] = append(rules[d.Rule.Resource],
			d.Rule.String()+": "+strconv.FormatInt(d.WouldBlock, 10)+" would block")
	}
	unreached := map[string]bool{}
	for _, r := range s.eng.Unreached() {
		unreached[r.Resource] = true
	}
	brk := map[string]flow.BreakerStatus{}
	for _, b := range s.eng.Breakers() {
		if cur, ok := brk[b.Rule.Resource]; !ok || breakers.Worse(b.State, cur.State) {
			brk[b.Rule.Resource] = b
		}
	}
	systems := map[string]*System{}
	for _, st := range s.eng.Systems() {
		systems[st.Resource] = &System{CPU: st.CPU, Limit: st.Limit, Shedding: st.Shedding, Refusing: st.Refusing}
	}
	s.mu.Lock()
	rows := make([]Row, 0, len(s.latest)+len(rules))
	for res, p := range s.latest {
		if now-p.Time > 60_000 && rules[res] == nil {
			delete(s.latest, res)
			continue
		}
		// A second is delivered a window after it ends and polled once a
		// second: the latest is up to 4 s old while traffic goes on.
		if now-p.Time > 5_000 {
			p = Point{Time: p.Time} // idle since: nothing per second now
		}
		rows = append(rows, Row{Resource: res, Point: p})
	}
	for res := range rules {
		if _, live := s.latest[res]; !live { // a resource with rules and no recent second
			rows = append(rows, Row{Resource: res})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(rows, func(a, b Row) int {
		if c := cmp.Compare(b.Pass+b.Block, a.Pass+a.Block); c != 0 {
			return c
		}
		return strings.Compare(a.Resource, b.Resource)
	})
	rows = rows[:min(len(rows), s.opts.maxRows)]
	for i := range rows {
		rows[i].Rules = strings.Join(rules[rows[i].Resource], "; ")
		rows[i].Unreached = unreached[rows[i].Resource]
		if b, ok := brk[rows[i].Resource]; ok {
			rows[i].Breaker = breakerWords[b.State]
			rows[i].BreakerRetryMS = b.RetryAfter.Milliseconds()
		}
		rows[i].System = systems[rows[i].Resource]
		if snap, ok := s.eng.Snapshot(rows[i].Resource); ok {
			rows[i].Inflight = snap.Inflight
		}
	}
	b, _ := json.Marshal(Tick{Time: now, Rows: rows})
	return b
}

// breakerWords names a breaker's state on the page.
var breakerWords = [...]string{flow.BreakerClosed: "closed", flow.BreakerOpen: "open", flow.BreakerHalfOpen: "half-open"}

// Request limits (see the package doc).
const (
	maxURL    = 2 << 10
	maxHeader = 8 << 10
)

// headerSize is the size of r's header fields as sent (names, values and
// their separators).
func headerSize(r *http.Request) int {
	n := 0
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// ServeHTTP checks access, then serves the page and its API.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.ContentLength != 0 || len(r.TransferEncoding) > 0:
		w.Header().Set("Connection", "close")
		http.Error(w, "a request body is not accepted", http.StatusRequestEntityTooLarge)
		return
	case len(r.RequestURI) > maxURL || len(r.URL.RawQuery) > maxURL:
		http.Error(w, "URL too long", http.StatusRequestURITooLong)
		return
	case headerSize(r) > maxHeader:
		http.Error(w, "header fields too large", http.StatusRequestHeaderFieldsTooLarge)
		return
	}
	if !s.allowed(w, r) {
		if s.opts.basicAuthUser != "" {
			w.Header().Set("WWW-Authenticate", `Basic realm="leapflow", charset="UTF-8"`)
		}
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// tokenCookie carries the token to the page's own requests (its script,
// its stream) once the page was opened with ?token=.
const tokenCookie = "leapflow_token"

func (s *server) allowed(w http.ResponseWriter, r *http.Request) bool {
	if s.opts.token != "" {
		tok, fromQuery := r.URL.Query().Get("token"), true
		if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			tok, fromQuery = v, false
		} else if c, err := r.Cookie(tokenCookie); err == nil && tok == "" {
			tok, fromQuery = c.Value, false
		}
		if !same(tok, s.opts.token) {
			return false
		}
		if fromQuery {
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: tok, HttpOnly: true, SameSite: http.SameSiteStrictMode})
		}
	}
	if s.opts.basicAuthUser != "" {
		u, p, ok := r.BasicAuth()
		if uOK, pOK := same(u, s.opts.basicAuthUser), same(p, s.opts.basicAuthPassword); !ok || !uOK || !pOK {
			return false
		}
	}
	return true
}

// same compares a credential sent with the one expected in constant time:
// their digests, so that neither the content nor the length shows.
func same(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

func (s *server) serveTick(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	msg := s.tick
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(msg)
}

// serveEvents streams a tick every second until the client goes away.
func (s *server) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	c := make(chan []byte, 1)
	s.mu.Lock()
	if len(s.clients) >= s.opts.maxStreams {
		s.mu.Unlock()
		s.refusedStreams.Add(1)
		w.Header().Set("Retry-After", "5")
		http.Error(w, "too many event streams", http.StatusServiceUnavailable)
		return
	}
	c <- s.tick
	s.clients[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.clients, c)
		s.mu.Unlock()
	}()
	for {
		select {
		case <-r.Context().Done():
			return
		case msg := <-c:
			// A client that stops reading without closing must not hold
			// the stream for ever.
			_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := fmt.Fprintf(w, "event: tick\ndata: %s\n\n", msg); err != nil {
				return
			}
			if err := rc.Flush(); err != nil {
				return
			}
		}
	}
}

// serveHistory answers a resource's points over the last HistorySeconds.
func (s *server) serveHistory(w http.ResponseWriter, r *http.Request) {
	res := r.URL.Query().Get("resource")
	out := []Point{}
	s.mu.Lock()
	for _, batch := range s.history {
		for _, p := range batch {
			if p.resource == res {
				out = append(out, p.Point)
			}
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
