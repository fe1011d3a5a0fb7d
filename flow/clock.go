package flow

import (
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/stat"
)

// steady is engine time over a clock that may step back: readings plus an
// offset that grows by the size of every step back of stepTolerance or
// more, so engine time continues from where it was. A clock stepped back
// under load would otherwise stall admission for the size of the step
// (every time is clamped to the newest bucket, which stays full), and one
// stepped forward and back for the forward step. Smaller steps back pass
// through and are clamped: absorbing them would let a clock whose readings
// jitter ratchet engine time ahead of it (each step back absorbed, each
// step forward kept), and the stall they cause is at most their size.
type steady struct {
	c stat.Clock
	// origin is set when c is stat's monotonic clock: read directly, it
	// costs no interface call.
	origin time.Time
	mono   bool
	// off is added to every reading; it only grows.
	off atomic.Int64
	_   [cpu.CacheLine - 8]byte
	// hi is the engine time reached, published at most once per
	// publishEvery of progress (a store per read would take the line from
	// every reader).
	hi atomic.Int64
	_  [cpu.CacheLine - 8]byte
}

// stepTolerance is the smallest step back that engine time absorbs, and
// publishEvery how far engine time moves between two stores of hi.
const (
	stepTolerance = int64(100 * time.Millisecond)
	publishEvery  = int64(time.Millisecond)
)

// engineLimit bounds engine time below the top of int64, where the windows'
// arithmetic would overflow: a reading past it at the start is a step, and
// engine time starts at 0; engine time that reaches it stays there (a clock
// of Unix nanoseconds reaches it in the year 2116). Readings and offsets
// may wrap around int64 (a clock built on an unset time.Time reads near its
// bottom); their sum is what counts, and modular arithmetic keeps it right.
const engineLimit = int64(1) << 62

func (s *steady) Now() int64 {
	// hi before the reading: a reading taken after hi was published and
	// still behind it is a real step back, not a reader that was
	// descheduled between its reading and its check.
	o := s.off.Load()
	h := s.hi.Load()
	var r int64
	if s.mono {
		r = int64(time.Since(s.origin))
	} else {
		r = s.c.Now()
	}
	t := r + o
	if t > h-stepTolerance && t <= engineLimit {
		if t >= h+publishEvery {
			s.hi.CompareAndSwap(h, t) // another reader may publish first
		}
		return max(t, 0)
	}
	return s.step(o, h, r)
}

// step is Now for a reading r that stepped back (or past the limit) with
// offset o and hi h: engine time continues from hi.
func (s *steady) step(o, h, r int64) int64 {
	for {
		if s.off.CompareAndSwap(o, h-r) {
			return h
		}
		// Another reader moved the offset: read again.
		o = s.off.Load()
		h = s.hi.Load()
		r = s.c.Now()
		t := r + o
		if t > h-stepTolerance && t <= engineLimit {
			return max(t, 0)
		}
	}
}
