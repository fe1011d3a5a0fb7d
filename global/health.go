package global

// A limit's health on Redis (failures, backoff, probes) and Stats.

import (
	"errors"

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
func (s *Source) fail(l *health, probe bool) {
	s.errs.Inc()
	f := l.failures.Inc()
	k := int64(s.opts.FailAfter)
	if f < k {
		return
	}
	var probes int64
	if probe {
		probes = l.probeFails.Inc()
		l.probing.Store(false)
	} else {
		probes = l.probeFails.Load()
	}
	backoff := s.opts.Backoff << min(probes/k, 30)
	if backoff > s.opts.MaxBackoff || backoff <= 0 {
		backoff = s.opts.MaxBackoff
	}
	l.downUntil.Store(s.opts.Clock.Now() + int64(backoff))
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
}

// Stats returns the counts so far.
func (s *Source) Stats() Stats {
	return Stats{Calls: s.calls.Load(), Errors: s.errs.Load(), Refused: s.refused.Load(), Late: s.late.Load(),
		Leased: s.leased.Load(), Returned: s.returned.Load()}
}
