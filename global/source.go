package global

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/maypok86/otter/v2"
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
	// MaxBatch is the most tokens one call leases beyond what the waiting
	// requests ask (default 100,000; 1 turns leasing off: each call asks
	// only for the requests waiting on it). Leases start at 4, double
	// while an instance spends a whole lease within one bucket and halve
	// when most of one goes unspent (see the package doc).
	MaxBatch int64
	// Timeout is the most a request waits for Redis to decide (default
	// 100 ms). A request still undecided then is refused (Stats.Late),
	// not failed over: a late reply is not evidence that Redis is down.
	// The defaults support a Redis up to 50 ms away (round trip).
	Timeout time.Duration
	// CallTimeout bounds each Redis call, which runs apart from the
	// requests waiting on it (default 1 s, at least Timeout): a reply
	// later than Timeout still installs its lease and counts as a
	// success, and a connection is dialled within it.
	CallTimeout time.Duration
	// FailAfter is how many calls of a limit in a row must fail before
	// the Source backs off Redis for it and its rules' fallbacks apply
	// (default 2).
	FailAfter int
	// ExactBelow makes limits of at most this many admissions per window
	// use the exact sliding log (default 0: never).
	ExactBelow int64
	// Backoff is how long the Source stays off Redis before one call
	// probes it (default 100 ms); it doubles after every FailAfter probes
	// that fail, up to MaxBackoff (default 5 s).
	Backoff, MaxBackoff time.Duration
	// PresenceTTL is how long an instance's presence in a limit lasts
	// (default 1 s); it is renewed every third of that while Redis
	// answers, for the limits of rules with FallbackLocal. Once it lapses
	// the other instances keep the rule's LocalShare of the threshold
	// (up to half the threshold for all lapsed instances together) from
	// what they admit, for up to PresenceHold (default 10 s), since the
	// instance may be admitting it on its own (see the package doc).
	PresenceTTL, PresenceHold time.Duration
	// Prefix starts every key (default "leapflow").
	Prefix string
	// MaxKeys is the most callers' limits of PerKey rules the Source
	// keeps at once (default 100,000; about 600 bytes each): a caller's
	// limit evicted loses only its lease, and is made again when seen.
	MaxKeys int
	// Clock times leases; it must never read behind real time by more
	// than ClockSlack, which is taken off every lease (defaults
	// stat.NewMonotonic() and 2 ms). A coarse clock lags by its tick and
	// more under load: it would spend leases late.
	Clock      stat.Clock
	ClockSlack time.Duration
	// OnAdmit, if set, is called for every admission with the start of
	// the server bucket it was counted in, or for a GCRA rule the server
	// time of the decision (for audits and tests; it runs on the request
	// path and must be fast).
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
		o.Timeout = 100 * time.Millisecond
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = max(time.Second, o.Timeout)
	}
	if o.FailAfter == 0 {
		o.FailAfter = 2
	}
	if o.Backoff == 0 {
		o.Backoff = 100 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(5*time.Second, o.Backoff)
	}
	if o.PresenceTTL == 0 {
		o.PresenceTTL = time.Second
	}
	if o.PresenceHold == 0 {
		o.PresenceHold = max(10*time.Second, o.PresenceTTL)
	}
	if o.MaxKeys == 0 {
		o.MaxKeys = 100_000
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
	case o.CallTimeout < o.Timeout:
		return fmt.Errorf("global: CallTimeout must be at least Timeout (%v), got %v", o.Timeout, o.CallTimeout)
	case o.FailAfter < 1 || o.FailAfter > 1000:
		return fmt.Errorf("global: FailAfter must be in [1, 1000], got %d", o.FailAfter)
	case o.ExactBelow < 0:
		return fmt.Errorf("global: ExactBelow must be >= 0, got %d", o.ExactBelow)
	case o.Backoff < 0 || o.MaxBackoff < o.Backoff:
		return fmt.Errorf("global: Backoff must be in [0, MaxBackoff], got %v (MaxBackoff %v)", o.Backoff, o.MaxBackoff)
	case o.PresenceTTL < 10*time.Millisecond:
		return fmt.Errorf("global: PresenceTTL must be at least 10ms, got %v", o.PresenceTTL)
	case o.PresenceHold < o.PresenceTTL:
		return fmt.Errorf("global: PresenceHold must be at least PresenceTTL (%v), got %v", o.PresenceTTL, o.PresenceHold)
	case o.ClockSlack < 0:
		return fmt.Errorf("global: ClockSlack must be >= 0, got %v", o.ClockSlack)
	case o.MaxKeys < 1 || o.MaxKeys > 1<<24:
		return fmt.Errorf("global: MaxKeys must be in [1, 2^24], got %d", o.MaxKeys)
	case strings.ContainsAny(o.Prefix, "{}"):
		// A brace would make the prefix the hash tag of every key: every
		// limit in one slot of a cluster.
		return fmt.Errorf("global: Prefix must not contain '{' or '}', got %q", o.Prefix)
	}
	return nil
}

