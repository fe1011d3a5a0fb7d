package window

import (
	"fmt"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/ring"
)

// Option configures a Window.
type Option func(*config)

type config struct {
	stripes  int
	handover func(start int64, c Counts)
	onNew    func(start int64, b *bucket) // test hook: sees every bucket made
}

// WithStripes sets how many stripes each bucket spreads its summed counters
// over (rounded up to a power of two, at most 64). 1 turns striping
// off, which suits long windows of many buckets that are rarely hot (a
// minute of 1 s buckets). The default is GOMAXPROCS, rounded up.
func WithStripes(n int) Option {
	return func(c *config) { c.stripes = n }
}

// Window is a sliding window of event counts over the last interval, split
// into sampleCount buckets. It is safe for simultaneous use by multiple
// goroutines and must not be copied after first use.
type Window struct {
	Reader
	arr ring.Occupiable[bucket] // by value: one pointer less per operation
	// handover, if set, takes the counts of every bucket that retires, and
	// corrections to them (see WithHandover).
	handover func(start int64, c Counts)
	// fills numbers the fills of the cached Sum (see beginFill).
	fills atomic.Int64
}

// NewWindow returns a Window of sampleCount buckets over interval. It returns
// an error naming the value when the pair is invalid (see ring.New) or
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
	hooks := ring.Hooks[bucket]{
		Init: func(start int64, b *bucket) {
			b.init(start, stripes)
			if c.onNew != nil {
				c.onNew(start, b)
			}
		},
		Supersede: func(prev *ring.WindowWrap[bucket]) { prev.Value.freeze() },
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
		},
		func(start, n int64) {
			// A borrow whose bucket was never made, and whose windows
			// are all over: it counts where it was admitted, as that
			// bucket's counts would have been handed over.
			if w.handover != nil {
				w.handover(start, Counts{Pass: n, Occupied: n, MinRT: -1})
			}
		})
	if err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	w.arr.Reuse(func(start int64, b *bucket) {
		b.reuse(start)
		if c.onNew != nil {
			c.onNew(start, b)
		}
	})
	w.Reader = Reader{w: w, span: w.arr.Interval()}
	return w, nil
}

// BucketLen returns the length of the window's buckets, in ns.
func (w *Window) BucketLen() int64 { return w.arr.BucketLen() }

// Clamp returns now, or the start of the newest bucket if now is behind it
// (what every operation does with a time behind the window: see
// leaparray's Clamp).
func (w *Window) Clamp(now int64) int64 { return w.arr.Clamp(now) }

// Add adds n to event e in the bucket holding now. Counts must stay
// non-negative. Every count lands exactly once: a write that raced the
// retirement of its bucket either made it into the bucket's final counts or
// is made again on the current bucket (see WithHandover).
// A bucket counts at most MaxCount passes (2^53 - 1, about 9e15) on each
// stripe: passes added beyond are dropped.
// A Pass added here is counted without admission (for windows that only
// keep statistics); it must land in the newest bucket, or is moved there, and
// later admissions on the same window count it, though one racing it may not.
func (w *Window) Add(now int64, e Event, n int64) { w.AddOn(cpu.Pin(), now, e, n) }

// AddOn is Add with a stripe hint: the caller's P index (any value is correct).
func (w *Window) AddOn(p int, now int64, e Event, n int64) {
	now = max(now, 0) // see ring.Clamp: nothing maps below 0
	a := &w.arr
	if e == Pass {
		// Fast path: now in the newest bucket, which counted a direct pass
		// before, and the count stays within MaxCount. The generation is
		// read before the start: a start unchanged after the write then
		// dates the generation written in (see Generations).
		b := a.Head()
		g := b.Value.gen.Load()
		start := b.Start()
		if now < start+a.BucketLen() && b.Value.direct.Load() {
			c := &b.Value.stripeOn(p).c[stripeDirect]
			// Both the word and its sum in generation g, unsealed: the
			// count neither carries into the tag nor crosses MaxCount.
			if v := c.Load(); ((v^g)|((v+n)^g))>>countBits == 0 && c.CompareAndSwap(v, v+n) {
				if a.Newest(b) && b.Start() == start {
					return
				}
				// A pass must land in the newest bucket: move it there.
				w.takeBack(b, c, start, g, n)
			}
		}
	}
	if e == Pass || e == OccupiedPass {
		w.addPass(p, now, e, n)
		return
	}
	i := stripeOf[e]
	for {
		// The ring's Current, its fast path spelled out: the generic call
		// does not inline (AddOn, CompleteOn and AdmitOn all do this).
		b := a.Head()
		if now >= b.Start()+a.BucketLen() {
			b = a.Current(now)
		}
		if !sealed(b.Value.stripeOn(p).c[i].Add(n)) {
			return
		}
		// After the hand-over: make it on the current bucket.
	}
}

// holding returns the bucket holding now (the newest, if now is behind
// it), made if need be, with its generation and start: the generation read
// before the start, so that a start unchanged after a write dates the
// generation written in (a reuse hides the start before it moves to the
// next generation).
func (w *Window) holding(now int64) (b *ring.WindowWrap[bucket], g, start int64) {
	a := &w.arr
	b = a.Head()
	g = b.Value.gen.Load()
	start = b.Start()
	if now >= start+a.BucketLen() {
		b = a.Current(now)
		g = b.Value.gen.Load()
		start = b.Start()
	}
	return b, g, start
}

// addPass adds n passes (e Pass, on stripe p's direct word) or occupied
// passes (e OccupiedPass) to the bucket holding now: tagged words, written
// in the generation the writer read (see Generations).
func (w *Window) addPass(p int, now int64, e Event, n int64) {
	a := &w.arr
	for {
		b, g, start := w.holding(now)
		if e == OccupiedPass {
			if addSat(&b.Value.occupied, g, n) {
				return
			}
			continue // retired meanwhile: make it on the current bucket
		}
		if !b.Value.direct.Load() {
			b.Value.direct.Store(true)
		}
		c := &b.Value.stripeOn(p).c[stripeDirect]
		if !addSat(c, g, n) {
			continue // frozen or reused meanwhile
		}
		if a.Newest(b) && b.Start() == start {
			return
		}
		// A pass must land in the newest bucket: move it there.
		w.takeBack(b, c, start, g, n)
	}
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

// CompleteOn is Complete with a stripe hint (see AddOn).
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
