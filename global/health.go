package global

// A limit's health on Redis (failures, backoff, probes) and Stats.

import (
	"errors"
	"time"

	"go.uber.org/atomic"
)

// health is a limit's health (in a Redis Cluster a limit fails with its
// node): calls and probes failed in a row, the clock reading before which
// calls are refused (0: healthy), and whether a probe is out.
type health struct {
	failures, probeFails, downUntil atomic.Int64
	probing                         atomic.Bool
}

// ErrUnavailable is returned while the Source backs off a failing Redis.
var ErrUnavailable = errors.New("global: redis unavailable (backing off)")

// callable returns errClosed after Close and ErrUnavailable while backing
// off; once the backoff ends it lets one call through to probe.
func (s *Source) callable(l *health) (probe bool, err error) {
	if s.closed.Load() {
		return false, errClosed
	}
	until := l.downUntil.Load()
	if until == 0 {
		return false, nil
	}
	if s.opts.Clock.Now() < until || !l.probing.CompareAndSwap(false, true) {
		return false, ErrUnavailable
	}
	return true, nil
}

// fail counts a failed call. After FailAfter in a row the Source backs
// off; the backoff doubles after every FailAfter failed probes, so neither
// one unlucky probe nor the calls of many limits failing together double
// it.
func (s *Source) fail(l *health, probe bool) { s.failAs(l, probe, false) }

// failAs is fail; a probe whose dial failed (quick: a refused connection,
// which costs Redis nothing) does not double the backoff, so that a
// restarted Redis is found within a Backoff of coming back, however long
// it was down.
func (s *Source) failAs(l *health, probe, quick bool) {
	s.errs.Inc()
	f := l.failures.Inc()
	k := int64(s.opts.FailAfter)
	if f < k {
		return
	}
	probes := l.probeFails.Load()
	if probe {
		if !quick {
			probes = l.probeFails.Inc()
		}
		l.probing.Store(false)
	}
	// Backoff doubled, without overflow; a Backoff of 0 stays 0 (a probe
	// at once).
	backoff, shift := s.opts.MaxBackoff, min(probes/k, 30)
	if s.opts.Backoff <= s.opts.MaxBackoff>>shift {
		backoff = s.opts.Backoff << shift
	}
	l.downUntil.Store(s.opts.Clock.Now() + int64(aligned(time.Now().UnixNano(), backoff)))
}

// aligned is how long from wall, a wall-clock reading (Unix ns), until the
// next multiple of backoff that is at least half of it away: a backoff
// ends on the wall clock's multiples of it, so that instances cut off
// together probe together, and come back within moments of each other
// once Redis does. An instance back long before the others would admit
// from a window that knows nothing of what they still admit on their own
// (all of it, after a Redis restarted empty).
func aligned(wall int64, backoff time.Duration) time.Duration {
	d := int64(backoff)
	if d <= 0 {
		return 0
	}
	at := wall + d/2
	return time.Duration((at/d+1)*d - wall)
}

// failed counts a call sent at sent (the Source's clock) that failed, as
// fail does, unless it took far longer than its CallTimeout allows: then
// this process was paused (SIGSTOP, a frozen container, a stalled VM)
// while the call ran, which says nothing of Redis. A paused call is not
// counted, and a backoff in force ends at once, so that the next request
// probes Redis: a process that was paused past the backoff's doubling
// would otherwise wait out a MaxBackoff it never earned.
func (s *Source) failed(l *health, probe bool, sent int64, err error) {
	if s.opts.Clock.Now()-sent <= int64(s.opts.CallTimeout+s.opts.CallTimeout/4) {
		var dial *DialError
		s.failAs(l, probe, errors.As(err, &dial))
		return
	}
	s.paused.Inc()
	if probe {
		l.probing.Store(false)
	}
	if l.downUntil.Load() != 0 {
		l.downUntil.Store(s.opts.Clock.Now())
	}
}

func (s *Source) succeed(l *health) {
	if l.downUntil.Load() != 0 || l.failures.Load() != 0 || l.probeFails.Load() != 0 {
		l.failures.Store(0)
		l.probeFails.Store(0)
		l.downUntil.Store(0)
	}
	l.probing.Store(false)
}

// Stats counts what a Source has done.
type Stats struct {
	Calls  int64 // round trips to Redis
	Errors int64 // calls that failed (timeouts included)
	// Refused counts requests answered ErrUnavailable while backing
	// off, and requests refused after Close.
	Refused int64
	// Late counts requests refused because no answer came within
	// WithTimeout while Redis was not known to be down.
	Late   int64
	Leased int64 // tokens leased beyond the requests that asked
	// Returned counts tokens given back unspent to their server bucket:
	// leases replaced before they expired, and tokens granted to requests
	// that had given up (their deadline passed or their context ended)
	// before the reply came.
	Returned int64
	// Paused counts calls that failed after far longer than their
	// CallTimeout: the process was paused while they ran, and they are
	// not counted as failures of Redis (see WithCallTimeout).
	Paused int64
}

// Stats returns the counts so far.
func (s *Source) Stats() Stats {
	return Stats{Calls: s.calls.Load(), Errors: s.errs.Load(), Refused: s.refused.Load(), Late: s.late.Load(),
		Leased: s.leased.Load(), Returned: s.returned.Load(), Paused: s.paused.Load()}
}
