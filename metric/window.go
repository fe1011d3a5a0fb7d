package metric

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/admit"
	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/leaparray"
)

// Option configures a Window.
type Option func(*config)

type config struct {
	stripes  int
	handover func(start int64, c Counts)
	onNew    func(start int64, b *bucket) // test hook: sees every bucket made
}

// WithHandover makes the window hand fn the counts of every bucket that
// leaves the ring: fn runs under the rotation lock, after the replacement
// is published, with the bucket's start and its final counts. The
// hand-over is exact: every write made on the bucket is either in those
// counts or made again on a current bucket, never both. One case needs a
// correction after the fact: an admission counted in a bucket that retired
// before the admission backed out (a rotation race, or a cancel). fn then
// runs again, outside the lock, with that start and Counts{Pass: -n,
// MinRT: -1}, so it must be safe for simultaneous use. stat folds the
// second window into the minute this way.
func WithHandover(fn func(start int64, c Counts)) Option {
	return func(c *config) { c.handover = fn }
}

// WithStripes sets how many stripes each bucket spreads its summed counters
// over (rounded up to a power of two, at most 64). 1 turns striping
// off, which suits long windows of many buckets that are rarely hot (a
// minute of 1 s buckets). The default is DefaultStripes.
func WithStripes(n int) Option {
	return func(c *config) { c.stripes = n }
}

// Window is a sliding window of event counts over the last interval, split
// into sampleCount buckets. It is safe for simultaneous use by multiple
// goroutines and must not be copied after first use.
type Window struct {
	Reader
	arr leaparray.Occupiable[bucket] // by value: one pointer less per operation
	// handover, if set, takes the counts of every bucket that retires, and
	// corrections to them (see WithHandover).
	handover func(start int64, c Counts)
	// fills numbers the fills of the cached Sum (see beginFill).
	fills atomic.Int64
}

// NewWindow returns a Window of sampleCount buckets over interval. It returns
// an error naming the value when the pair is invalid (see leaparray.New) or
// an option is out of range.
func NewWindow(sampleCount int, interval time.Duration, opts ...Option) (*Window, error) {
	c := config{stripes: cpu.Stripes()}
	for _, o := range opts {
		o(&c)
	}
	if c.stripes < 1 {
		return nil, fmt.Errorf("metric: stripes must be >= 1, got %d", c.stripes)
	}
	stripes := cpu.RoundStripes(c.stripes)
	w := &Window{handover: c.handover}
	hooks := leaparray.Hooks[bucket]{
		Init: func(start int64, b *bucket) {
			b.init(stripes)
			if c.onNew != nil {
				c.onNew(start, b)
			}
		},
		Supersede: func(prev *leaparray.WindowWrap[bucket]) { prev.Value.freeze() },
		Retire:    w.retire,
	}
	err := w.arr.Init(sampleCount, interval, hooks,
		func(b *bucket) int64 { return b.committed() },
		func(b *bucket, n int64) {
			// A borrowed admission: leased to stripe 0 and used there.
			b.granted.Add(n)
			b.stripes[0].c[stripeTaken].Add(n)
			b.stripes[0].c[stripeUsed].Add(n)
			b.occupied.Add(n)
		})
	if err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	w.Reader = Reader{w: w, span: w.arr.Interval()}
	return w, nil
}

// Clamp returns now, or the start of the newest bucket if now is behind it
// (what every operation does with a time behind the window: see
// leaparray's Clamp).
func (w *Window) Clamp(now int64) int64 { return w.arr.Clamp(now) }

// Add adds n to event e in the bucket holding now. Counts must stay
// non-negative. Every count lands exactly once: a write that raced the
// retirement of its bucket either made it into the bucket's final counts or
// is made again on the current bucket (see WithHandover).
// A Pass added here is counted without admission (for windows that only
// keep statistics); it must land in the newest bucket, or is moved there, and
// later admissions on the same window count it, though one racing it may not.
func (w *Window) Add(now int64, e Event, n int64) { w.AddOn(cpu.Pin(), now, e, n) }

