package global

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
)

// maxGCRATolerance bounds a bucket's tolerance (ns) so that the script's
// arithmetic stays exact (see gcraScript): 30 days, as flow allows.
const maxGCRATolerance = int64(30 * 24 * time.Hour)

// gcraLimit is the state of one Global GCRA rule's bucket in this
// instance: its keys, its health and its last refusal. It has no lease:
// a bucket's tokens belong to no window that could expire them, so an
// instance holding some would hold them from the others for good; every
// decision is one call.
type gcraLimit struct {
	tat string // the TAT's key
	*health
	// checking is set while a call apart checks Redis (see checkGCRA).
	checking atomic.Bool
	// closed is the last refusal: requests of need or more are refused
	// without a call until until (the Source's clock), when that many
	// tokens are back at the earliest.
	closed atomic.Pointer[closedWindow]
}

// gcraKey returns a GCRA limit's key: a shape of its own ("gcra"), never
// a window's, so that a GCRA rule and a window rule of the same ID are two
// limits and no key is read by both scripts.
func gcraKey(prefix, key string) string {
	return prefix + ":" + hashTag(key) + ":" + keySchema + "/gcra"
}

func (s *Source) gcraLimitFor(key string) *gcraLimit {
	if l, ok := s.gcras.Load(key); ok {
		return l.(*gcraLimit)
	}
	l, _ := s.gcras.LoadOrStore(key, &gcraLimit{tat: gcraKey(s.opts.Prefix, key), health: &health{}})
	return l.(*gcraLimit)
}

// gcraBound is a Global GCRA rule bound to its bucket. Instances share
// the bucket by the rule's key whatever their rates: during a rolling
// change of the rule each applies its own rate and burst to the shared
// TAT, so the bucket admits at most what the larger of the two would.
type gcraBound struct {
	s *Source
	l *gcraLimit
	// interval is what a token costs (ns, at least 1), tolerance the
	// bucket (Burst x interval); off: Threshold 0, refuse everything.
	interval, tolerance, burst int64
	off                        bool
	err                        error // a rule the script cannot keep exact
}

func (s *Source) gcraBoundFor(req flow.GlobalRequest) *gcraBound {
	b := &gcraBound{s: s, l: s.gcraLimitFor(req.Key), burst: req.Burst}
	switch {
	case math.IsNaN(req.Threshold) || req.Threshold < 0 || req.Burst < 1:
		b.err = fmt.Errorf("global: GCRA limit %q: Threshold must be >= 0 and Burst >= 1, got %g and %d", req.Key, req.Threshold, req.Burst)
	case req.Threshold == 0:
		b.off = true
	default:
		// Whole nanoseconds per token, as the local GCRA rule.
		b.interval = max(int64(math.Round(1e9/req.Threshold)), 1)
		if b.interval > maxGCRATolerance/b.burst {
			b.err = fmt.Errorf("global: GCRA limit %q: Burst %d at Threshold %g takes more than 30 days to refill", req.Key, req.Burst, req.Threshold)
		}
		b.tolerance = b.interval * b.burst
	}
	return b
}

// Acquire implements flow.BoundSource: one call to Redis, unless n is
// more than the bucket holds (refused, no call), Redis refused n or less
// earlier and said the tokens are not back yet, or the Source backs off.
func (b *gcraBound) Acquire(ctx context.Context, n int64) (bool, error) {
	return b.s.acquireGCRA(ctx, b, n)
}

// RetryIn implements flow.RetryHinter: how long until n tokens are back,
// as Redis said when it last refused as many (counted from when the call
// was sent); unknown for more than the bucket holds, which never fits.
func (b *gcraBound) RetryIn(n int64) (time.Duration, bool) {
	if b.off || n > b.burst {
		return 0, false
	}
	c := b.l.closed.Load()
	now := b.s.opts.Clock.Now()
	if c == nil || now >= c.until || n < c.need {
		return 0, false
	}
	return time.Duration(c.until - now), true
}

