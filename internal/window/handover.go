package window

import (
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/ring"
)

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

// takeBack takes back n passes that a writer of generation g (gen word)
// added to tagged stripe word c (used or direct) of bucket b, which then
// started at start. If the bucket is still in that generation and not
// frozen, they come off the word. If it froze since, its frozen passes
// hold them: they come off there (backOut). If it was reset since, its
// hand-over counted them: the correction follows it. It reports whether
// they came off the word.
func (w *Window) takeBack(b *ring.WindowWrap[bucket], c *atomic.Int64, start, g, n int64) (fromWord bool) {
	for {
		v := c.Load()
		switch {
		case inGen(v, g):
			if !c.CompareAndSwap(v, v-n) {
				continue
			}
			return true
		case sealedIn(v, g):
			w.backOut(b, start, g, n)
		default:
			w.corrected(start, n)
		}
		return false
	}
}

// backOut takes back n passes of generation g that bucket b, which then
// started at start, counted when it froze: out of its frozen passes, or,
// once it retired (its frozen passes sealed and handed over, or the bucket
// reused), out of its hand-over.
func (w *Window) backOut(b *ring.WindowWrap[bucket], start, g, n int64) {
	if !addIn(&b.Value.fz[Pass], g, -n) {
		w.corrected(start, n)
		return
	}
	// The frozen rest cached in the head may hold the passes: clear it.
	// A fill that read the count before our add has not stored yet (it
	// then fails) or has (we clear it); one that starts later reads it.
	w.arr.Head().Value.rest.Store(sumUnknown)
}

// corrected hands over the taking back of n passes from the retired bucket
// that started at start.
func (w *Window) corrected(start, n int64) {
	if w.handover != nil {
		w.handover(start, Counts{Pass: -n, MinRT: -1})
	}
	w.arr.Head().Value.rest.Store(sumUnknown)
}

// retire seals a bucket leaving the ring and hands its counts over.
func (w *Window) retire(old *ring.WindowWrap[bucket]) {
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