// health is a limit's health (in a Redis Cluster a limit fails with its
// node): calls and probes failed in a row, the clock reading before which
// calls are refused (0: healthy), and whether a probe is out.
type health struct {
	failures, probeFails, downUntil atomic.Int64
	probing                         atomic.Bool
}

// ErrUnavailable is returned while the Source backs off a failing Redis.
var ErrUnavailable = errors.New("global: redis unavailable (backing off)")

// Source is a flow.TokenSource on Redis. It is safe for simultaneous use.
type Source struct {
	client redis.UniversalClient
	opts   Options
	limits sync.Map // limitID -> *limit
	gcras  sync.Map // a GCRA rule's key -> *gcraLimit

	calls, errs, refused, late, leased, returned atomic.Int64
	// keyed holds the callers' limits of PerKey rules, bounded.
	keyed    *otter.Cache[keyLimitID, *limit]
	presence sync.Once
	// renewMu serialises renewals of presence and the leave at Close.
	renewMu sync.Mutex
	// mostInFlight is the most calls one limit had out at once (tests).
	mostInFlight atomic.Int64

	// id names this instance in the IDs of its calls, seq numbers them.
	id  string
	seq atomic.Int64

	// ctx is every call's parent: Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	// bgMu guards closed and adding to bg, the calls in flight.
	bgMu   sync.Mutex
	closed atomic.Bool
	bg     sync.WaitGroup
}

// errClosed ends the calls of a closed Source.
var errClosed = errors.New("global: source closed")

// Close stops the Source: it cancels the calls in flight, waits for them,
// and takes this instance's presence away. Leases already held are still
// spent; every other request is refused (Stats.Refused): a closed Source
// can neither count an admission nor keep a fallback's share from the
// others. It does not close the client.
func (s *Source) Close() error {
	s.bgMu.Lock()
	s.closed.Store(true)
	s.bgMu.Unlock()
	s.cancel()
	s.bg.Wait()
	s.leave()
	return nil
}

// goCall runs fn, a call to Redis, in the background unless the Source is
// closed.
func (s *Source) goCall(fn func()) bool {
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
			// process down from a goroutine no caller owns (fly counts it
			// as a failed call).
			_ = recover()
		}()
		fn()
	}()
	return true
}

// New returns a Source on client. It returns an error naming the field and
// value when an option is invalid. It loads the scripts in the background,
// which also dials a first connection before any request waits for one.
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
	s := &Source{client: client, opts: opts, id: hex.EncodeToString(id[:]) + "-"}
	s.keyed = newKeyedLimits(opts.MaxKeys)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.goCall(func() {
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.CallTimeout)
		defer cancel()
		_ = windowScript.Load(ctx, s.client).Err()
		_ = logScript.Load(ctx, s.client).Err()
		_ = gcraScript.Load(ctx, s.client).Err()
	})
	return s, nil
}

// keySchema versions the layout of a limit's keys. Instances on different
// versions count in different keys: during a rolling upgrade that changes
// it, each side enforces the full limit on its own (up to twice it in all)
// until the upgrade completes.
const keySchema = "v2"

// serverStep is the smallest step back of the server clock that a limit's
// time absorbs (µs; see scriptTime).
const serverStep = 100_000

// limitID identifies a limit and the layout of its keys; the threshold is
// an argument of each call.
type limitID struct {
	key      string
	interval time.Duration
	exact    bool
	span     bool // span-exact (a window of one bucket more); never with exact
}

