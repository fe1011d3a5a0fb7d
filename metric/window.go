package metric

import (
	"fmt"
	"math"
	"time"

	"github.com/leapflow/leapflow/leaparray"
)

// Option configures a Window.
type Option func(*config)

type config struct {
	stripes int
	onNew   func(start int64, b *Bucket) // test hook: sees every bucket made
}

// WithStripes sets how many stripes each bucket spreads its summed counters
// over (rounded up to a power of two, at most MaxStripes). 1 turns striping
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
	arr *leaparray.Occupiable[Bucket]
}

// NewWindow returns a Window of sampleCount buckets over interval. It returns
// an error naming the value when the pair is invalid (see leaparray.New) or
// an option is out of range.
func NewWindow(sampleCount int, interval time.Duration, opts ...Option) (*Window, error) {
	c := config{stripes: DefaultStripes()}
	for _, o := range opts {
		o(&c)
	}
	if c.stripes < 1 {
		return nil, fmt.Errorf("metric: stripes must be >= 1, got %d", c.stripes)
	}
	stripes := roundStripes(c.stripes)
	arr, err := leaparray.NewOccupiable(sampleCount, interval,
		func(start int64, b *Bucket) {
			b.init(stripes)
			if c.onNew != nil {
				c.onNew(start, b)
			}
		},
		func(b *Bucket) int64 { return b.pass.Load() },
		func(b *Bucket, n int64) {
			b.pass.Add(n)
			b.occupied.Add(n)
		})
	if err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	w := &Window{arr: arr}
	w.Reader = Reader{w: w, span: arr.Interval()}
	return w, nil
}

// Array exposes the underlying ring, read-only by convention (tests and
// views use it).
func (w *Window) Array() *leaparray.Occupiable[Bucket] { return w.arr }

// Add adds n to event e in the bucket holding now. A write that raced a
// rotation of its bucket is redone on the current one, so no count is lost.
// Pass is held to the stricter rule of Reserve: it must land in the newest
// bucket, or be moved there.
func (w *Window) Add(now int64, e Event, n int64) {
	for {
		b := w.arr.Current(now)
		b.Value.Add(e, n)
		if e == Pass {
			if w.arr.Newest(b) {
				return
			}
			b.Value.Add(e, -n)
			continue
		}
		if !w.arr.Retired(b) {
			return
		}
	}
}

// Complete records n completed requests with a total response time rt (and n
// exceptions if failed) in one bucket visit: Success, RT, Exception and the
// minimum RT share the caller's stripe.
func (w *Window) Complete(now, n, rt int64, failed bool) {
	for {
		b := w.arr.Current(now)
		s := b.Value.stripe()
		s.c[stripeSuccess].Add(n)
		s.c[stripeRT].Add(rt)
		if failed {
			s.c[stripeException].Add(n)
		}
		if n > 0 {
			b.Value.UpdateMinRT(rt / n)
		}
		if !w.arr.Retired(b) {
			return
		}
	}
}

// AddRT adds rt to the RT sum and updates the minimum RT.
func (w *Window) AddRT(now, rt int64) {
	for {
		b := w.arr.Current(now)
		b.Value.Add(RT, rt)
		b.Value.UpdateMinRT(rt)
		if !w.arr.Retired(b) {
			return
		}
	}
}

// UpdateConcurrency records c as a concurrency seen at now.
func (w *Window) UpdateConcurrency(now, c int64) {
	w.arr.Current(now).Value.UpdateConcurrency(c)
}

// Reserve atomically admits n against threshold: it adds n to Pass in the
// current bucket if and only if the window's Pass plus everything borrowed
// and not yet folded plus n stays at or below threshold. It never lets any
// window exceed threshold, at any concurrency; under a race it can only err
// towards refusing. The refused path writes nothing.
func (w *Window) Reserve(now, n, threshold int64) bool {
	_, ok := w.Admit(now, n, threshold)
	return ok
}

// Reservation is an admission made by Admit, which can be cancelled.
type Reservation struct {
	b *Bucket
	n int64
}

// Cancel gives the admission back to the bucket it was counted in (a later
// check refused the request). Cancelling the zero Reservation does nothing.
func (r Reservation) Cancel() {
	if r.b != nil {
		r.b.pass.Sub(r.n)
	}
}

