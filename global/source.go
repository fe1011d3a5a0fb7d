package global

// The Source: New, Close, and the request path (Acquire, Bind, wait).

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/cpu"
)

// Source is a flow.TokenSource on Redis. It is safe for simultaneous use.
type Source struct {
	client redis.UniversalClient
	opts   options
	limits sync.Map // limitID -> *limit
	gcras  sync.Map // a GCRA rule's key -> *gcraLimit

	calls, errs, refused, late, leased, returned, paused atomic.Int64
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
	// owned is the client Dial built, closed by Close (nil after New).
	owned redis.UniversalClient
}

// errClosed ends the calls of a closed Source.
var errClosed = errors.New("global: source closed")

// Close stops the Source: it cancels the calls in flight, waits for them,
// and takes this instance's presence away. Leases already held are still
// spent; every other request is refused (Stats.Refused): a closed Source
// can neither count an admission nor keep a fallback's share from the
// others. It closes the client only if Dial built it.
func (s *Source) Close() error {
	s.bgMu.Lock()
	s.closed.Store(true)
	s.bgMu.Unlock()
	s.cancel()
	s.bg.Wait()
	s.leave()
	if s.owned != nil {
		return s.owned.Close()
	}
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
			// A panic in a user hook (WithClock) must not take the
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
//
// A Redis that dies must fail a call at once, and a silent one within the
// CallTimeout (see the package doc, Failure): New refuses a *redis.Client
// or *redis.ClusterClient whose DialerRetries is not 1 (go-redis' default
// is 5, 100 ms apart), or that ignores context deadlines
// (ContextTimeoutEnabled false) with read or write timeouts longer than
// the CallTimeout. It adds a hook to the client (to every node's, in a
// Cluster; hand a Cluster client over before using it, or nodes it made
// while the cluster did not answer keep no hook) that bounds each of its
// dials by the Source's Timeout and makes a failed dial the failure of
// its command, which go-redis then does not retry (DialError); the hook
// lets dials through untouched once the Source is closed. Dial builds a
// client that has all this.
func New(client redis.UniversalClient, option ...Option) (*Source, error) {
	if client == nil {
		return nil, errors.New("global: client must not be nil")
	}
	opts, err := newOptions(option)
	if err != nil {
		return nil, err
	}
	if err := checkClient(client, opts.CallTimeout); err != nil {
		return nil, err
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("global: an instance ID: %w", err)
	}
	s := &Source{client: client, opts: opts, id: hex.EncodeToString(id[:]) + "-"}
	bindDials(client, s)
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
	nl.carried = newCarried(nl.window, s.opts.Buckets)
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

var (
	_ flow.TokenSource  = (*Source)(nil)
	_ flow.Binder       = (*Source)(nil)
	_ flow.RetryHinter  = (*gcraBound)(nil)
	_ flow.LocalCounter = (*bound)(nil)
)