// limit is the state of one limit in this instance: its keys, its leases
// and its calls.
type limit struct {
	keys   keys
	window int64 // µs
	exact  bool
	// span is set for a span-exact rule's limit: the script counts
	// Buckets+1 buckets of window/Buckets.
	span bool
	// leases holds one lease per stripe (P): admissions from a lease
	// touch only their own P's cache line.
	leases []paddedLease
	mask   int
	// cur is the limit's newest call: in flight, gathering requests for
	// when the one in flight ends, or done (see flight).
	cur      atomic.Pointer[flight]
	inFlight atomic.Int64
	// batch is the lease size asked for next.
	batch atomic.Int64
	// backMu guards back and reserves, touched only by calls: tokens of
	// leases replaced before they expired, and calls whose requests may
	// not have claimed all they asked for, to give back with the next
	// call.
	backMu   sync.Mutex
	back     []giveBack
	reserves []*flight
	// closed is when the window, full at the last refusal, first has room
	// again for a request of need (the Source's clock): such requests
	// before then are refused without a round trip.
	closed atomic.Pointer[closedWindow]
	// binds counts the live bound sources of l (see Bind); bound is set
	// once it has had one.
	binds atomic.Int64
	bound atomic.Bool
	// present is set while this instance's presence is in the hash
	// (guarded by the Source's renewMu).
	present bool
	// share is what this instance admits per window on its own while it
	// falls back (FallbackLocal): its presence is kept while it is > 0.
	share atomic.Int64
	// health is the limit's own, or for a caller's limit of a PerKey
	// rule, the rule's (shared by its keys).
	*health
	// perKey is set on a caller's limit of a PerKey rule: it leases only
	// once hot (see perkey.go).
	perKey bool
	calls  callCount
	// nodes holds, for a PerKey rule's limit in a Redis Cluster, the
	// health of its keys on each master (address -> *health).
	nodes sync.Map
	// fellBack is set when a request of this limit got an error (its
	// rule's fallback applied) and cleared by the limit's next renewal of
	// presence, which then keeps this instance's share from the others
	// for a window. It is per limit: a failing limit must not take the
	// shares of healthy ones.
	fellBack atomic.Bool
}

// closedWindow is a full window: requests of need or more are refused
// until until.
type closedWindow struct{ until, need int64 }

// full reports whether a request for n is refused without a round trip.
func (l *limit) full(now, n int64) bool {
	c := l.closed.Load()
	return c != nil && now < c.until && n >= c.need
}

// hash is the key of the limit's hash that holds presence.
func (l *limit) hash() string {
	if l.exact {
		return l.keys.meta
	}
	return l.keys.window
}

// giveBackLater queues g for the next call.
func (l *limit) giveBackLater(g giveBack) {
	l.backMu.Lock()
	l.back = append(l.back, g)
	l.backMu.Unlock()
}

// initialBatch is the first lease size of a limit. It starts small, so
// that instances that see little of the traffic lease little (with 16
// instances and one hot, a first lease of 100 kept an eighth of the window
// away from the others); a busy instance doubles it with every top-up
// within a bucket.
const initialBatch = 4

// perWindow is a rule's threshold as admissions per window.
func perWindow(req flow.GlobalRequest) int64 {
	return int64(math.Floor(req.Threshold * req.Interval.Seconds()))
}

func (s *Source) limitFor(req flow.GlobalRequest) *limit {
	exact := perWindow(req) <= s.opts.ExactBelow
	// A sliding log is exact in every span already.
	id := limitID{key: req.Key, interval: req.Interval, exact: exact, span: req.SpanExact && !exact}
	l, ok := s.limits.Load(id)
	if !ok {
		l = s.newLimit(id, req)
	}
	return l.(*limit)
}

// keepShare records what this instance admits per window of l on its own
// while it falls back (the latest rule's), and starts renewing its
// presence.
func (s *Source) keepShare(l *limit, req flow.GlobalRequest) {
	share := int64(math.Floor(req.Threshold * req.LocalShare * req.Interval.Seconds()))
	if l.share.Swap(share) != share && share > 0 {
		s.presence.Do(func() { s.goCall(s.renewPresence) })
	}
}