// AddOn is Add with a stripe hint from Pin.
func (w *Window) AddOn(p int, now int64, e Event, n int64) {
	now = max(now, 0) // see leaparray.Clamp: nothing maps below 0
	for {
		// The ring's Current, its fast path spelled out: the generic call
		// does not inline (AddOn, CompleteOn and AdmitOn all do this).
		b := w.arr.Head()
		if now >= b.Start()+w.arr.BucketLen() {
			b = w.arr.Current(now)
		}
		v := b.Value.addOn(p, e, n)
		if sealed(v) {
			continue // after the hand-over: make it on the current bucket
		}
		if e != Pass || w.arr.Newest(b) {
			return
		}
		// A pass must land in the newest bucket: move it there.
		w.backOut(b, b.Value.addOn(p, e, -n), n)
	}
}

// backOut finishes taking back n passes from bucket b, given the value the
// taking back returned. If b froze in between, its frozen count holds the
// passes: take them back there. If it also retired, its hand-over counted
// them: correct that.
func (w *Window) backOut(b *leaparray.WindowWrap[bucket], v, n int64) {
	if !sealed(v) {
		return
	}
	if sealed(b.Value.fz[Pass].Add(-n)) && w.handover != nil {
		w.handover(b.Start(), Counts{Pass: -n, MinRT: -1})
	}
	// The frozen rest cached in the head may hold the passes: clear it.
	// A fill that read the count before our add has not stored yet (it
	// then fails) or has (we clear it); one that starts later reads it.
	w.arr.Head().Value.rest.Store(sumUnknown)
}

// add adds n to word i of stripe p in the bucket holding now, again on the
// current bucket for as long as it lands after a seal.
func (w *Window) add(p int, now int64, i int, n int64) {
	for sealed(w.arr.Current(now).Value.stripeOn(p).c[i].Add(n)) {
	}
}

// Complete records n completed requests with a total response time rt (and n
// exceptions if failed) in one bucket visit: Success, RT, Exception and the
// minimum RT share the caller's stripe.
func (w *Window) Complete(now, n, rt int64, failed bool) { w.CompleteOn(cpu.Pin(), now, n, rt, failed) }

// CompleteOn is Complete with a stripe hint from Pin.
func (w *Window) CompleteOn(p int, now, n, rt int64, failed bool) {
	now = max(now, 0)
	var s *stripe
	for {
		b := w.arr.Head()
		if now >= b.Start()+w.arr.BucketLen() {
			b = w.arr.Current(now)
		}
		// The min RT goes first: a seal reads it after sealing the success
		// word, so a success add that lands before the seal brings it along.
		switch {
		case n == 1: // the common case: no 64-bit division
			b.Value.updateMinRT(rt)
		case n > 1:
			b.Value.updateMinRT(rt / n)
		}
		s = b.Value.stripeOn(p)
		if !sealed(s.c[stripeSuccess].Add(n)) {
			break
		}
	}
	if sealed(s.c[stripeRT].Add(rt)) {
		w.add(p, now, stripeRT, rt)
	}
	if failed && sealed(s.c[stripeException].Add(n)) {
		w.add(p, now, stripeException, n)
	}
}

// addRT adds rt to the RT sum and updates the minimum RT.
func (w *Window) addRT(now, rt int64) {
	p := cpu.Pin()
	for {
		b := w.arr.Current(now)
		b.Value.updateMinRT(rt) // first, as in CompleteOn
		if !sealed(b.Value.stripeOn(p).c[stripeRT].Add(rt)) {
			return
		}
	}
}

// updateConcurrency records c as a concurrency seen at now.
func (w *Window) updateConcurrency(now, c int64) {
	w.arr.Current(now).Value.updateConcurrency(c)
}

// Reserve atomically admits n against threshold: it counts n as Pass in the
// current bucket if and only if the window's passes, plus everything
// borrowed and not yet folded, plus n stay at or below threshold. It never
// lets any window exceed threshold, at any concurrency; under a race it can
// only err towards refusing. The refused path writes nothing shared.
func (w *Window) Reserve(now, n, threshold int64) bool {
	_, ok := w.AdmitOn(cpu.Pin(), now, n, threshold)
	return ok
}

// Reservation is an admission made by Admit, or, when refused, what the
// window held.
type Reservation struct {
	w *Window
	b *leaparray.WindowWrap[bucket] // nil when refused
	s *stripe
	// n is the count admitted, or for a refusal the count seen.
	n int64
}

// Start returns the start of the bucket the admission was counted in. A
// caller whose now was behind the newest bucket was counted there (see
// leaparray on clamping); max(now, Start()) is when its pass happened.
// Zero when refused.
func (r Reservation) Start() int64 {
	if r.b == nil {
		return 0
	}
	return r.b.Start()
}