// Admit is Reserve returning the admission, so it can be cancelled exactly:
// the count is taken back from the bucket it went into, even after a
// rotation.
func (w *Window) Admit(now, n, threshold int64) (Reservation, bool) {
	if n <= 0 || n > threshold {
		return Reservation{}, false
	}
	a := w.arr
	for {
		b := a.Current(now)
		others := b.Value.base.Load()
		if others < 0 {
			// First admission in this bucket: sum the rest of its window
			// once. Current may have clamped now forward to a bucket made
			// meanwhile; judge the window that ends at the bucket we write to.
			others = w.passExcept(max(now, b.Start()), b)
			if !b.Value.base.CompareAndSwap(-1, others) {
				others = b.Value.base.Load()
			}
		}
		epoch := a.Epoch()
		var cur int64
		for {
			cur = b.Value.pass.Load()
			if others+cur+a.Pending()+n > threshold {
				return Reservation{}, false
			}
			if b.Value.pass.CompareAndSwap(cur, cur+n) {
				break
			}
			// Lost to another admission on this bucket; re-read and re-check.
		}
		// A borrow that started after our epoch load may have summed the
		// counts without our add; a rotation after Current may have summed
		// this bucket without it. Either way undo (a transient surplus that
		// can only cause a refusal) and decide again.
		if a.Epoch() == epoch && a.Newest(b) {
			return Reservation{b: &b.Value, n: n}, true
		}
		b.Value.pass.Sub(n)
	}
}

// OnRetire sets fn to run with the start and final counts of every bucket
// that leaves the ring (see leaparray.LeapArray.OnRetire). Set it before the
// window is shared.
func (w *Window) OnRetire(fn func(start int64, b *Bucket)) {
	w.arr.OnRetire(func(old *leaparray.WindowWrap[Bucket]) { fn(old.Start(), &old.Value) })
}

// Absorb adds every count of b into the bucket holding start: how a longer
// window takes in the buckets a shorter one retires.
func (w *Window) Absorb(start int64, b *Bucket) {
	for {
		dst := w.arr.Current(start)
		d := &dst.Value
		d.pass.Add(b.pass.Load())
		d.occupied.Add(b.occupied.Load())
		s := d.stripe()
		for i := range stripedEvents {
			var sum int64
			for j := range b.stripes {
				sum += b.stripes[j].c[i].Load()
			}
			s.c[i].Add(sum)
		}
		if v, ok := b.MinRT(); ok {
			d.UpdateMinRT(v)
		}
		d.UpdateConcurrency(b.MaxConcurrency())
		if !w.arr.Retired(dst) {
			return
		}
	}
}

// SumRange returns event e summed over the buckets still in the ring whose
// start is in [lo, hi), valid at any time or not.
func (w *Window) SumRange(lo, hi int64, e Event) int64 {
	var sum int64
	for b := range w.arr.Buckets(lo, hi) {
		sum += b.Value.Get(e)
	}
	return sum
}

// passExcept sums Pass over the buckets valid at now, skipping b.
func (w *Window) passExcept(now int64, b *leaparray.WindowWrap[Bucket]) int64 {
	var sum int64
	for x := range w.arr.Within(now, w.arr.Interval()) {
		if x != b {
			sum += x.Value.pass.Load()
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

// Previous returns event e's count in the bucket just before the one holding
// now (0 if that bucket is gone). With 1 s buckets this is the last second.
func (w *Window) Previous(now int64, e Event) int64 {
	if b := w.arr.Previous(now); b != nil {
		return b.Value.Get(e)
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
	a := r.w.arr
	now = a.Clamp(now)
	var sum int64
	switch e {
	case Pass: // the admission count: no stripes to walk
		for b := range a.Within(now, r.span) {
			sum += b.Value.pass.Load()
		}
	default:
		for b := range a.Within(now, r.span) {
			sum += b.Value.Get(e)
		}
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
	a := r.w.arr
	now = a.Clamp(now)
	var rt, n int64
	for b := range a.Within(now, r.span) {
		rt += b.Value.Get(RT)
		n += b.Value.Get(Success)
	}
	if n == 0 {
		return 0
	}
	return float64(rt) / float64(n)
}

// MinRT returns the smallest RT recorded in the span, and false (with 0) if
// none was.
func (r *Reader) MinRT(now int64) (int64, bool) {
	a := r.w.arr
	now = a.Clamp(now)
	lo, ok := int64(math.MaxInt64), false
	for b := range a.Within(now, r.span) {
		if v, has := b.Value.MinRT(); has && v < lo {
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
	a := r.w.arr
	now = a.Clamp(now)
	var hi int64
	for b := range a.Within(now, r.span) {
		hi = max(hi, b.Value.MaxConcurrency())
	}
	return hi
}

// MaxRate returns the highest per-second rate of event e reached by a single
// bucket in the span (Sentinel's "max success QPS" for e = Success).
func (r *Reader) MaxRate(now int64, e Event) float64 {
	a := r.w.arr
	now = a.Clamp(now)
	var hi int64
	for b := range a.Within(now, r.span) {
		hi = max(hi, b.Value.Get(e))
	}
	return float64(hi) * float64(time.Second) / float64(a.BucketLen())
}
