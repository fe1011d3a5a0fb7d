package window

import (
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

// backOut finishes taking back n passes from bucket b, given the value the
// taking back returned. If b froze in between, its frozen count holds the
// passes: take them back there. If it also retired, its hand-over counted
// them: correct that.
func (w *Window) backOut(b *ring.WindowWrap[bucket], v, n int64) {
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