func (s *Source) newLimit(id limitID, req flow.GlobalRequest) any {
	// The key names the limit and the layout of its data, never its
	// threshold: instances that disagree on the threshold share the limit
	// (the smaller applies; see scriptThreshold).
	shape := keySchema + "/" + strconv.FormatInt(req.Interval.Milliseconds(), 10) + "ms"
	exact := id.exact
	switch {
	case exact:
		shape += "/log"
	case id.span:
		shape += "/" + strconv.Itoa(s.opts.Buckets) + "+1"
	default:
		shape += "/" + strconv.Itoa(s.opts.Buckets)
	}
	nl := &limit{
		keys:   keysFor(s.opts.Prefix, req.Key, shape),
		window: req.Interval.Microseconds(),
		exact:  exact,
		span:   id.span,
		health: &health{},
	}
	nl.batch.Store(min(initialBatch, s.opts.MaxBatch))
	stripes := cpu.Stripes()
	nl.leases, nl.mask = make([]paddedLease, stripes), stripes-1
	l, _ := s.limits.LoadOrStore(id, nl)
	return l
}

// leasing reports whether calls for l lease tokens beyond their requests.
func (s *Source) leasing(l *limit) bool {
	return !l.exact && s.opts.MaxBatch > 1 && (!l.perKey || l.calls.hot())
}

// Acquire implements flow.TokenSource: it admits req.Count from a lease if
// it can, else waits for a call to Redis. When a lease runs low, the next
// is fetched in the background, so a busy instance rarely waits at all.
func (s *Source) Acquire(ctx context.Context, req flow.GlobalRequest) (bool, error) {
	if req.GCRA {
		if req.PerKey {
			return false, errPerKeyGCRA
		}
		return s.acquireGCRA(ctx, s.gcraBoundFor(req), req.Count)
	}
	if req.PerKey {
		return s.acquire(ctx, s.keyLimit(s.limitFor(req), &req, req.Caller), &req, req.Count)
	}
	l := s.limitFor(req)
	if req.LocalShare > 0 && !l.bound.Load() {
		s.keepShare(l, req)
	}
	return s.acquire(ctx, l, &req, req.Count)
}

// Bind implements flow.Binder: the limit of req is resolved once, when the
// rules are loaded.
// When the flow engine drops the rule (a reload) and the bound source is
// collected, the limit stops renewing this instance's presence.
//
// A GCRA rule (req.GCRA) binds to its bucket, which keeps no presence:
// see the package doc.
func (s *Source) Bind(req flow.GlobalRequest) flow.BoundSource {
	if req.GCRA {
		b := s.gcraBoundFor(req)
		if req.PerKey {
			b.err = errPerKeyGCRA
		}
		return b
	}
	if req.PerKey {
		return &keyedBound{s: s, parent: s.limitFor(req), req: req}
	}
	l := s.limitFor(req)
	b := &bound{s: s, l: l, req: req}
	l.binds.Inc()
	l.bound.Store(true)
	runtime.AddCleanup(b, func(l *limit) { l.binds.Dec() }, l)
	s.keepShare(l, req)
	return b
}

type bound struct {
	s   *Source
	l   *limit
	req flow.GlobalRequest
}

func (b *bound) Acquire(ctx context.Context, n int64) (bool, error) {
	return b.s.acquire(ctx, b.l, &b.req, n)
}

// RetryIn implements flow.RetryHinter.
func (b *bound) RetryIn(n int64) (time.Duration, bool) { return b.s.retryIn(b.l, n) }

// retryIn is how long until l's window has room for n, as Redis last said
// when it refused (its retry-after, counted from when the call was sent):
// false when no refusal of n or less is in force.
func (s *Source) retryIn(l *limit, n int64) (time.Duration, bool) {
	c := l.closed.Load()
	now := s.opts.Clock.Now()
	if c == nil || now >= c.until || n < c.need {
		return 0, false
	}
	return time.Duration(c.until - now), true
}

// acquire is Acquire for limit l; req is read only when Redis is asked.
func (s *Source) acquire(ctx context.Context, l *limit, req *flow.GlobalRequest, n int64) (bool, error) {
	now := s.opts.Clock.Now()
	p := cpu.Pin() & l.mask
	if ls := l.leases[p].Load(); ls.take(now, n) {
		s.admitted(ls.bucket, n)
		if ls.left.Load() < ls.size.Load()/4 && ls.short(now) {
			s.prefetch(l, p, req)
		}
		return true, nil
	}
	if s.takeAny(l, now, n) {
		return true, nil
	}
	if l.full(now, n) {
		// Redis said the window is full until then: no need to ask again.
		return false, nil
	}
	if n > perWindow(*req) {
		// More than the threshold: never admitted.
		return false, nil
	}
	if s.closed.Load() {
		s.refused.Inc()
		return false, nil
	}
	if until := l.downUntil.Load(); until != 0 {
		// Backing off: requests fall back at once, and once the backoff
		// ends a call probes Redis in the background.
		if now >= until && !l.probing.Load() {
			s.prefetch(l, p, req)
		}
		s.refused.Inc()
		l.fellBack.Store(true)
		return false, ErrUnavailable
	}
	ok, err := s.wait(ctx, l, p, req, n, now+int64(s.opts.Timeout))
	if err != nil && ctx.Err() == nil {
		l.fellBack.Store(true)
	}
	return ok, err
}

