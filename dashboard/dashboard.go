// Package dashboard serves a live, read-only page of an engine: a table of
// its resources with pass, block, success and exception per second, mean
// and minimum response time, requests in flight, the rules in force, a
// sparkline of pass and block over the last minute, and the state of
// their circuit breakers and system rules; charts of a selected
// resource's last minutes (traffic, and response times) on a time axis;
// each per-key rule's busiest keys (at most 50 rules, refusing most first);
// and the rule source's reloads. It is
// updated every second over Server-Sent Events.
//
//	http.Handle("/leapflow/", http.StripPrefix("/leapflow", dashboard.New(eng, dashboard.WithToken(secret))))
//
// Everything it serves is embedded (no CDN: it works offline) and it has
// no way to change anything: only GET. The figures are the engine's
// completed seconds (flow.Feed): each row shows a resource's latest
// completed second, a second or two behind the clock. The table holds the
// resources with rules and those that counted anything in the last minute,
// at most MaxRows of them, busiest first; the page filters and pages it.
// The charts' history is kept in memory for the last HistorySeconds
// (bounded by MaxHistoryPoints in all), starting with the minute the
// engine already holds (flow.Feed.SubscribeRecent), and can be seeded
// from a metric log at start (HistoryFile).
//
// The event stream sends the whole table once, then each second only the
// rows that changed (a resource with a new second, or whose state
// changed) and those that left; a viewer too slow to take a change gets
// the whole table again instead.
//
// Mount it on an internal port, or set Token (callers send
// "Authorization: Bearer <token>" or ?token=<token>; a page opened with
// ?token= gets it as a same-site, HTTP-only cookie for its own requests)
// or BasicAuth; credentials are compared in constant time (their SHA-256
// digests, so not even their length shows). Resource names and keys are
// shown as text, never as markup, and the page's Content-Security-Policy
// allows no script but its own.
//
// Limits: at most MaxStreams event streams at once (default 64; 503
// beyond), each fed the latest change only, so a viewer that reads slowly
// or not at all holds neither the engine, nor the feed, nor the other
// viewers (a stream no one reads is ended after 10 s); a request with a
// body is refused (413), one whose URL passes 2 KiB (414) or whose header
// fields pass 8 KiB in all (431) too (the server's MaxHeaderBytes bounds
// what it reads before that); only the embedded files and the API are
// served, never a path outside them.
package dashboard

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"reflect"
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
	reloader                         Reloader
}

// Reloader is what a rule source reports (rulefile.Sync has it).
type Reloader interface {
	Reloads() int64
	LastError() error
}

// WithReloads shows a rule source's reloads: how many, when the last was
// seen, and the latest error while the rules in force are older than the
// source.
func WithReloads(r Reloader) Option { return func(c *config) { c.reloader = r } }

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

// WithMaxRows bounds the table (default 2,000; at least 1).
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
	c := config{maxRows: 2000, historySeconds: 300, maxHistoryPoints: 200_000, maxStreams: 64}
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
	// BreakerSince is when the breaker last changed state (Unix ms; 0
	// before the dashboard's first delivered second, which maps engine
	// time to wall time).
	BreakerSince int64 `json:"breakerSince,omitempty"`
	// System is set on a resource with system rules (Rule.System): the
	// CPU usage they read, the BBR estimate of how many requests may be
	// in flight, and whether a SystemBBR rule sheds. The page shows a
	// badge.
	System *System `json:"system,omitempty"`
	// Spark is, in a whole table, the resource's pass and block per
	// second over the 60 s that end with the tick's SparkEnd, oldest
	// first.
	Spark *Spark `json:"spark,omitempty"`
	// New is, in a change, the seconds of the resource this delivery
	// brought.
	New []Point `json:"new,omitempty"`
}

// Spark is a minute of passes and blocks, one count a second.
type Spark struct {
	Pass  []int64 `json:"pass"`
	Block []int64 `json:"block"`
}

// sparkSeconds is how many seconds a sparkline covers.
const sparkSeconds = 60