// acquireGCRA asks Redis for n tokens of b's bucket: one call, made by
// the request itself (a hand-off to another goroutine cost as much as the
// script), bounded by WithTimeout and ctx. A reply later than Timeout
// refuses the request (Stats.Late) and is no evidence that Redis is down:
// a call apart, bounded by CallTimeout, then finds out (one at a time per
// limit), so a Redis that stops answering trips the same backoff as for a
// window rule, after FailAfter such calls fail.
func (s *Source) acquireGCRA(ctx context.Context, b *gcraBound, n int64) (ok bool, err error) {
	if b.err != nil {
		return false, b.err
	}
	if b.off || n > b.burst {
		return false, nil // never fits
	}
	l := b.l
	now := s.opts.Clock.Now()
	if c := l.closed.Load(); c != nil && now < c.until && n >= c.need {
		// Redis said the tokens are not back before then.
		return false, nil
	}
	if s.closed.Load() {
		s.refused.Inc()
		return false, nil
	}
	if until := l.downUntil.Load(); until != 0 {
		// Backing off: the request falls back at once; once the backoff
		// ends one call probes Redis in the background (for no token).
		if now >= until && !l.probing.Load() {
			s.checkGCRA(b)
		}
		s.refused.Inc()
		return false, ErrUnavailable
	}
	probe, err := s.callable(l.health)
	if err != nil {
		return false, err
	}
	defer func() {
		if v := recover(); v != nil {
			s.fail(l.health, probe)
			panic(v) // to flow, which fails over
		}
	}()
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	d, err := s.takeGCRA(cctx, b, n)
	cancel()
	switch {
	case err == nil:
	case ctx.Err() != nil:
		return false, ctx.Err() // the caller gave up: says nothing of Redis
	case s.closed.Load():
		s.refused.Inc()
		return false, nil
	case cctx.Err() != nil:
		s.late.Inc()
		if probe {
			l.probing.Store(false)
		}
		s.checkGCRA(b)
		return false, nil
	default:
		s.fail(l.health, probe)
		return false, err
	}
	s.decided(l, now, n, d)
	if !d.Allowed {
		return false, nil
	}
	s.admitted(d.ServerTime, n)
	return true, nil
}

// decided records a call's answer in its limit: Redis is healthy, and a
// refusal's retry-after.
func (s *Source) decided(l *gcraLimit, sent, n int64, d gcraDecision) {
	s.succeed(l.health)
	if !d.Allowed && d.RetryAfter > 0 && n > 0 {
		// The tokens are not back before then (server time, read after
		// we sent): refuse locally until sent + RetryAfter.
		l.closed.Store(&closedWindow{until: sent + int64(d.RetryAfter), need: n})
	}
}

// checkGCRA asks Redis, in the background and for no token, whether it
// answers within CallTimeout, unless a check of the limit is out: a probe
// after a backoff, or the check after a late reply. It tells the limit's
// health what it finds.
func (s *Source) checkGCRA(b *gcraBound) {
	l := b.l
	if !l.checking.CompareAndSwap(false, true) {
		return
	}
	if !s.goCall(func() {
		defer l.checking.Store(false)
		probe, err := s.callable(l.health)
		if err != nil {
			return
		}
		defer func() {
			if v := recover(); v != nil {
				s.fail(l.health, probe)
				panic(v) // to goCall, which ends it
			}
		}()
		ctx, cancel := context.WithTimeout(s.ctx, s.opts.CallTimeout)
		defer cancel()
		sent := s.opts.Clock.Now()
		d, err := s.takeGCRA(ctx, b, 0)
		switch {
		case err != nil && s.closed.Load():
		case err != nil:
			s.failed(l.health, probe, sent, err)
		default:
			s.decided(l, sent, 0, d)
		}
	}) {
		l.checking.Store(false)
	}
}

// gcraDecision is one answer of the GCRA script.
type gcraDecision struct {
	Allowed    bool
	Remaining  int64         // whole tokens left after the call
	RetryAfter time.Duration // when refused: until n tokens are back (-1: never)
	Reset      time.Duration // until the bucket is full
	ServerTime time.Time     // when the script ran (the server clock)
}

// takeGCRA runs the script once for n tokens of b's bucket.
func (s *Source) takeGCRA(ctx context.Context, b *gcraBound, n int64) (gcraDecision, error) {
	s.calls.Inc()
	vals, err := gcraScript.Run(ctx, s.client, []string{b.l.tat}, b.interval, b.tolerance, n).Int64Slice()
	if err != nil {
		return gcraDecision{}, fmt.Errorf("global: %w", err)
	}
	if len(vals) != 5 {
		return gcraDecision{}, fmt.Errorf("global: GCRA script returned %d values, want 5", len(vals))
	}
	d := gcraDecision{
		Allowed:    vals[0] == 1,
		Remaining:  vals[1],
		RetryAfter: time.Duration(vals[2]),
		Reset:      time.Duration(vals[3]),
		ServerTime: time.UnixMicro(vals[4]),
	}
	return d, nil
}

// errPerKeyGCRA refuses a request flow never makes.
var errPerKeyGCRA = errors.New("global: PerKey GCRA limits are not supported")