// takeAny takes n from any of l's leases: tokens a P leased and stopped
// using would otherwise crowd the window until they expire.
func (s *Source) takeAny(l *limit, now, n int64) bool {
	for i := range l.leases {
		if ls := l.leases[i].Load(); ls.take(now, n) {
			s.admitted(ls.bucket, n)
			return true
		}
	}
	return false
}

// wait joins the limit's next call and waits for its answer until
// deadline (the Source's clock), then takes from what it brought; it
// joins the following call while the window has room and time is left.
// It never waits on a lock: a request that finds a call in flight joins
// the one after it, which leaves as soon as the first is answered and
// asks for every request that joined it.
func (s *Source) wait(ctx context.Context, l *limit, p int, req *flow.GlobalRequest, n, deadline int64) (bool, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		f := s.join(l, p, req, n)
		select {
		case <-f.done:
		default:
			left := time.Duration(deadline - s.opts.Clock.Now())
			if left <= 0 {
				f.withdraw(n)
				s.late.Inc()
				return false, nil
			}
			if timer == nil {
				timer = time.NewTimer(left)
			} else {
				timer.Reset(left)
			}
			select {
			case <-f.done:
			case <-ctx.Done():
				f.withdraw(n)
				return false, ctx.Err()
			case <-timer.C:
				select {
				case <-f.done: // answered as the timer fired: use it
				default:
					f.withdraw(n)
					s.late.Inc()
					return false, nil
				}
			}
		}
		if f.err == errClosed {
			s.refused.Inc()
			return false, nil
		}
		if f.err != nil {
			return false, f.err
		}
		now := s.opts.Clock.Now()
		if f.claim(now, n) {
			s.admitted(f.bucket, n)
			return true, nil
		}
		if s.takeAny(l, now, n) {
			return true, nil
		}
		if f.refused || l.full(now, n) {
			return false, nil
		}
		if now >= deadline {
			s.late.Inc()
			return false, nil
		}
	}
}

// join adds n to what the limit's next call asks for, starting that call
// if there is none, and returns it.
func (s *Source) join(l *limit, p int, req *flow.GlobalRequest, n int64) *flight {
	for {
		f := l.cur.Load()
		if f != nil && f.add(n) {
			return f
		}
		nf := newFlight(f, n)
		if l.cur.CompareAndSwap(f, nf) {
			s.launch(l, nf, p, *req)
			return nf
		}
	}
}

// prefetch starts a call that asks for no request, only a lease, unless
// one is already out or gathering.
func (s *Source) prefetch(l *limit, p int, req *flow.GlobalRequest) {
	if s.closed.Load() {
		return
	}
	f := l.cur.Load()
	if f != nil && !f.ended.Load() {
		return
	}
	if nf := newFlight(f, 0); l.cur.CompareAndSwap(f, nf) {
		s.launch(l, nf, p, *req)
	}
}

// launch runs call f in the background.
func (s *Source) launch(l *limit, f *flight, p int, req flow.GlobalRequest) {
	if !s.goCall(func() { s.fly(l, f, p, req) }) {
		f.prev = nil
		f.err = errClosed
		f.end()
	}
}

// fly makes call f once the call before it has ended: it asks Redis for
// every request that joined f, with a lease on top (installed in P p's
// slot), and records the answer for them. It runs to the end whatever its
// requests do: a reply later than their deadline still installs its lease
// and tells the Source's health.
// takeCounted is take, counted in l.inFlight while it runs (a panic
// included).
func (s *Source) takeCounted(l *limit, threshold, need, want, maxLease int64) (decision, error) {
	in := l.inFlight.Inc()
	defer l.inFlight.Dec()
	for most := s.mostInFlight.Load(); in > most && !s.mostInFlight.CompareAndSwap(most, in); most = s.mostInFlight.Load() {
	}
	return s.take(l, threshold, need, want, maxLease)
}