// System is what a resource's system rules read (flow.SystemStatus).
type System struct {
	CPU      float64 `json:"cpu"`
	Limit    int64   `json:"limit"`
	Shedding bool    `json:"shedding"`
	Refusing bool    `json:"refusing"`
}

// Tick is what the page gets: the whole table (Full, from /api/tick and
// first on a stream), or each second what changed since the last.
type Tick struct {
	Time int64 `json:"t"`
	Full bool  `json:"full"`
	// SparkEnd is the start of the newest second delivered (Unix ms):
	// where sparklines end.
	SparkEnd int64 `json:"sparkEnd"`
	// Rows are every row (Full), or those that changed.
	Rows []Row `json:"rows"`
	// Gone are the resources that left the table since the last tick.
	Gone []string `json:"gone,omitempty"`
	// Keys are the per-key rules' busiest keys (flow.Engine.KeyStats), at
	// most maxKeyRules rules, those refusing most first; in a change, only
	// when they changed (nil: unchanged; empty: none now).
	Keys *[]KeyRule `json:"keys,omitempty"`
	// Reload is the rule source's state (WithReloads); in a change, only
	// when it changed.
	Reload *Reload `json:"reload,omitempty"`
}

// KeyRule is a per-key rule's keys (see flow.KeyStats).
type KeyRule struct {
	Resource  string     `json:"resource"`
	Rule      string     `json:"rule"`
	Tracked   int        `json:"tracked"`
	Capacity  int        `json:"capacity"`
	Evictions int64      `json:"evictions"`
	Passed    []KeyCount `json:"passed"`
	Refused   []KeyCount `json:"refused"`
}

// KeyCount is a key and its estimated count over the last minute.
type KeyCount struct {
	Key   string `json:"key"`
	Count int64  `json:"count"`
}

