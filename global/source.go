package global

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/stat"
)

// Options configures a Source. Zero values pick the documented defaults.
type Options struct {
	// Buckets is the number of buckets per window (default 10).
	Buckets int
	// MaxBatch is the most tokens one call leases (default 100,000; 1
	// turns leasing off: one round trip per request). Leases start at 100,
	// double while an instance spends a whole lease within one bucket and
	// halve when most of one goes unspent (see the package doc).
	MaxBatch int64
	// Timeout bounds each Redis call (default 50 ms).
	Timeout time.Duration
	// ExactBelow makes limits of at most this many admissions per window
	// use the exact sliding log (default 0: never).
	ExactBelow int64
	// Backoff is the first pause after a failure (default 50 ms); it
	// doubles up to MaxBackoff (default 5 s).
	Backoff, MaxBackoff time.Duration
	// Prefix starts every key (default "leapflow").
	Prefix string
	// Clock times leases; it must never read behind real time by more
	// than ClockSlack, which is taken off every lease (defaults
	// stat.NewMonotonic() and 2 ms). A coarse clock lags by its tick and
	// more under load: it would spend leases late.
	Clock      stat.Clock
	ClockSlack time.Duration
	// OnAdmit, if set, is called for every admission with the start of
	// the server bucket it was counted in (for audits and tests; it runs
	// on the request path and must be fast).
	OnAdmit func(bucket time.Time, n int64)
}

func (o Options) withDefaults() Options {
	if o.Buckets == 0 {
		o.Buckets = 10
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = 100_000
	}
	if o.Timeout == 0 {
		o.Timeout = 50 * time.Millisecond
	}
	if o.Backoff == 0 {
		o.Backoff = 50 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 5 * time.Second
	}
	if o.Prefix == "" {
		o.Prefix = "leapflow"
	}
	if o.Clock == nil {
		o.Clock = stat.NewMonotonic()
	}
	if o.ClockSlack == 0 {
		o.ClockSlack = 2 * time.Millisecond
	}
	return o
}

func (o Options) validate() error {
	switch {
	case o.Buckets < 1 || o.Buckets > 1000:
		return fmt.Errorf("global: Buckets must be in [1, 1000], got %d", o.Buckets)
	case o.MaxBatch < 1:
		return fmt.Errorf("global: MaxBatch must be >= 1, got %d", o.MaxBatch)
	case o.Timeout < 0:
		return fmt.Errorf("global: Timeout must be > 0, got %v", o.Timeout)
	case o.ExactBelow < 0:
		return fmt.Errorf("global: ExactBelow must be >= 0, got %d", o.ExactBelow)
	case o.Backoff < 0 || o.MaxBackoff < o.Backoff:
		return fmt.Errorf("global: Backoff must be in [0, MaxBackoff], got %v (MaxBackoff %v)", o.Backoff, o.MaxBackoff)
	case o.ClockSlack < 0:
		return fmt.Errorf("global: ClockSlack must be >= 0, got %v", o.ClockSlack)
	case strings.ContainsAny(o.Prefix, "{}"):
		// A brace would make the prefix the hash tag of every key: every
		// limit in one slot of a cluster.
		return fmt.Errorf("global: Prefix must not contain '{' or '}', got %q", o.Prefix)
	}
	return nil
}

// ErrUnavailable is returned while the Source backs off a failing Redis.
var ErrUnavailable = errors.New("global: redis unavailable (backing off)")

// Source is a flow.TokenSource on Redis. It is safe for simultaneous use.
type Source struct {
	client redis.UniversalClient
	opts   Options
	limits sync.Map // limitID -> *limit

	failures  atomic.Int64
	downUntil atomic.Int64 // clock reading before which calls are refused
	probing   atomic.Bool

	calls, errs, refused, leased, returned atomic.Int64

	// id names this instance in the IDs of its calls, seq numbers them.
	id  string
	seq atomic.Int64

	// bgMu guards closed and adding to bg, the background refills.
	bgMu   sync.Mutex
	closed atomic.Bool
	bg     sync.WaitGroup
}

// ErrClosed is returned by a Source after Close (the rule's fallback
// applies).
var ErrClosed = errors.New("global: source closed")

