package window

import (
	"fmt"
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/ring"
)

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
// (start, as the caller read it) and caches in head the passes of the
// other buckets if they are all frozen (their counts are then final but
// for passes taken back, which clear the cache: see backOut). A caller
// that loaded head before a reuse must not fill the next life's cache with
// its own window's sum: the claim stands only if head still starts at
// start, and is still the newest, after it was made.
func (w *Window) fillSum(head *ring.WindowWrap[bucket], start int64) int64 {
	token, filling := w.beginFill(head)
	if filling && (head.Start() != start || !w.arr.Newest(head)) {
		head.Value.rest.CompareAndSwap(token, sumUnknown)
		filling = false
	}
	rest, final := w.restOf(head, start)
	if filling {
		w.endFill(head, token, rest, final)
	}
	return rest + head.Value.livePasses()
}

// beginFill claims head's cache for one fill, if no other fill holds it. The
// token is unique: a fill whose claim a clear took away, and that another
// fill then claimed again, cannot store over it.
func (w *Window) beginFill(head *ring.WindowWrap[bucket]) (int64, bool) {
	token := sumUnknown - w.fills.Add(1)
	return token, head.Value.rest.CompareAndSwap(sumUnknown, token)
}

// restOf sums the passes of the buckets of the window of head, starting at
// start, other than head, and says whether they were all frozen. Every
// time in head's span sees the same buckets; head's start is used, so that
// a caller whose time is behind head (a rotation raced it) still sums
// head's window.
func (w *Window) restOf(head *ring.WindowWrap[bucket], start int64) (rest int64, final bool) {
	final = true
	for x := range w.arr.Within(start, w.arr.Interval()) {
		switch {
		case x == head:
		case x.Value.frozen.Load():
			rest += loadT(&x.Value.fz[Pass])
		default: // superseded, its freeze under way
			final = false
			rest += x.Value.livePasses()
		}
	}
	return rest, final
}

// endFill stores a fill's result, unless a clear took the claim since.
func (w *Window) endFill(head *ring.WindowWrap[bucket], token, rest int64, final bool) {
	if !final {
		rest = sumUnknown
	}
	head.Value.rest.CompareAndSwap(token, rest)
}

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
		h := a.Head()
		if start := h.Start(); r.span == a.Interval() && uint64(now-start) < uint64(a.BucketLen()) {
			if rest := h.Value.rest.Load(); rest >= 0 {
				return rest + h.Value.livePasses()
			}
			return r.w.fillSum(h, start)
		}
		for b := range a.Within(now, r.span) {
			// passes, by hand: the call would not inline.
			if v := &b.Value; v.frozen.Load() {
				sum += loadT(&v.fz[Pass])
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
