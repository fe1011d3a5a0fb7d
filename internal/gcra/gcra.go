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
	stdatomic "sync/atomic"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// Cell is a bucket's state: the theoretical arrival time (ns) of the next
// request at the sustained rate. The bucket is full when it is at or
// before now; the zero Cell is full at any now >= 0. A Cell is safe for
// simultaneous use by multiple goroutines and must not be copied after
// first use.
//
// # Lanes
//
// Every token is a slot on the arrival-time line, interval ns long, and
// a request taking n tokens at now takes the n slots after max(tat,
// now). That keeps every span of L ns within burst + rate x L: a token
// taken at now has its slot's end in [now + interval, now + tolerance],
// and no two slots overlap, so the tokens taken within a span fit in a
// stretch of L + tolerance ns.
//
// A compare-and-swap of the one arrival time on every request would not
// scale with cores, so TakeOn leases each P's lane a run of slots (at
// most 50 µs of them, and an eighth of the burst over all lanes): the
// cell's arrival time moves past the run, and the P's requests take
// their slots from it by a compare-and-swap on the lane's own cache
// line, as the cell would (after max(lane, now), within tolerance of
// now). Every slot still goes to one request and ends within [now +
// interval, now + tolerance] of its taker, so the bound holds exactly.
// A request that finds no room in its lane gives the run's unused slots
// back to the cell if no later run was leased, and then leases a new run
// or takes from the cell: a single goroutine's decisions are exactly the
// cell's, which are x/time/rate's. Under contention, what the other
// lanes hold unused is withheld from a P until it passes.
type Cell struct {
	tat atomic.Int64
	// lanes is nil until the first TakeOn. The standard library's
	// pointer: one wrapper less keeps TakeOn's lane path short.
	lanes stdatomic.Pointer[lanes]
	// Lines of its own (two: some cores fetch lines in pairs): every
	// request reads it.
	_ [2*cpu.CacheLine - 16]byte
}

// lanes are a cell's per-P runs of leased slots (see Cell).
type lanes struct {
	l    []lane
	mask int
}

// lane is one P's run of slots: the ones after next up to end (end
// included), the lane's own whenever next is not locked. next is locked
// while a request gives the run back or leases a new one; end only ever
// grows (a lease that would end earlier takes from the cell instead), so
// a request that read next and then end, and swaps next from what it
// read, takes only the lane's own slots, whatever runs came and went in
// between (tokens given back can bring next back to what it read).
type lane struct {
	next, end atomic.Int64 // two lines, as Cell
	_         [2*cpu.CacheLine - 16]byte
}

// locked marks a lane being given back or leased: above every clock, so
// that max(locked, now) + cost passes every run's end and no request takes
// from it meanwhile, and low enough that adding a cost (at most 30 days
// in flow, under 2^52 ns) does not overflow.
const locked = math.MaxInt64 - 1<<52

// maxRun bounds one lease of slots, in ns: long enough that a busy P
// leases once per thousands of requests, short enough that what it
// withholds passes quickly.
const maxRun = 50_000

// lanesOf returns the cell's lanes, made on first use.
func (c *Cell) lanesOf() *lanes {
	if ls := c.lanes.Load(); ls != nil {
		return ls
	}
	return c.makeLanes()
}

func (c *Cell) makeLanes() *lanes {
	n := cpu.Stripes()
	c.lanes.CompareAndSwap(nil, &lanes{l: make([]lane, n), mask: n - 1})
	return c.lanes.Load()
}

// head is the arrival time the cell's next request would start from on
// the P whose run is the cell's latest lease: that run's next, not the
// cell's, while it has unused slots (what Left reports). It reads every
// lane.
func (c *Cell) head() int64 {
	tat := c.tat.Load()
	if ls := c.lanes.Load(); ls != nil {
		for i := range ls.l {
			ln := &ls.l[i]
			if at := ln.next.Load(); at < tat && ln.end.Load() == tat {
				return at
			}
		}
	}
	return tat
}

// giveBack gives the cell the unused slots of a run a request locked
// (lane next was at), if no later slot was taken from the cell, and
// reports whether it did.
func (c *Cell) giveBack(ln *lane, at int64) bool {
	end := ln.end.Load()
	return at < end && c.tat.CompareAndSwap(end, at)
}

// Limiter takes tokens from a Cell at a rate and burst: every token costs
// interval ns, and the bucket holds tolerance ns of them (burst x
// interval). A rule set makes one per rule over the rule's Cell, which
// outlives it; the cell pointer comes first so that a Limiter at the
// start of its holder's struct is passed as the holder's own pointer.
type Limiter struct {
	c                   *Cell
	interval, tolerance int64
	burst               int64
	// run is how many ns of slots a lane leases (0: lanes are off, the
	// burst too small to share).
	run int64
	off bool // a rate of 0: refuses everything
}