func (s *Source) fly(l *limit, f *flight, p int, req flow.GlobalRequest) {
	f.err = errNoAnswer // until there is one (a panic below)
	defer f.end()
	var probe bool
	defer func() {
		if v := recover(); v != nil {
			s.fail(l.health, probe)
			panic(v) // to goCall, which ends it
		}
	}()
	prev := f.prev
	if prev != nil {
		<-prev.done
		f.prev = nil
	}
	want := f.seal()
	if prev != nil && prev.spare > 0 {
		// The call before brought tokens too late to lease, and this one
		// was gathering: its requests have them, without a call, as far
		// as they go (those left out join the next call).
		if got := min(prev.spare, want); got > 0 && got >= f.need.Load() && s.opts.Clock.Now() < prev.expires {
			f.err = nil
			s.reserve(l, f, prev.bucket, got, prev.expires)
			prev.spare -= got
		}
		if prev.spare > 0 {
			l.giveBackLater(giveBack{bucket: prev.bucket.UnixMicro(), n: prev.spare})
		}
		if f.err == nil {
			return
		}
	}
	if prev != nil && want > 0 {
		// Or it brought a lease that has enough for them.
		now := s.opts.Clock.Now()
		for i := range l.leases {
			if ls := l.leases[i].Load(); ls.take(now, want) {
				f.err = nil
				s.reserve(l, f, ls.bucket, want, now+int64(s.opts.Timeout))
				return
			}
		}
	}
	need := max(f.need.Load(), 1)
	probe, err := s.callable(l.health)
	if err != nil {
		f.err = err
		return
	}
	var maxLease int64
	if l.perKey {
		l.calls.add(s.opts.Clock.Now(), l.window)
	}
	if s.leasing(l) {
		maxLease = l.batch.Load()
	}
	sent := s.opts.Clock.Now()
	d, err := s.takeCounted(l, perWindow(req), need, want, maxLease)
	switch {
	case err != nil && s.closed.Load():
		f.err = errClosed
		return
	case err != nil:
		s.fail(l.health, probe)
		f.err = err
		return
	}
	s.succeed(l.health)
	f.err = nil
	if !d.Allowed {
		f.refused = true
		if d.RetryAfter > 0 {
			// Nothing leaves the window before then (server time, read
			// after we sent): refuse locally until sent + RetryAfter.
			l.closed.Store(&closedWindow{until: sent + int64(d.RetryAfter), need: need})
		}
		return
	}
	reserved := min(d.Granted, want)
	s.reserve(l, f, d.BucketStart, reserved, s.opts.Clock.Now()+int64(s.opts.Timeout))
	if extra := d.Granted - reserved; extra > 0 && !s.install(l, &l.leases[p], d, extra, sent) {
		// Too late to lease (the bucket ends before they could be
		// spent): requests gathering for the next call may have them;
		// else they go back with the next call.
		if l.cur.Load() != f {
			f.bucket, f.spare = d.BucketStart, extra
		} else {
			l.giveBackLater(giveBack{bucket: d.BucketStart.UnixMicro(), n: extra})
		}
		// Replies this late need more than a lease's worth for the
		// requests that gather meanwhile.
		l.batch.Store(min(max(l.batch.Load(), want)*2, s.opts.MaxBatch))
	}
}

// reserve makes n tokens counted in bucket claimable by f's requests until
// expires. What they do not claim (they gave up) goes back with the first
// call after that; in exact mode it stays counted for a window.
func (s *Source) reserve(l *limit, f *flight, bucket time.Time, n, expires int64) {
	f.bucket, f.expires = bucket, expires
	if n <= 0 {
		return
	}
	f.left.Store(n)
	if !l.exact {
		l.backMu.Lock()
		l.reserves = append(l.reserves, f)
		l.backMu.Unlock()
	}
}

// errNoAnswer is the answer of a call that ended without one (a panic in a
// user hook).
var errNoAnswer = errors.New("global: the call ended without an answer")