// Reload is what the rule source reports.
type Reload struct {
	Count int64 `json:"count"`
	// At is when the dashboard saw Count change (Unix ms; 0 before).
	At    int64  `json:"at,omitempty"`
	Error string `json:"error,omitempty"`
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
	// rows are the rows of the latest tick (without Spark or New), to
	// tell what the next one changes; keys and reload likewise.
	rows   map[string]Row
	keys   []byte
	reload Reload
	// seededTo is the newest second a history file seeded (Unix ms): the
	// feed's seconds up to it are not kept again.
	seededTo int64
	// sparkEnd is the newest second delivered (Unix ms); offsetMS maps
	// engine time (ms) to Unix ms, once a second was delivered.
	sparkEnd, offsetMS int64
	hasOffset          bool
	// full is the whole table as of the latest tick, JSON, made when
	// asked for (nil: not made yet).
	full []byte
	// clients are the open streams: each takes the latest change, or a
	// nil, which asks for the whole table.
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
	s := &server{eng: eng, opts: opts, latest: map[string]Point{}, rows: map[string]Row{}, clients: map[chan []byte]struct{}{}}
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
	feed := eng.Feed()
	feed.SubscribeRecent(s.add) // the minute the engine holds, then each delivery
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
		s.seededTo = max(s.seededTo, l.Time.UnixMilli())
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
		batch = batch[len(batch)-s.opts.maxHistoryPoints:] // one second larger than the whole bound
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

// add takes a delivery from the feed and tells the pages what changed.
func (s *server) add(batch []stat.Second) {
	pts := make([]histPoint, 0, len(batch))
	fresh := map[string][]Point{}
	for _, sec := range batch {
		p := Point{Time: sec.Time.UnixMilli(), Pass: sec.Pass, Block: sec.Block, Success: sec.Success,
			Exception: sec.Exception, MinRT: ms(sec.MinRT)}
		if sec.Success > 0 {
			p.AvgRT = ms(sec.RT) / float64(sec.Success)
		}
		pts = append(pts, histPoint{sec.Resource, p})
		fresh[sec.Resource] = append(fresh[sec.Resource], p)
	}
	s.mu.Lock()
	for _, p := range pts {
		if cur, ok := s.latest[p.resource]; !ok || p.Time >= cur.Time {
			s.latest[p.resource] = p.Point
		}
		s.sparkEnd = max(s.sparkEnd, p.Time)
	}
	if len(batch) > 0 {
		s.offsetMS, s.hasOffset = batch[0].Time.UnixMilli()-batch[0].Start/1e6, true
	}
	// A delivery holds a second or a few (a late subscriber's first, the
	// minute): kept a second at a time, and none a history file seeded.
	for lo := 0; lo < len(pts); {
		hi := lo + 1
		for hi < len(pts) && pts[hi].Time == pts[lo].Time {
			hi++
		}
		if pts[lo].Time > s.seededTo {
			s.keep(pts[lo:hi:hi])
		}
		lo = hi
	}
	s.mu.Unlock()
	msg := s.change(time.Now().UnixMilli(), fresh)
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.clients {
		select { // a change the client did not take: it needs the whole table
		case <-c:
			c <- nil
		default:
			c <- msg
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// change makes the rows anew and returns the tick of what changed since
// the last (JSON); the whole table is made again when asked for.
func (s *server) change(now int64, fresh map[string][]Point) []byte {
	rows := s.buildRows(now)
	keys := s.keyRules()
	keysJSON, _ := json.Marshal(keys)
	reload := s.readReload(now)
	s.mu.Lock()
	defer s.mu.Unlock()
	tick := Tick{Time: now, SparkEnd: s.sparkEnd, Rows: []Row{}}
	seen := make(map[string]bool, len(rows))
	for _, r := range rows {
		seen[r.Resource] = true
		prev, ok := s.rows[r.Resource]
		if ok && sameRow(prev, r) && len(fresh[r.Resource]) == 0 {
			continue
		}
		s.rows[r.Resource] = r
		r.New = fresh[r.Resource]
		tick.Rows = append(tick.Rows, r)
	}
	for res := range s.rows {
		if !seen[res] {
			delete(s.rows, res)
			tick.Gone = append(tick.Gone, res)
		}
	}
	slices.Sort(tick.Gone)
	if !bytes.Equal(keysJSON, s.keys) {
		s.keys, tick.Keys = keysJSON, &keys
	}
	if reload != s.reload {
		s.reload = reload
		tick.Reload = &reload
	}
	s.full = nil
	b, _ := json.Marshal(tick)
	return b
}

// sameRow reports whether a row shows the same as before.
func sameRow(a, b Row) bool {
	if (a.System == nil) != (b.System == nil) || a.System != nil && *a.System != *b.System {
		return false
	}
	a.System, b.System = nil, nil
	a.Spark, b.Spark, a.New, b.New = nil, nil, nil, nil
	return reflect.DeepEqual(a, b)
}

// wholeTable returns the whole table as of the latest tick, JSON, made
// once per tick. Called with mu held.
func (s *server) wholeTable() []byte {
	if s.full != nil {
		return s.full
	}
	tick := Tick{Time: time.Now().UnixMilli(), Full: true, SparkEnd: s.sparkEnd, Rows: make([]Row, 0, len(s.rows))}
	sparks := s.sparks()
	for _, r := range s.rows {
		r.Spark = sparks[r.Resource]
		if r.Spark == nil {
			r.Spark = &Spark{Pass: make([]int64, sparkSeconds), Block: make([]int64, sparkSeconds)}
		}
		tick.Rows = append(tick.Rows, r)
	}
	slices.SortFunc(tick.Rows, busiestFirst)
	keys := []KeyRule{}
	_ = json.Unmarshal(s.keys, &keys)
	tick.Keys = &keys
	if s.opts.reloader != nil {
		r := s.reload
		tick.Reload = &r
	}
	s.full, _ = json.Marshal(tick)
	return s.full
}

// sparks is each resource's minute up to sparkEnd, from the history.
// Called with mu held.
func (s *server) sparks() map[string]*Spark {
	out := map[string]*Spark{}
	lo := s.sparkEnd - (sparkSeconds-1)*1000
	for i := len(s.history) - 1; i >= 0; i-- {
		batch := s.history[i]
		if len(batch) > 0 && batch[len(batch)-1].Time < lo {
			break // older deliveries are older still
		}
		for _, p := range batch {
			if p.Time < lo || p.Time > s.sparkEnd {
				continue
			}
			sp := out[p.resource]
			if sp == nil {
				sp = &Spark{Pass: make([]int64, sparkSeconds), Block: make([]int64, sparkSeconds)}
				out[p.resource] = sp
			}
			j := (p.Time - lo) / 1000
			sp.Pass[j] += p.Pass
			sp.Block[j] += p.Block
		}
	}
	return out
}

// busiestFirst orders rows by pass and block, then by name.
func busiestFirst(a, b Row) int {
	if c := cmp.Compare(b.Pass+b.Block, a.Pass+a.Block); c != 0 {
		return c
	}
	return strings.Compare(a.Resource, b.Resource)
}

// maxKeyRules bounds the per-key rules the page shows.
const maxKeyRules = 50

// keyRules reads the per-key rules' keys: at most maxKeyRules rules,
// those refusing most first.
func (s *server) keyRules() []KeyRule {
	out := []KeyRule{}
	for _, ks := range s.eng.KeyStats() {
		kr := KeyRule{Resource: ks.Rule.Resource, Rule: ks.Rule.Name(), Tracked: ks.Tracked, Capacity: ks.Capacity,
			Evictions: ks.Evictions, Passed: []KeyCount{}, Refused: []KeyCount{}}
		for _, c := range ks.Passed {
			kr.Passed = append(kr.Passed, KeyCount(c))
		}
		for _, c := range ks.Refused {
			kr.Refused = append(kr.Refused, KeyCount(c))
		}
		out = append(out, kr)
	}
	refused := func(k KeyRule) (n int64) {
		for _, c := range k.Refused {
			n += c.Count
		}
		return n
	}
	slices.SortStableFunc(out, func(a, b KeyRule) int { return cmp.Compare(refused(b), refused(a)) })
	return out[:min(len(out), maxKeyRules)]
}

// readReload reads the rule source's state: At moves when Count does.
func (s *server) readReload(now int64) Reload {
	r := s.opts.reloader
	if r == nil {
		return Reload{}
	}
	s.mu.Lock()
	out := s.reload
	s.mu.Unlock()
	if n := r.Reloads(); n != out.Count {
		out.Count, out.At = n, now
	}
	out.Error = ""
	if err := r.LastError(); err != nil {
		out.Error = err.Error()
	}
	return out
}

// buildRows makes the table: resources with rules or a second in the last
// minute, busiest first, at most MaxRows.
func (s *server) buildRows(now int64) []Row {
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
	offset, hasOffset := s.offsetMS, s.hasOffset
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
	slices.SortFunc(rows, busiestFirst)
	rows = rows[:min(len(rows), s.opts.maxRows)]
	for i := range rows {
		rows[i].Rules = strings.Join(rules[rows[i].Resource], "; ")
		rows[i].Unreached = unreached[rows[i].Resource]
		if b, ok := brk[rows[i].Resource]; ok {
			rows[i].Breaker = breakerWords[b.State]
			rows[i].BreakerRetryMS = b.RetryAfter.Milliseconds()
			if hasOffset {
				rows[i].BreakerSince = b.Since.Milliseconds() + offset
			}
		}
		rows[i].System = systems[rows[i].Resource]
		if snap, ok := s.eng.Snapshot(rows[i].Resource); ok {
			rows[i].Inflight = snap.Inflight
		}
	}
	return rows
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
	msg := s.wholeTable()
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(msg)
}

// serveEvents streams the whole table, then each second's change, until
// the client goes away.
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
	c <- nil // the whole table first
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
			if msg == nil {
				s.mu.Lock()
				msg = s.wholeTable()
				s.mu.Unlock()
			}
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