// Close stops the Source: it waits for the background refills it started
// and makes every later call that would reach Redis fail with ErrClosed.
// Leases already held are still spent. It does not close the client.
func (s *Source) Close() error {
	s.bgMu.Lock()
	s.closed.Store(true)
	s.bgMu.Unlock()
	s.bg.Wait()
	return nil
}

// goRefill runs a background refill unless the Source is closed.
func (s *Source) goRefill(fn func()) bool {
	s.bgMu.Lock()
	defer s.bgMu.Unlock()
	if s.closed.Load() {
		return false
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer func() {
			// A panic in a user hook (Options.Clock) must not take the
			// process down from a goroutine no caller owns: count it as a
			// failed call.
			if recover() != nil {
				s.fail()
			}
		}()
		fn()
	}()
	return true
}

// New returns a Source on client. It returns an error naming the field and
// value when an option is invalid.
func New(client redis.UniversalClient, opts Options) (*Source, error) {
	if client == nil {
		return nil, errors.New("global: client must not be nil")
	}
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("global: an instance ID: %w", err)
	}
	return &Source{client: client, opts: opts, id: hex.EncodeToString(id[:]) + "-"}, nil
}

// keySchema versions the layout of a limit's keys. Instances on different
// versions count in different keys: during a rolling upgrade that changes
// it, each side enforces the full limit on its own (up to twice it in all)
// until the upgrade completes.
const keySchema = "v2"

// serverStep is the smallest step back of the server clock that a limit's
// time absorbs (µs; see scriptTime).
const serverStep = 100_000

// limitID identifies one limit's shape.
type limitID struct {
	key      string
	limit    int64
	interval time.Duration
}

// limit is the state of one limit in this instance: its keys and the
// current lease.
type limit struct {
	keys   keys
	window int64 // µs
	exact  bool
	mu     sync.Mutex // one synchronous refill at a time per limit
	// leases holds one lease per stripe (P): admissions from a lease
	// touch only their own P's cache line.
	leases []paddedLease
	mask   int
	// prefetching is set while a background refill runs; batch is the
	// lease size asked for next.
	prefetching atomic.Bool
	batch       atomic.Int64
	// backMu guards back: tokens of leases replaced by a lease of a later
	// bucket before they expired, to give back with the next call.
	backMu sync.Mutex
	back   []giveBack
	// closedUntil is when the window, full at the last refusal, first has
	// room again (the Source's clock); requests before then are refused
	// without a round trip.
	closedUntil atomic.Int64
}

// giveBackLater queues g for the next call.
func (l *limit) giveBackLater(g giveBack) {
	l.backMu.Lock()
	l.back = append(l.back, g)
	l.backMu.Unlock()
}

// initialBatch is the first lease size of a limit: at most one call per
// 100 admissions from the start.
const initialBatch = 100

type paddedLease struct {
	atomic.Pointer[lease]
	_ [cpu.CacheLine - 8]byte
}

// lease is a batch of tokens counted in one server bucket, to be spent
// before deadline (the Source's clock).
type lease struct {
	left     atomic.Int64
	deadline int64
	bucket   time.Time
	// size (every token put in it, top-ups included) and installed (the
	// Source's clock) let a prefetch judge whether the lease will run out
	// before its deadline.
	size      atomic.Int64
	installed int64
}

// short reports whether, spent at the pace it has been so far, the lease
// runs out before its deadline: only then is the next one worth fetching
// within this bucket (tokens fetched and not spent stay counted in the
// server window).
func (l *lease) short(now int64) bool {
	left := l.left.Load()
	used, elapsed := l.size.Load()-left, now-l.installed
	if used <= 0 || elapsed <= 0 {
		return false
	}
	return used*(l.deadline-now) > left*elapsed
}

func (l *lease) take(now, n int64) bool {
	if l == nil || now >= l.deadline {
		return false
	}
	for {
		left := l.left.Load()
		if left < n {
			return false
		}
		if l.left.CompareAndSwap(left, left-n) {
			return true
		}
	}
}

// perWindow is a rule's threshold as admissions per window.
func perWindow(req flow.GlobalRequest) int64 {
	return int64(math.Floor(req.Threshold * req.Interval.Seconds()))
}