// flight is one call to Redis for a limit, and the requests waiting on it.
// A limit has at most one call in flight: a flight started while another
// is out (prev) gathers requests until that one ends, then seals what it
// asks for and leaves.
type flight struct {
	prev *flight // ended and cleared before the call
	// want is the sum of the requests that joined; the sealed bit is set
	// when the call leaves. need is the smallest request among them.
	want  atomic.Int64
	need  atomic.Int64
	done  chan struct{}
	ended atomic.Bool
	// The answer, written before done is closed: err, or refused, or
	// left tokens counted in bucket for the requests, claimable until
	// expires (then given back with the next call), and spare tokens
	// for the next call's requests (read only by that call).
	err     error
	refused bool
	left    atomic.Int64
	bucket  time.Time
	expires int64
	spare   int64
}

const sealed = int64(1) << 62

func newFlight(prev *flight, n int64) *flight {
	f := &flight{prev: prev, done: make(chan struct{})}
	f.want.Store(n)
	if n > 0 {
		f.need.Store(n)
	}
	return f
}

// add joins a request for n unless the call has left.
func (f *flight) add(n int64) bool {
	for {
		w := f.want.Load()
		if w&sealed != 0 {
			return false
		}
		if f.want.CompareAndSwap(w, w+n) {
			break
		}
	}
	// need after want: a call that has left by now asks with a need
	// larger than n at worst, which only risks a refusal when room is
	// short.
	for need := f.need.Load(); (need == 0 || n < need) && !f.need.CompareAndSwap(need, n); need = f.need.Load() {
	}
	return true
}

// withdraw takes a request for n back unless the call has left (the
// request gave up waiting).
func (f *flight) withdraw(n int64) {
	for {
		w := f.want.Load()
		if w&sealed != 0 || f.want.CompareAndSwap(w, w-n) {
			return
		}
	}
}

// seal closes f to new requests and returns what its requests ask for.
func (f *flight) seal() int64 {
	for {
		w := f.want.Load()
		if f.want.CompareAndSwap(w, w|sealed) {
			return w
		}
	}
}

// claim takes n of the tokens counted for f's requests, unless they
// expired.
func (f *flight) claim(now, n int64) bool {
	if now >= f.expires {
		return false
	}
	for {
		left := f.left.Load()
		if left < n {
			return false
		}
		if f.left.CompareAndSwap(left, left-n) {
			return true
		}
	}
}

// end publishes the answer.
func (f *flight) end() {
	f.ended.Store(true)
	close(f.done)
}

// decision is one answer of the Redis script.
type decision struct {
	Allowed    bool
	Granted    int64         // tokens counted for the caller (>= need when allowed)
	Count      int64         // in the window after the call
	Remaining  int64         // threshold minus Count
	RetryAfter time.Duration // when refused: until enough leaves the window (-1: never)
	ServerTime time.Time
	// BucketStart and BucketLen place the bucket the tokens were counted in
	// on the server clock.
	BucketStart time.Time
	BucketLen   time.Duration
}

// takeFor asks Redis once, outside the request path, for n admissions of
// the limit of req and a lease of up to maxLease.
func (s *Source) takeFor(req flow.GlobalRequest, maxLease int64) (decision, error) {
	return s.take(s.limitFor(req), perWindow(req), req.Count, req.Count, maxLease)
}

