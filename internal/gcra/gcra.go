// Package gcra is the generic cell rate algorithm: a token bucket kept as
// one number, the theoretical arrival time of the next request at the
// sustained rate, so that taking tokens is one compare-and-swap.
//
// Package flow's GCRA rules (Behavior GCRA, and a Global GCRA rule's local
// fallback) are a Cell, kept across reloads, and a Limiter on it, made
// from the rule. Times are int64 nanoseconds of the caller's clock, passed in, so
// tests drive it with plain numbers.
package gcra

import (
	"math"

	"go.uber.org/atomic"
)

// Cell is a bucket's state: the theoretical arrival time (ns) of the next
// request at the sustained rate. The bucket is full when it is at or
// before now; the zero Cell is full at any now >= 0. A Cell is safe for
// simultaneous use by multiple goroutines and must not be copied after
// first use.
type Cell struct{ tat atomic.Int64 }

// Limiter takes tokens from a Cell at a rate and burst: every token costs
// interval ns, and the bucket holds tolerance ns of them (burst x
// interval). A rule set makes one per rule over the rule's Cell, which
// outlives it; the cell pointer comes first so that a Limiter at the
// start of its holder's struct is passed as the holder's own pointer.
type Limiter struct {
	c                   *Cell
	interval, tolerance int64
	burst               int64
	off                 bool // a rate of 0: refuses everything
}

// New returns the limiter of perSecond tokens a second and a bucket of
// burst tokens on cell c. perSecond is at most 1e12 (a token costs whole
// nanoseconds, at least 1); 0 (or less) refuses everything.
func New(c *Cell, perSecond float64, burst int64) Limiter {
	l := Limiter{c: c, burst: burst, off: perSecond <= 0}
	if !l.off {
		l.interval = max(int64(math.Round(1e9/perSecond)), 1)
		l.tolerance = l.interval * l.burst
	}
	return l
}

// Take takes n tokens at now if they are there within maxWait, and
// returns how long the caller waits for them and the arrival time it set
// (its token for Give). Refused, it reports when they would be there
// (retry, -1 when never: a rate of 0 or more than burst) and how long
// until the bucket is full again (reset, -1 when never). n times the
// interval and maxWait must not overflow with now (flow validates both).
func (l *Limiter) Take(now, n, maxWait int64) (wait, tok int64, ok bool, retry, reset int64) {
	if l.off || n > l.burst {
		return 0, 0, false, -1, -1
	}
	cost := n * l.interval // at most 30 days in flow (validated): no overflow
	for {
		tat := l.c.tat.Load()
		next := max(tat, now) + cost
		over := next - now - l.tolerance // maxWait <= flow's longestWait: no overflow
		if over > maxWait {
			return 0, 0, false, over, max(tat-now, 0)
		}
		if l.c.tat.CompareAndSwap(tat, next) {
			return max(over, 0), next, true, 0, 0
		}
		// Another request moved the arrival time: take from where it is.
	}
}

// Room is how long from now until n tokens are there, taking none (Take's
// retry with no wait allowed): 0 when they are there now, -1 when never.
func (l *Limiter) Room(now, n int64) int64 {
	if l.off || n > l.burst {
		return -1
	}
	return max(max(l.c.tat.Load(), now)+n*l.interval-now-l.tolerance, 0)
}

// Left returns how many tokens are there at now, and how long (ns) until
// the bucket is full again.
func (l *Limiter) Left(now int64) (tokens, reset int64) {
	if l.off {
		return 0, -1
	}
	owed := max(l.c.tat.Load()-now, 0)
	return max((l.tolerance-owed)/l.interval, 0), owed
}

// Give gives back n tokens that Take took, setting arrival time tok (the
// request was not admitted in the end), if no request has taken tokens
// since: the arrival time moves back by their cost. Once another request
// took tokens after them, they stay spent: moving the arrival time back
// under that request's would hand its tokens out a second time (two
// requests on one slot), so the cancelled request errs towards blocking.
func (l *Limiter) Give(n, tok int64) { l.c.tat.CompareAndSwap(tok, tok-n*l.interval) }

// Rescale makes the tokens owed on c at now, taken at one rate, owed at a
// rate ratio times slower (ratio is the old rate over the new): the time
// its arrival time is ahead of now is ratio times as long, rounded up, so
// what was taken stays taken under the new rate.
func (c *Cell) Rescale(now int64, ratio float64) {
	if ratio == 1 || !(ratio > 0) || math.IsInf(ratio, 0) {
		return
	}
	for {
		tat := c.tat.Load()
		if tat <= now {
			return
		}
		ahead := math.Ceil(float64(tat-now) * ratio)
		next := now + int64(min(ahead, float64(math.MaxInt64/4)))
		if c.tat.CompareAndSwap(tat, next) {
			return
		}
	}
}