// New returns the limiter of perSecond tokens a second and a bucket of
// burst tokens on cell c. perSecond is at most 1e12 (a token costs whole
// nanoseconds, at least 1); 0 (or less) refuses everything.
func New(c *Cell, perSecond float64, burst int64) Limiter {
	l := Limiter{c: c, burst: burst, off: perSecond <= 0}
	if !l.off {
		l.interval = max(int64(math.Round(1e9/perSecond)), 1)
		l.tolerance = l.interval * l.burst
		// At most an eighth of the burst over all lanes, in whole
		// tokens, and two tokens at least.
		run := min(maxRun, l.tolerance/int64(8*cpu.Stripes()))
		if run -= run % l.interval; run >= 2*l.interval {
			l.run = run
		}
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
	return l.take(now, n, maxWait)
}

// TakeOn is Take by a request on P p (cpu.Pin's hint; any value is
// correct): from p's lane of the cell (see Cell).
func (l *Limiter) TakeOn(p int, now, n, maxWait int64) (wait, tok int64, ok bool, retry, reset int64) {
	if ls := l.c.lanes.Load(); ls != nil && l.run != 0 && n <= l.burst {
		ln := &ls.l[p&ls.mask]
		at := ln.next.Load()
		// next before end: the slots after next up to the lane's end are
		// its own whenever next is not locked, and the end never comes
		// down, so an end read after next bounds them even if the run was
		// replaced and next came back to at meanwhile (see lane).
		next := max(at, now) + n*l.interval
		if next <= ln.end.Load() && next-now <= l.tolerance && ln.next.CompareAndSwap(at, next) {
			return 0, next, true, 0, 0
		}
	}
	return l.takeOff(p, now, n, maxWait)
}

// takeOff is TakeOn off its lane: it gives the lane's run back and
// leases a new one, or takes from the cell.
func (l *Limiter) takeOff(p int, now, n, maxWait int64) (wait, tok int64, ok bool, retry, reset int64) {
	if l.run == 0 || n > l.burst { // lanes off for the rule, or never room
		return l.take(now, n, maxWait)
	}
	cost := n * l.interval
	ls := l.c.lanesOf()
	ln := &ls.l[p&ls.mask]
	at := ln.next.Load()
	next := max(at, now) + cost
	end := ln.end.Load()
	if next <= end && next-now <= l.tolerance && ln.next.CompareAndSwap(at, next) {
		return 0, next, true, 0, 0 // the lanes were just made, or the lane moved
	}
	if at != locked && (at < end || 2*cost <= l.run && l.c.tat.Load() <= now+l.tolerance-2*cost) {
		// A run to give back, or room for a new one.
		if tok, ok := l.relane(ln, at, now, cost); ok {
			return 0, tok, true, 0, 0
		}
	}
	return l.take(now, n, maxWait)
}

// relane gives back the run of lane ln (its next was at) and leases it a
// new one, taking cost ns of it at now. It reports false when another
// request holds the lane, or a run would not hold two requests of cost:
// the caller takes from the cell.
func (l *Limiter) relane(ln *lane, at, now, cost int64) (int64, bool) {
	if !ln.next.CompareAndSwap(at, locked) {
		return 0, false
	}
	gave := l.c.giveBack(ln, at)
	for {
		tat := l.c.tat.Load()
		from := max(tat, now)
		end := min(from+l.run, now+l.tolerance) // every slot within tolerance of now
		// A run never ends before the lane's last: a request that read
		// that end may still take up to it (see lane).
		if end-from < 2*cost || 2*cost > l.run || end < ln.end.Load() {
			if gave {
				at = max(at, ln.end.Load()) // the run is the cell's again
			}
			ln.next.Store(at)
			return 0, false
		}
		if l.c.tat.CompareAndSwap(tat, end) {
			ln.end.Store(end) // first: see TakeOn
			ln.next.Store(from + cost)
			return from + cost, true
		}
	}
}

// take takes from the cell.
func (l *Limiter) take(now, n, maxWait int64) (wait, tok int64, ok bool, retry, reset int64) {
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
	owed := max(l.c.head()-now, 0)
	return max((l.tolerance-owed)/l.interval, 0), owed
}

// Give gives back n tokens that Take took, setting arrival time tok (the
// request was not admitted in the end), if no request has taken tokens
// since: the arrival time moves back by their cost. Once another request
// took tokens after them, they stay spent: moving the arrival time back
// under that request's would hand its tokens out a second time (two
// requests on one slot), so the cancelled request errs towards blocking.
// It reports whether they went back.
func (l *Limiter) Give(n, tok int64) bool { return l.c.tat.CompareAndSwap(tok, tok-n*l.interval) }

// GiveOn is Give for tokens TakeOn took on P p: back to p's lane if they
// came from its run and no request took after them there, else as Give.
// Each token must be given back at most once (as with Give: a second
// give can hand out slots another request holds).
func (l *Limiter) GiveOn(p int, n, tok int64) bool {
	if ls := l.c.lanes.Load(); ls != nil {
		if ls.l[p&ls.mask].next.CompareAndSwap(tok, tok-n*l.interval) {
			return true
		}
	}
	return l.Give(n, tok)
}

// Rescale makes the tokens owed on c at now, taken at one rate, owed at a
// rate ratio times slower (ratio is the old rate over the new): the time
// its arrival time is ahead of now is ratio times as long, rounded up, so
// what was taken stays taken under the new rate.
func (c *Cell) Rescale(now int64, ratio float64) {
	if ratio == 1 || !(ratio > 0) || math.IsInf(ratio, 0) {
		return
	}
	c.drainLanes()
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

// drainLanes gives back or ends every lane's run: what they hold was
// leased at the old rate. A lane another request holds is left to it.
func (c *Cell) drainLanes() {
	ls := c.lanes.Load()
	if ls == nil {
		return
	}
	for i := range ls.l {
		ln := &ls.l[i]
		at := ln.next.Load()
		if at == locked || !ln.next.CompareAndSwap(at, locked) {
			continue
		}
		c.giveBack(ln, at)
		ln.next.Store(max(at, ln.end.Load()))
	}
}