// Seen returns, for a refused admission, the window's committed count that
// refused it: passes, leases not yet used, and borrowed admissions. It costs
// the refusal nothing more.
func (r Reservation) Seen() int64 {
	if r.b != nil {
		return 0
	}
	return r.n
}

// Cancel gives the admission back to the lease it came from (a later check
// refused the request) and clears r; cancelling the zero Reservation does
// nothing. Only leapflow's own packages can call it (they hold an
// admit.Token): a copy cancelled again would give the admission back
// twice, and flow, which never copies one, is the only user that needs it.
func (r *Reservation) Cancel(admit.Token) { r.cancel() }

func (r *Reservation) cancel() {
	if r.b != nil {
		r.w.backOut(r.b, r.s.c[stripeUsed].Add(-r.n), r.n)
		*r = Reservation{}
	}
}

// Admit is Reserve returning the admission: the bucket it was counted in,
// or for a refusal what the window held.
func (w *Window) Admit(now, n, threshold int64) (Reservation, bool) {
	return w.AdmitOn(cpu.Pin(), now, n, threshold)
}

// maxLease caps one lease; leases are also at most 1/(leaseShare x stripes)
// of the room left, which bounds what idle stripes can strand in a bucket
// to 1/leaseShare of the threshold.
const (
	maxLease   = 1 << 16
	leaseShare = 16
)

// AdmitOn is Admit with a stripe hint from Pin.
func (w *Window) AdmitOn(p int, now, n, threshold int64) (Reservation, bool) {
	if n <= 0 || n > threshold {
		return Reservation{}, false
	}
	now = max(now, 0)
	a := &w.arr
	for {
		b := a.Head()
		if now >= b.Start()+a.BucketLen() {
			b = a.Current(now)
		}
		s := b.Value.stripeOn(p)
		used, taken := &s.c[stripeUsed], &s.c[stripeTaken]
		// Fast path: the stripe's lease covers n. Admitted iff used stays
		// within taken after our add and the bucket is still the newest (a
		// rotation sums this bucket's passes after publishing the next).
		// A frozen bucket's used word is sealed, far above any lease.
		if used.Load()+n <= taken.Load() {
			v := used.Add(n)
			if v <= taken.Load() && a.Newest(b) {
				return Reservation{w: w, b: b, s: s, n: n}, true
			}
			if u := used.Add(-n); !sealed(v) {
				w.backOut(b, u, n)
			}
			if !a.Newest(b) {
				continue
			}
		}
		if seen, ok := w.lease(b, s, max(now, b.Start()), n, threshold); !ok {
			return Reservation{n: seen}, false
		}
		// The stripe holds a fresh lease; take n from it.
	}
}

// lease moves at least n tokens from bucket b's budget to stripe s, if the
// window has room. When it has none it reports false and what it held.
func (w *Window) lease(b *leaparray.WindowWrap[bucket], s *stripe, now, n, threshold int64) (int64, bool) {
	a := &w.arr
	for {
		base := b.Value.base.Load()
		if base < 0 {
			// First lease in this bucket: sum the rest of its window once.
			base = w.passExcept(now, b)
			if !b.Value.base.CompareAndSwap(-1, base) {
				base = b.Value.base.Load()
			}
		}
		epoch := a.Epoch()
		var l int64
		for {
			g := b.Value.granted.Load()
			room := threshold - base - g - b.Value.directSum() - a.Pending()
			if room < n {
				// No room; unless a rotation made b old, when the caller
				// retries on the newest bucket.
				return threshold - room, !a.Newest(b)
			}
			l = min(max(n, room/(leaseShare*int64(len(b.Value.stripes)))), max(n, maxLease))
			if b.Value.granted.CompareAndSwap(g, g+l) {
				break
			}
			// Lost to another lease on this bucket; re-read and re-check.
		}
		// A borrow that started after our epoch load may have summed the
		// counts without our lease; a rotation may have summed this bucket
		// without it. Either way give it back and decide again.
		if a.Epoch() == epoch && a.Newest(b) {
			s.c[stripeTaken].Add(l)
			return 0, true
		}
		b.Value.granted.Sub(l)
		if !a.Newest(b) {
			return 0, true // the caller moves to the newest bucket
		}
	}
}

