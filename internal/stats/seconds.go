package stats

import (
	"time"

	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/stat"
)

// secondFeed is a node's state for Registry.Seconds, guarded by the
// node's feedMu.
type secondFeed struct {
	// started is set by the node's first delivery; since is the first
	// second it can deliver whole (what was handed over before a feed
	// started is not kept), and fed where delivery stands: every second
	// before it was delivered.
	started    bool
	since, fed int64
	// lastEmitted is the latest second delivered: nothing goes out at or
	// before it again.
	lastEmitted int64
	// pending are the seconds handed over and not delivered, in order.
	pending []pendingSecond
	// late is what was handed over for a second after its delivery (a
	// pass taken back, a write that clamped into an old bucket): it goes
	// out with the next delivered second, as far as that stays at or above
	// zero.
	late window.Counts
	// fallbacks is the fallback total at the previous delivery.
	fallbacks int64
}

// pendingSecond is a second's counts, handed over and not delivered.
type pendingSecond struct {
	start int64
	c     window.Counts
}

// maxPending bounds a node's pending seconds: a feed that stops polling
// loses the oldest beyond it.
const maxPending = 64

// add adds c into the pending second that starts at start.
func (f *secondFeed) add(start int64, c window.Counts) {
	i := len(f.pending)
	for i > 0 && f.pending[i-1].start > start {
		i--
	}
	if i > 0 && f.pending[i-1].start == start {
		f.pending[i-1].c.Add(c)
		return
	}
	if len(f.pending) == maxPending {
		if i == 0 {
			return // older than all it keeps
		}
		copy(f.pending, f.pending[1:i])
		i--
		f.pending[i] = pendingSecond{start, c}
		return
	}
	f.pending = append(f.pending, pendingSecond{})
	copy(f.pending[i+1:], f.pending[i:])
	f.pending[i] = pendingSecond{start, c}
}

// handOver takes a bucket the second window hands over (in order or not,
// corrections included): into the minute window, and, once a feed
// started, into its second's pending counts or, if that second was
// delivered already, into late.
func (n *Node) handOver(start int64, c window.Counts) {
	n.feedMu.Lock()
	n.minute.Absorb(start, c)
	if f := &n.feed; f.started {
		switch s := start - start%second; {
		case s < f.since:
		case s < f.fed:
			f.late.Add(c)
		default:
			f.add(s, c)
		}
	}
	n.feedMu.Unlock()
	n.retiredPass.Add(c.Pass)
	n.retiredSuccess.Add(c.Success)
	n.retiredBlock.Add(c.Block)
}

// deliver hands fn each second of the node that completed by now (see
// Registry.Seconds); with partial, every second up to now's, the last one
// marked partial.
func (n *Node) deliver(now int64, partial bool, fn func(stat.Second)) {
	n.second.Settle(now)
	if partial {
		// The seconds not handed over yet are read from the second window
		// too: under its rotation lock, no bucket is between the two.
		n.second.Locked(func() { n.deliverLocked(now, partial, fn) })
		return
	}
	n.deliverLocked(now, partial, fn)
}

func (n *Node) deliverLocked(now int64, partial bool, fn func(stat.Second)) {
	// After Settle, every bucket that ended a window or more before now
	// was handed over: the seconds before hi are complete.
	hi := now - second
	hi -= hi % second
	if partial {
		// Up to the newest bucket's second: a write that clamped into it
		// may be ahead of now.
		c := n.second.Clamp(now)
		hi = c - c%second + second
	}
	n.feedMu.Lock()
	defer n.feedMu.Unlock()
	f := &n.feed
	if !f.started {
		// From the current second on, every bucket is handed over after
		// this: the second window still holds all of the current second
		// (a bucket leaves it a window after it ends), so those seconds
		// are whole, this one too.
		f.started = true
		f.since = now - now%second
		f.fed = f.since
		f.fallbacks = n.fallbacks.Load()
		if !partial {
			return
		}
	}
	if partial {
		for b := max(f.fed, hi-3*second); b < hi; b += second { // the ring holds under 2 s
			if c := n.second.CountsRange(b, b+second); !c.Zero() {
				f.add(b, c)
			}
		}
	}
	// Late counts and fallbacks go out with the first second delivered
	// now, but a count never goes below zero in a second: what a second
	// cannot take (a pass taken back) waits in late for later ones, so
	// sums only grow and each second goes out once, in order.
	total := n.fallbacks.Load()
	fallbacks := total - f.fallbacks
	k := 0
	for ; k < len(f.pending) && f.pending[k].start < hi; k++ {
		p := f.pending[k]
		if p.start <= f.lastEmitted {
			f.late.Add(p.c) // cannot happen but after a clock step back: kept for later
			continue
		}
		absorb(&p.c, &f.late)
		fb := fallbacks
		fallbacks = 0
		if n.emit(p.start, p.c, fb, partial && p.start+second > now, fn) {
			f.lastEmitted = p.start
		} else {
			fallbacks = fb
		}
	}
	if last := hi - second; (positive(f.late) || fallbacks != 0) && last > f.lastEmitted && last >= f.since {
		var c window.Counts
		c.MinRT = -1
		absorb(&c, &f.late)
		if n.emit(last, c, fallbacks, partial, fn) {
			f.lastEmitted, fallbacks = last, 0
		}
	}
	f.fallbacks = total - fallbacks
	f.pending = f.pending[:copy(f.pending, f.pending[k:])]
	f.fed = max(f.fed, hi)
}

