package flow

import (
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/stat"
)

// steady is engine time over a clock that may step back: readings plus an
// offset that grows by the size of every step back, so engine time
// continues from where it was. A clock stepped back under load would
// otherwise stall admission for the size of the step (every time is clamped
// to the newest bucket, which stays full), and one stepped forward and back
// for the forward step.
type steady struct {
	c stat.Clock
	// off is added to every reading; it only grows.
	off atomic.Int64
	_   [cpu.CacheLine - 8]byte
	// hi is the engine time reached, published at most once per stepSlack
	// of progress (a store per read would take the line from every reader),
	// so a read may be up to stepSlack behind it without being a step.
	hi atomic.Int64
	_  [cpu.CacheLine - 8]byte
}

// stepSlack is the largest step back that passes through as it is (the
// windows clamp it to their newest bucket): clocks read by many goroutines
// are rarely monotonic to the nanosecond.
const stepSlack = int64(time.Millisecond)

// engineLimit bounds engine time far below the top of int64, where the
// windows' arithmetic would overflow: a reading that would pass it is a
// step, like a step back. Readings and offsets may wrap around int64 (a
// clock built on an unset time.Time reads near its bottom); their sum is
// what counts, and modular arithmetic keeps it right.
const engineLimit = int64(1) << 60

func (s *steady) Now() int64 {
	for {
		// hi before the reading: a reading taken after hi was published and
		// still behind it is a real step back, not a reader that was
		// descheduled between its reading and its check.
		o := s.off.Load()
		h := s.hi.Load()
		r := s.c.Now()
		t := r + o
		if t >= h-stepSlack && t <= engineLimit {
			if t >= h+stepSlack {
				s.hi.CompareAndSwap(h, t) // another reader may publish first
			}
			return max(t, 0)
		}
		// A step back (or past the limit): continue from hi.
		if s.off.CompareAndSwap(o, h-r) {
			return h
		}
	}
}