// retire seals a bucket leaving the ring and hands its counts over.
func (w *Window) retire(old *leaparray.WindowWrap[bucket]) {
	c := old.Value.seal()
	if w.handover != nil {
		w.handover(old.Start(), c)
	}
}

// Absorb adds c into the bucket holding start (the newest, if start is
// behind it): how a longer window takes in the buckets a shorter one
// retires. Counts may be negative (WithHandover's corrections).
func (w *Window) Absorb(start int64, c Counts) {
	if c.MinRT >= 0 || c.MaxConcurrency > 0 {
		b := &w.arr.Current(start).Value
		if c.MinRT >= 0 {
			b.updateMinRT(c.MinRT)
		}
		b.updateConcurrency(c.MaxConcurrency)
	}
	p := cpu.Pin()
	for _, x := range [...]struct {
		e Event
		n int64
	}{{Pass, c.Pass}, {Block, c.Block}, {Success, c.Success}, {Exception, c.Exception}, {RT, c.RT}, {OccupiedPass, c.Occupied}} {
		if x.n != 0 {
			w.AddOn(p, start, x.e, x.n)
		}
	}
}

// SumRange returns event e summed over the buckets still in the ring whose
// start is in [lo, hi), valid at any time or not.
func (w *Window) SumRange(lo, hi int64, e Event) int64 {
	var sum int64
	for b := range w.arr.Buckets(lo, hi) {
		sum += b.Value.get(e)
	}
	return sum
}

// sumUnknown is bucket.rest when no total is cached; a fill in progress
// holds a token below it, unique to the fill.
const sumUnknown = -1

// fillSum returns the passes of the whole window at a time in head's span
// and caches in head the passes of the other buckets if they are all frozen
// (their counts are then final but for passes taken back, which clear the
// cache: see backOut).
func (w *Window) fillSum(head *leaparray.WindowWrap[bucket]) int64 {
	token, filling := w.beginFill(head)
	rest, final := w.restOf(head)
	if filling {
		w.endFill(head, token, rest, final)
	}
	return rest + head.Value.livePasses()
}

// beginFill claims head's cache for one fill, if no other fill holds it. The
// token is unique: a fill whose claim a clear took away, and that another
// fill then claimed again, cannot store over it.
func (w *Window) beginFill(head *leaparray.WindowWrap[bucket]) (int64, bool) {
	token := sumUnknown - w.fills.Add(1)
	return token, head.Value.rest.CompareAndSwap(sumUnknown, token)
}

// restOf sums the passes of the buckets of head's window other than head,
// and says whether they were all frozen. Every time in head's span sees the
// same buckets; head's start is used, so that a caller whose time is behind
// head (a rotation raced it) still sums head's window.
func (w *Window) restOf(head *leaparray.WindowWrap[bucket]) (rest int64, final bool) {
	final = true
	for x := range w.arr.Within(head.Start(), w.arr.Interval()) {
		switch {
		case x == head:
		case x.Value.frozen.Load():
			rest += load(&x.Value.fz[Pass])
		default: // superseded, its freeze under way
			final = false
			rest += x.Value.livePasses()
		}
	}
	return rest, final
}

// endFill stores a fill's result, unless a clear took the claim since.
func (w *Window) endFill(head *leaparray.WindowWrap[bucket], token, rest int64, final bool) {
	if !final {
		rest = sumUnknown
	}
	head.Value.rest.CompareAndSwap(token, rest)
}

// passExcept sums Pass over the buckets valid at now, skipping b.
func (w *Window) passExcept(now int64, b *leaparray.WindowWrap[bucket]) int64 {
	var sum int64
	for x := range w.arr.Within(now, w.arr.Interval()) {
		if x != b {
			sum += x.Value.passes()
		}
	}
	return sum
}

// Borrow admits n against the earliest future bucket that starts within
// maxWait of now and keeps every window containing it at or below threshold.
// It returns how long the caller must wait for that bucket to start; the
// admission is folded into the bucket as Pass and OccupiedPass when it
// becomes current.
func (w *Window) Borrow(now, n, threshold int64, maxWait time.Duration) (time.Duration, bool) {
	wait, ok := w.arr.Borrow(now, n, threshold, int64(maxWait))
	return time.Duration(wait), ok
}

// Borrowed returns the count borrowed from future buckets and not yet folded
// into a current one.
func (w *Window) Borrowed() int64 { return w.arr.Pending() }