func (s *Source) limitFor(req flow.GlobalRequest) *limit {
	id := limitID{key: req.Key, limit: perWindow(req), interval: req.Interval}
	if l, ok := s.limits.Load(id); ok {
		return l.(*limit)
	}
	// The key names the limit and the layout of its data, never its
	// threshold: instances that disagree on the threshold share the limit
	// (the smaller applies; see scriptThreshold).
	shape := keySchema + "/" + strconv.FormatInt(req.Interval.Milliseconds(), 10) + "ms"
	exact := id.limit <= s.opts.ExactBelow
	if exact {
		shape += "/log"
	} else {
		shape += "/" + strconv.Itoa(s.opts.Buckets)
	}
	nl := &limit{
		keys:   keysFor(s.opts.Prefix, req.Key, shape),
		window: req.Interval.Microseconds(),
		exact:  exact,
	}
	nl.batch.Store(min(initialBatch, s.opts.MaxBatch))
	stripes := cpu.Stripes()
	nl.leases, nl.mask = make([]paddedLease, stripes), stripes-1
	l, _ := s.limits.LoadOrStore(id, nl)
	return l.(*limit)
}

// decision is one answer of the Redis script.
type decision struct {
	Allowed    bool
	Granted    int64         // tokens counted for the caller (>= the request when allowed)
	Count      int64         // in the window after the call
	Remaining  int64         // threshold minus Count
	RetryAfter time.Duration // when refused: until enough leaves the window (-1: never)
	ServerTime time.Time
	// BucketStart and BucketLen place the bucket the tokens were counted in
	// on the server clock.
	BucketStart time.Time
	BucketLen   time.Duration
}

// takeFor asks Redis once, with no leasing, for n admissions of the limit of
// req (maxLease tokens at most, at least n).
func (s *Source) takeFor(ctx context.Context, req flow.GlobalRequest, maxLease int64) (decision, error) {
	return s.take(ctx, s.limitFor(req), perWindow(req), req.Count, max(maxLease, req.Count))
}

func (s *Source) take(ctx context.Context, l *limit, threshold, n, maxLease int64) (decision, error) {
	back := s.unspent(l, s.opts.Clock.Now())
	d, err := s.takeAs(ctx, s.id+strconv.FormatInt(s.seq.Inc(), 36), l, threshold, n, maxLease, back)
	if err == nil {
		for _, g := range back {
			s.returned.Add(g.n)
		}
	}
	// On an error the tokens are not given back (the call may have run,
	// and a retry under a new ID would give them back twice): they stay
	// counted, at most a window.
	return d, err
}

// giveBack is tokens leased in one server bucket and never spent.
type giveBack struct {
	bucket int64 // µs, the limit's time
	n      int64
}

// unspent collects the tokens of l's leases whose deadline passed before
// they were spent: they go back to their server buckets with the next
// call. A take that raced the collection finds the lease empty (its
// deadline had passed anyway).
func (s *Source) unspent(l *limit, now int64) []giveBack {
	l.backMu.Lock()
	back := l.back
	l.back = nil
	l.backMu.Unlock()
	for i := range l.leases {
		ls := l.leases[i].Load()
		if ls == nil || now < ls.deadline || ls.left.Load() <= 0 {
			continue
		}
		if n := ls.left.Swap(0); n > 0 {
			back = append(back, giveBack{bucket: ls.bucket.UnixMicro(), n: n})
		}
	}
	return back
}

// takeAs is take for the call named id: a call that runs again with the
// same id (a retry after a lost reply) gets the first answer and counts
// nothing more.
func (s *Source) takeAs(ctx context.Context, id string, l *limit, threshold, n, maxLease int64, back []giveBack) (decision, error) {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	s.calls.Inc()
	ttl := 2*l.window/1000 + 1000
	replyTTL := max(int64(time.Second), 2*int64(s.opts.Timeout)) / int64(time.Millisecond)
	var cmd *redis.Cmd
	if l.exact {
		cmd = logScript.Run(ctx, s.client, []string{l.keys.log, l.keys.meta, l.keys.reply + id}, threshold, l.window, n, ttl, serverStep, replyTTL)
	} else {
		args := []any{threshold, l.window, s.opts.Buckets, n, maxLease, ttl, serverStep, replyTTL}
		for _, g := range back {
			args = append(args, strconv.FormatInt(g.bucket, 10), g.n)
		}
		cmd = windowScript.Run(ctx, s.client, []string{l.keys.window, l.keys.reply + id}, args...)
	}
	vals, err := cmd.Int64Slice()
	if err != nil {
		return decision{}, fmt.Errorf("global: %w", err)
	}
	if len(vals) != 7 {
		return decision{}, fmt.Errorf("global: script returned %d values, want 7", len(vals))
	}
	d := decision{
		Allowed:     vals[0] > 0,
		Granted:     vals[0],
		Count:       vals[1],
		Remaining:   vals[2],
		RetryAfter:  time.Duration(vals[3]) * time.Microsecond,
		ServerTime:  time.UnixMicro(vals[4]),
		BucketStart: time.UnixMicro(vals[5]),
		BucketLen:   time.Duration(vals[6]) * time.Microsecond,
	}
	if vals[3] < 0 {
		d.RetryAfter = -1
	}
	return d, nil
}

