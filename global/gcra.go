package global

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
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
	tat, reply string // the TAT's key, and the prefix of a call's reply key
	*health
	// closed is the last refusal: requests of need or more are refused
	// without a call until until (the Source's clock), when that many
	// tokens are back at the earliest.
	closed atomic.Pointer[closedWindow]
}

// gcraKeys returns a GCRA limit's keys: a shape of their own ("gcra"),
// never a window's, so that a GCRA rule and a window rule of the same ID
// are two limits and no key is read by both scripts.
func gcraKeys(prefix, key string) (tat, reply string) {
	base := prefix + ":" + hashTag(key) + ":" + keySchema + "/gcra"
	return base, base + ":r:"
}

func (s *Source) gcraLimitFor(key string) *gcraLimit {
	if l, ok := s.gcras.Load(key); ok {
		return l.(*gcraLimit)
	}
	tat, reply := gcraKeys(s.opts.Prefix, key)
	l, _ := s.gcras.LoadOrStore(key, &gcraLimit{tat: tat, reply: reply, health: &health{}})
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
// more than the bucket holds (refused, no call) or Redis refused n or
// less earlier and said the tokens are not back yet.
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

// gcraAnswer is one call's answer, written before done is closed.
type gcraAnswer struct {
	done chan struct{}
	d    gcraDecision
	err  error
}

// acquireGCRA asks Redis for n tokens of b's bucket. The call runs in the
// background for up to CallTimeout and the request waits for it up to
// Timeout, as a window rule's do: a late answer refuses the request
// (Stats.Late) but still tells the limit's health, so a Redis that stops
// answering trips the same backoff.
func (s *Source) acquireGCRA(ctx context.Context, b *gcraBound, n int64) (bool, error) {
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
			s.goCall(func() {
				if probe, err := s.callable(l.health); err == nil {
					_, _ = s.callGCRA(b, 0, probe)
				}
			})
		}
		s.refused.Inc()
		return false, ErrUnavailable
	}
	a := &gcraAnswer{done: make(chan struct{}), err: errNoAnswer}
	if !s.goCall(func() {
		defer close(a.done)
		probe, err := s.callable(l.health)
		if err != nil {
			a.err = err
			return
		}
		a.d, a.err = s.callGCRA(b, n, probe)
	}) {
		s.refused.Inc()
		return false, nil
	}
	timer := time.NewTimer(s.opts.Timeout)
	defer timer.Stop()
	select {
	case <-a.done:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-timer.C:
		select {
		case <-a.done: // answered as the timer fired: use it
		default:
			s.late.Inc()
			return false, nil
		}
	}
	switch {
	case a.err == errClosed:
		s.refused.Inc()
		return false, nil
	case a.err != nil:
		return false, a.err
	case !a.d.Allowed:
		return false, nil
	}
	s.admitted(a.d.ServerTime, n)
	return true, nil
}

// callGCRA makes one call for n tokens of b's bucket and records what it
// says in the limit: its health, and a refusal's retry-after.
func (s *Source) callGCRA(b *gcraBound, n int64, probe bool) (d gcraDecision, err error) {
	l := b.l
	defer func() {
		if v := recover(); v != nil {
			s.fail(l.health, probe)
			panic(v) // to goCall, which ends it
		}
	}()
	sent := s.opts.Clock.Now()
	d, err = s.takeGCRA(b, n)
	switch {
	case err != nil && s.closed.Load():
		return d, errClosed
	case err != nil:
		s.fail(l.health, probe)
		return d, err
	}
	s.succeed(l.health)
	if !d.Allowed && d.RetryAfter > 0 {
		// The tokens are not back before then (server time, read after
		// we sent): refuse locally until sent + RetryAfter.
		l.closed.Store(&closedWindow{until: sent + int64(d.RetryAfter), need: n})
	}
	return d, nil
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
func (s *Source) takeGCRA(b *gcraBound, n int64) (gcraDecision, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.CallTimeout)
	defer cancel()
	s.calls.Inc()
	replyTTL := max(int64(time.Second), 2*int64(s.opts.CallTimeout)) / int64(time.Millisecond)
	id := s.id + strconv.FormatInt(s.seq.Inc(), 36)
	vals, err := gcraScript.Run(ctx, s.client, []string{b.l.tat, b.l.reply + id}, b.interval, b.tolerance, n, replyTTL).Int64Slice()
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