// previous returns event e's count in the bucket just before the one holding
// now (0 if that bucket is gone). With 1 s buckets this is the last second.
func (w *Window) previous(now int64, e Event) int64 {
	if b := w.arr.Previous(now); b != nil {
		return b.Value.get(e)
	}
	return 0
}

// View returns a read-only view of the trailing interval of w, which must be
// a positive multiple of the bucket length that divides w's interval (a 1 s
// view over a 10 s window of 1 s or 500 ms buckets).
func (w *Window) View(interval time.Duration) (*Reader, error) {
	span := int64(interval)
	bl := w.arr.BucketLen()
	if span <= 0 || span > w.arr.Interval() || w.arr.Interval()%span != 0 || span%bl != 0 {
		return nil, fmt.Errorf("metric: view interval %v must divide the window's %v and be a multiple of its %v buckets",
			interval, time.Duration(w.arr.Interval()), time.Duration(bl))
	}
	return &Reader{w: w, span: span}, nil
}

// Reader reads a Window over a trailing span: the whole window (embedded in
// Window) or a shorter view. Reads allocate nothing and never create or
// revive a bucket.
type Reader struct {
	w    *Window
	span int64
}

// Interval returns the span the reader covers.
func (r *Reader) Interval() time.Duration { return time.Duration(r.span) }

// Sum returns the total of event e over the buckets valid at now.
func (r *Reader) Sum(now int64, e Event) int64 {
	a := &r.w.arr
	now = a.Clamp(now)
	var sum int64
	if e == Pass { // the read admission depends on: keep it tight
		// The whole window at a time in the newest bucket: that bucket's
		// live passes plus the frozen rest, cached in it.
		// (One unsigned compare: a head newer than now, made by a rotation
		// that raced us, does not qualify.)
		if h := a.Head(); r.span == a.Interval() && uint64(now-h.Start()) < uint64(a.BucketLen()) {
			if rest := h.Value.rest.Load(); rest >= 0 {
				return rest + h.Value.livePasses()
			}
			return r.w.fillSum(h)
		}
		for b := range a.Within(now, r.span) {
			// passes, by hand: the call would not inline.
			if v := &b.Value; v.frozen.Load() {
				sum += load(&v.fz[Pass])
			} else {
				sum += v.livePasses()
			}
		}
		return sum
	}
	for b := range a.Within(now, r.span) {
		sum += b.Value.get(e)
	}
	return sum
}

// Rate returns event e per second over the span.
func (r *Reader) Rate(now int64, e Event) float64 {
	return float64(r.Sum(now, e)) * float64(time.Second) / float64(r.span)
}

// AvgRT returns the mean RT of the completions in the span, 0 if there were
// none.
func (r *Reader) AvgRT(now int64) float64 {
	a := &r.w.arr
	now = a.Clamp(now)
	var rt, n int64
	for b := range a.Within(now, r.span) {
		rt += b.Value.get(RT)
		n += b.Value.get(Success)
	}
	if n == 0 {
		return 0
	}
	return float64(rt) / float64(n)
}

// MinRT returns the smallest RT recorded in the span, and false (with 0) if
// none was.
func (r *Reader) MinRT(now int64) (int64, bool) {
	a := &r.w.arr
	now = a.Clamp(now)
	lo, ok := int64(math.MaxInt64), false
	for b := range a.Within(now, r.span) {
		if v, has := b.Value.lowestRT(); has && v < lo {
			lo, ok = v, true
		}
	}
	if !ok {
		return 0, false
	}
	return lo, true
}

// MaxConcurrency returns the largest concurrency recorded in the span.
func (r *Reader) MaxConcurrency(now int64) int64 {
	a := &r.w.arr
	now = a.Clamp(now)
	var hi int64
	for b := range a.Within(now, r.span) {
		hi = max(hi, b.Value.maxConcurrency())
	}
	return hi
}

// MaxRate returns the highest per-second rate of event e reached by a single
// bucket in the span (Sentinel's "max success QPS" for e = Success).
func (r *Reader) MaxRate(now int64, e Event) float64 {
	a := &r.w.arr
	now = a.Clamp(now)
	var hi int64
	for b := range a.Within(now, r.span) {
		hi = max(hi, b.Value.get(e))
	}
	return float64(hi) * float64(time.Second) / float64(a.BucketLen())
}