// recent hands fn each second of the last minute before where the node's
// feed stands (every second before it was delivered, or, for a feed that
// started this second, what came before): the minute window's seconds,
// with the buckets of them the second window still holds (read under its
// rotation lock, so that no bucket is between the two). Counts that
// reached a delivered second late are in its second here, and wait in
// late for the next delivery too: they are taken off the newest second
// handed out here, so that a subscriber counts each once. A node whose
// feed did not start yet hands out nothing (it is new since the last
// delivery).
func (n *Node) recent(fn func(stat.Second)) {
	n.second.Locked(func() {
		n.feedMu.Lock()
		defer n.feedMu.Unlock()
		f := &n.feed
		if !f.started {
			return
		}
		lo := f.fed - minute
		var secs [minute / second]window.Counts
		for i := range secs {
			secs[i].MinRT = -1
		}
		add := func(start int64, c window.Counts) {
			if i := (start - start%second - lo) / second; start >= lo && i < int64(len(secs)) {
				secs[i].Add(c)
			}
		}
		n.minute.CountsEach(lo, f.fed, add)
		n.second.CountsEach(lo, f.fed, add)
		late := f.late
		for i := len(secs) - 1; i >= 0; i-- {
			if !secs[i].Zero() {
				for _, p := range [...][2]*int64{{&secs[i].Pass, &late.Pass}, {&secs[i].Block, &late.Block},
					{&secs[i].Success, &late.Success}, {&secs[i].Exception, &late.Exception}, {&secs[i].RT, &late.RT},
					{&secs[i].Occupied, &late.Occupied}} {
					*p[0] = max(*p[0]-*p[1], 0)
				}
				break
			}
		}
		for i, c := range secs {
			if s := lo + int64(i)*second; s >= 0 {
				n.emit(s, c, 0, false, fn)
			}
		}
	})
}

// absorb moves late's counts into c as far as c stays at or above zero;
// what c cannot take stays in late.
func absorb(c, late *window.Counts) {
	for _, p := range [...][2]*int64{{&c.Pass, &late.Pass}, {&c.Block, &late.Block}, {&c.Success, &late.Success},
		{&c.Exception, &late.Exception}, {&c.RT, &late.RT}, {&c.Occupied, &late.Occupied}} {
		if v := *p[0] + *p[1]; v >= 0 {
			*p[0], *p[1] = v, 0
		} else {
			*p[0], *p[1] = 0, v
		}
	}
	if late.MinRT >= 0 && (c.MinRT < 0 || late.MinRT < c.MinRT) {
		c.MinRT = late.MinRT
	}
	c.MaxConcurrency = max(c.MaxConcurrency, late.MaxConcurrency)
	late.MinRT, late.MaxConcurrency = -1, 0
}

// positive reports whether c holds a count above zero.
func positive(c window.Counts) bool {
	return c.Pass > 0 || c.Block > 0 || c.Success > 0 || c.Exception > 0 || c.RT > 0 || c.Occupied > 0 ||
		c.MinRT >= 0 || c.MaxConcurrency > 0
}

// emit hands fn the second starting at start, if it holds anything.
func (n *Node) emit(start int64, c window.Counts, fallbacks int64, partial bool, fn func(stat.Second)) bool {
	if c.Zero() && fallbacks == 0 {
		return false
	}
	sec := stat.Second{
		Resource: n.resource, Start: start,
		Pass: c.Pass, Block: c.Block, Success: c.Success, Exception: c.Exception, Occupied: c.Occupied,
		RT: time.Duration(c.RT), MaxConcurrency: c.MaxConcurrency, Fallbacks: fallbacks, Partial: partial,
	}
	if c.MinRT >= 0 {
		sec.MinRT = time.Duration(c.MinRT)
	}
	fn(sec)
	return true
}
