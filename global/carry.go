package global

// What this instance admitted on its own while it fell back, carried into
// the limit's window on Redis once Redis answers again.

import (
	"strconv"
	"sync"
)

// carried is what the local fallback of a limit's rule admitted, by bucket
// of the limit's (the Source's clock): flow tells it of each admission
// (flow.LocalCounter). Every call to Redis carries the slots of the last
// window that Redis has not yet acknowledged into the limit's window
// there, placed by their age. A slot is sent as its running total, and
// the script keeps what it applied of each (this instance's, by slot), so
// a call that ran although its caller gave up on it (a timeout) and the
// call that sends the slot again count it once. Without it, an instance
// back on Redis after an outage admitted its share twice within a window:
// on its own, then again from a window that never heard of it (and a
// Redis restarted empty had heard of nobody).
type carried struct {
	mu    sync.Mutex
	blen  int64 // ns, a bucket of the limit
	slots []carriedSlot
	any   bool // some slot may have something to send
}

// carriedSlot is a bucket's admissions: total so far, acked as far as a
// successful call has applied them.
type carriedSlot struct{ idx, total, acked int64 }

// carry is one slot as a call sends it: its running total, placed age
// before the call.
type carry struct {
	idx, total int64
	age        int64 // µs from the slot's end to when the call was sent
}

func newCarried(window int64, buckets int) *carried {
	blen := max(window*1000/int64(buckets), 1)
	return &carried{blen: blen, slots: make([]carriedSlot, buckets+1)}
}

// pending reports whether some slot of the last window has admissions
// Redis has not acknowledged.
func (c *carried) pending(now, window int64) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.slots {
		if _, ok := c.waiting(s, now, window); ok {
			return true
		}
	}
	return false
}

// waiting reports whether slot s has admissions Redis has not acknowledged
// within the last window at now, and their age (µs from the slot's end).
func (c *carried) waiting(s carriedSlot, now, window int64) (age int64, ok bool) {
	age = max(now-(s.idx+1)*c.blen, 0) / 1000
	return age, s.total > s.acked && age < window
}

// add counts n admitted on its own at now. n < 0 gives back admissions
// counted before (a later rule refused the request): they come off the
// newest buckets whose admissions Redis has not acknowledged yet; what was
// sent already stays counted there (stricter, never looser).
func (c *carried) add(now, n int64) {
	if n < 0 {
		c.giveBack(-n)
		return
	}
	idx := now / c.blen
	c.mu.Lock()
	s := &c.slots[int(uint64(idx)%uint64(len(c.slots)))]
	if s.idx != idx {
		*s = carriedSlot{idx: idx}
	}
	s.total += n
	c.any = true
	c.mu.Unlock()
}

func (c *carried) giveBack(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n > 0 {
		var newest *carriedSlot
		for i := range c.slots {
			if s := &c.slots[i]; s.total > s.acked && (newest == nil || s.idx > newest.idx) {
				newest = s
			}
		}
		if newest == nil {
			return
		}
		d := min(n, newest.total-newest.acked)
		newest.total -= d
		n -= d
	}
}

// take returns the slots of the last window with something Redis has not
// acknowledged, placed at now (nil for a limit that carries nothing: a
// caller's limit of a PerKey rule).
func (c *carried) take(now, window int64) []carry {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.any {
		return nil
	}
	var out []carry
	c.any = false
	for _, s := range c.slots {
		if age, ok := c.waiting(s, now, window); ok {
			c.any = true
			out = append(out, carry{idx: s.idx, total: s.total, age: age})
		}
	}
	return out
}

// sent records what a successful call applied.
func (c *carried) sent(cs []carry) {
	if len(cs) == 0 {
		return
	}
	c.mu.Lock()
	for _, x := range cs {
		if s := &c.slots[int(uint64(x.idx)%uint64(len(c.slots)))]; s.idx == x.idx && x.total > s.acked {
			s.acked = x.total
		}
	}
	c.mu.Unlock()
}

// carryArgs are cs as the scripts take them: pairs of "c", the age, ":"
// and the slot's name (this instance's ID and the slot's index), and the
// slot's running total.
func carryArgs(args []any, cs []carry, id string) []any {
	for _, x := range cs {
		args = append(args, "c"+strconv.FormatInt(x.age, 10)+":"+id+strconv.FormatInt(x.idx, 36), x.total)
	}
	return args
}

// CountLocal implements flow.LocalCounter.
func (b *bound) CountLocal(n int64) {
	if !b.l.counting.Load() {
		b.l.counting.Store(true)
	}
	b.l.carried.add(b.s.opts.Clock.Now(), n)
}