// Acquire implements flow.TokenSource: it admits req.Count from the current
// lease if it can, else asks Redis. When a lease runs low, one goroutine
// fetches the next in the background, so a busy instance rarely waits for
// Redis at all.
func (s *Source) Acquire(ctx context.Context, req flow.GlobalRequest) (bool, error) {
	return s.acquire(ctx, s.limitFor(req), &req, req.Count)
}

// Bind implements flow.Binder: the limit of req is resolved once, when the
// rules are loaded.
func (s *Source) Bind(req flow.GlobalRequest) flow.BoundSource {
	return &bound{s: s, l: s.limitFor(req), req: req}
}

type bound struct {
	s   *Source
	l   *limit
	req flow.GlobalRequest
}

func (b *bound) Acquire(ctx context.Context, n int64) (bool, error) {
	return b.s.acquire(ctx, b.l, &b.req, n)
}

// acquire is Acquire for limit l; req is read only when Redis is asked.
func (s *Source) acquire(ctx context.Context, l *limit, req *flow.GlobalRequest, n int64) (bool, error) {
	now := s.opts.Clock.Now()
	slot := &l.leases[cpu.Pin()&l.mask]
	if ls := slot.Load(); ls.take(now, n) {
		s.admitted(ls.bucket, n)
		if ls.left.Load() < ls.size.Load()/4 && ls.short(now) && l.prefetching.CompareAndSwap(false, true) {
			r := *req
			if !s.goRefill(func() { s.prefetch(l, slot, r) }) {
				l.prefetching.Store(false)
			}
		}
		return true, nil
	}
	// Before asking Redis, take from another P's lease: tokens a P leased
	// and stopped using would otherwise crowd the window until they expire.
	for i := range l.leases {
		if ls := l.leases[i].Load(); ls.take(now, n) {
			s.admitted(ls.bucket, n)
			return true, nil
		}
	}
	if now < l.closedUntil.Load() {
		// Redis said the window is full until then: no need to ask again.
		return false, nil
	}
	if until := s.downUntil.Load(); until != 0 && now < until {
		// Backing off: do not even queue for the refill.
		s.refused.Inc()
		return false, ErrUnavailable
	}
	leasing := !l.exact && s.opts.MaxBatch > 1
	if leasing {
		// One refill at a time: the others wait for its lease.
		l.mu.Lock()
		defer l.mu.Unlock()
	}
	// Another goroutine may have refilled, or failed, while we waited.
	sent := s.opts.Clock.Now()
	if ls := slot.Load(); ls.take(sent, n) {
		s.admitted(ls.bucket, n)
		return true, nil
	}
	if err := s.admit(); err != nil {
		return false, err
	}
	maxLease := n
	if leasing {
		maxLease = max(n, l.batch.Load())
	}
	d, err := s.take(ctx, l, perWindow(*req), n, maxLease)
	if err != nil {
		if ctx.Err() != nil {
			// The caller gave up; that says nothing about Redis.
			s.probing.Store(false)
			return false, err
		}
		s.fail()
		return false, err
	}
	s.succeed()
	if !d.Allowed {
		if d.RetryAfter > 0 {
			// Nothing leaves the window before then (server time, read
			// after we sent): refuse locally until sent + RetryAfter.
			l.closedUntil.Store(sent + int64(d.RetryAfter))
		}
		return false, nil
	}
	s.install(l, slot, d, d.Granted-n, sent)
	s.admitted(d.BucketStart, n)
	return true, nil
}