// take makes one call for l: want tokens for the waiting requests (at
// least need, or none), a lease of up to maxLease, and the unspent tokens
// given back.
func (s *Source) take(l *limit, threshold, need, want, maxLease int64) (decision, error) {
	back := s.unspent(l, s.opts.Clock.Now())
	d, err := s.takeAs(s.id+strconv.FormatInt(s.seq.Inc(), 36), l, threshold, need, want, maxLease, back)
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
// they were spent, and of calls whose requests gave up before claiming
// them: they go back to their server buckets with the next call. A take
// that raced the collection finds nothing left.
func (s *Source) unspent(l *limit, now int64) []giveBack {
	l.backMu.Lock()
	back := l.back
	l.back = nil
	keep := l.reserves[:0]
	for _, f := range l.reserves {
		if now < f.expires {
			keep = append(keep, f)
		} else if n := f.left.Swap(0); n > 0 {
			back = append(back, giveBack{bucket: f.bucket.UnixMicro(), n: n})
		}
	}
	clear(l.reserves[len(keep):])
	l.reserves = keep
	l.backMu.Unlock()
	for i := range l.leases {
		ls := l.leases[i].Load()
		if ls == nil || now < ls.deadline || ls.left.Load() <= 0 {
			continue
		}
		if n := ls.left.Swap(0); n > 0 {
			back = append(back, giveBack{bucket: ls.bucket.UnixMicro(), n: n})
			if batch := l.batch.Load(); n > batch/2 {
				// Most of a lease went unspent: lease less.
				l.batch.Store(max(batch/2, 1))
			}
		}
	}
	return back
}

// takeAs is take for the call named id: a call that runs again with the
// same id (a retry after a lost reply) gets the first answer and counts
// nothing more.
func (s *Source) takeAs(id string, l *limit, threshold, need, want, maxLease int64, back []giveBack) (decision, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.CallTimeout)
	defer cancel()
	s.calls.Inc()
	ttl := 2*l.window/1000 + 1000
	replyTTL := max(int64(time.Second), 2*int64(s.opts.CallTimeout)) / int64(time.Millisecond)
	hold := s.opts.PresenceHold.Microseconds()
	var cmd *redis.Cmd
	if l.exact {
		cmd = logScript.Run(ctx, s.client, []string{l.keys.log, l.keys.meta, l.keys.reply + id}, threshold, l.window, want, ttl, serverStep, replyTTL, need, hold)
	} else {
		window, buckets := l.window, int64(s.opts.Buckets)
		if l.span {
			// One bucket more: every span of the interval lies within
			// Buckets+1 consecutive buckets, and the script keeps each
			// such sum within the threshold.
			window, buckets = window/buckets*(buckets+1), buckets+1
		}
		args := []any{threshold, window, buckets, want, maxLease, ttl, serverStep, replyTTL, need, hold}
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

func (s *Source) admitted(bucket time.Time, n int64) {
	if s.opts.OnAdmit != nil {
		s.opts.OnAdmit(bucket, n)
	}
}

// callable returns errClosed after Close and ErrUnavailable while backing
// off; once the backoff ends it lets one call through to probe.
func (s *Source) callable(l *health) (probe bool, err error) {
	if s.closed.Load() {
		return false, errClosed
	}
	until := l.downUntil.Load()
	if until == 0 {
		return false, nil
	}
	if s.opts.Clock.Now() < until || !l.probing.CompareAndSwap(false, true) {
		return false, ErrUnavailable
	}
	return true, nil
}

// fail counts a failed call. After FailAfter in a row the Source backs
// off; the backoff doubles after every FailAfter failed probes, so neither
// one unlucky probe nor the calls of many limits failing together double
// it.
func (s *Source) fail(l *health, probe bool) {
	s.errs.Inc()
	f := l.failures.Inc()
	k := int64(s.opts.FailAfter)
	if f < k {
		return
	}
	var probes int64
	if probe {
		probes = l.probeFails.Inc()
		l.probing.Store(false)
	} else {
		probes = l.probeFails.Load()
	}
	backoff := s.opts.Backoff << min(probes/k, 30)
	if backoff > s.opts.MaxBackoff || backoff <= 0 {
		backoff = s.opts.MaxBackoff
	}
	l.downUntil.Store(s.opts.Clock.Now() + int64(backoff))
}

func (s *Source) succeed(l *health) {
	if l.downUntil.Load() != 0 || l.failures.Load() != 0 || l.probeFails.Load() != 0 {
		l.failures.Store(0)
		l.probeFails.Store(0)
		l.downUntil.Store(0)
	}
	l.probing.Store(false)
}

// Stats counts what a Source has done.
type Stats struct {
	Calls  int64 // round trips to Redis
	Errors int64 // calls that failed (timeouts included)
	// Refused counts requests answered ErrUnavailable while backing
	// off, and requests refused after Close.
	Refused int64
	// Late counts requests refused because no answer came within
	// Options.Timeout while Redis was not known to be down.
	Late   int64
	Leased int64 // tokens leased beyond the requests that asked
	// Returned counts tokens given back unspent to their server bucket:
	// leases replaced before they expired, and tokens granted to requests
	// that had given up (their deadline passed or their context ended)
	// before the reply came.
	Returned int64
}

// Stats returns the counts so far.
func (s *Source) Stats() Stats {
	return Stats{Calls: s.calls.Load(), Errors: s.errs.Load(), Refused: s.refused.Load(), Late: s.late.Load(),
		Leased: s.leased.Load(), Returned: s.returned.Load()}
}

var (
	_ flow.TokenSource = (*Source)(nil)
	_ flow.Binder      = (*Source)(nil)
	_ flow.RetryHinter = (*gcraBound)(nil)
)