// prefetch leases the next batch before the current one runs out.
func (s *Source) prefetch(l *limit, slot *paddedLease, req flow.GlobalRequest) {
	defer l.prefetching.Store(false)
	if s.admit() != nil {
		return
	}
	sent := s.opts.Clock.Now()
	d, err := s.take(context.Background(), l, perWindow(req), 1, l.batch.Load())
	if err != nil {
		s.fail()
		return
	}
	s.succeed()
	if d.Allowed {
		s.install(l, slot, d, d.Granted, sent)
	}
}

// install makes extra tokens of decision d spendable until their server
// bucket ends, timed from when the call was sent (the server read its clock
// after that). Tokens of the bucket the current lease is in join it. The
// batch doubles when a whole lease was spent within one bucket and halves
// when a bucket ended with most of one unspent.
func (s *Source) install(l *limit, slot *paddedLease, d decision, extra, sent int64) {
	if extra <= 0 {
		return
	}
	deadline := sent + int64(d.BucketStart.Add(d.BucketLen).Sub(d.ServerTime)) - int64(s.opts.ClockSlack)
	if deadline <= s.opts.Clock.Now() {
		// The bucket ends before they could be spent (the call came in its
		// last moments): give them back with the next call.
		l.giveBackLater(giveBack{bucket: d.BucketStart.UnixMicro(), n: extra})
		return
	}
	s.leased.Add(extra)
	old := slot.Load()
	batch := l.batch.Load()
	switch {
	case old != nil && old.bucket.Equal(d.BucketStart):
		// Another lease within the same bucket: the last was nearly spent.
		// size first, so that the pace short reads never counts the new
		// tokens as spent.
		old.size.Add(extra)
		old.left.Add(extra)
		l.batch.Store(min(batch*2, s.opts.MaxBatch))
		return
	case old != nil && old.left.Load() > batch/2:
		l.batch.Store(max(batch/2, 1))
	}
	if old != nil && old.bucket.Before(d.BucketStart) {
		// Replaced before its deadline (the call that leased the new one
		// was sent in the old bucket): give its tokens back too.
		if n := old.left.Swap(0); n > 0 {
			l.giveBackLater(giveBack{bucket: old.bucket.UnixMicro(), n: n})
		}
	}
	nl := &lease{deadline: deadline, bucket: d.BucketStart, installed: s.opts.Clock.Now()}
	nl.size.Store(extra)
	nl.left.Store(extra)
	slot.Store(nl)
}

func (s *Source) admitted(bucket time.Time, n int64) {
	if s.opts.OnAdmit != nil {
		s.opts.OnAdmit(bucket, n)
	}
}

// admit returns ErrUnavailable while backing off; once the backoff ends it
// lets one caller through to probe.
func (s *Source) admit() error {
	if s.closed.Load() {
		return ErrClosed
	}
	until := s.downUntil.Load()
	if until == 0 {
		return nil
	}
	if s.opts.Clock.Now() < until || !s.probing.CompareAndSwap(false, true) {
		s.refused.Inc()
		return ErrUnavailable
	}
	return nil
}

func (s *Source) fail() {
	s.errs.Inc()
	f := s.failures.Inc()
	backoff := s.opts.Backoff << min(f-1, 30)
	if backoff > s.opts.MaxBackoff || backoff <= 0 {
		backoff = s.opts.MaxBackoff
	}
	s.downUntil.Store(s.opts.Clock.Now() + int64(backoff))
	s.probing.Store(false)
}

func (s *Source) succeed() {
	if s.downUntil.Load() != 0 || s.failures.Load() != 0 {
		s.failures.Store(0)
		s.downUntil.Store(0)
	}
	s.probing.Store(false)
}

// Stats counts what a Source has done.
type Stats struct {
	Calls   int64 // round trips to Redis
	Errors  int64 // calls that failed (timeouts included)
	Refused int64 // requests answered ErrUnavailable while backing off
	Leased  int64 // tokens leased beyond the requests that asked
	// Returned counts leased tokens given back unspent to their server
	// bucket.
	Returned int64
}

// Stats returns the counts so far.
func (s *Source) Stats() Stats {
	return Stats{Calls: s.calls.Load(), Errors: s.errs.Load(), Refused: s.refused.Load(), Leased: s.leased.Load(), Returned: s.returned.Load()}
}

var (
	_ flow.TokenSource = (*Source)(nil)
	_ flow.Binder      = (*Source)(nil)
)
