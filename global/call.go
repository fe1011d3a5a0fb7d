package global

// The calls to Redis: one for the requests that joined it, and its answer.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapflow/leapflow/flow"
)

// takeCounted is take, counted in l.inFlight while it runs (a panic
// included).
func (s *Source) takeCounted(l *limit, threshold, need, want, maxLease int64) (decision, error) {
	in := l.inFlight.Inc()
	defer l.inFlight.Dec()
	for most := s.mostInFlight.Load(); in > most && !s.mostInFlight.CompareAndSwap(most, in); most = s.mostInFlight.Load() {
	}
	return s.take(l, threshold, need, want, maxLease)
}

// fly makes call f once the call before it has ended: it asks Redis for
// every request that joined f, with a lease on top (installed in P p's
// slot), and records the answer for them. It runs to the end whatever its
// requests do: a reply later than their deadline still installs its lease
// and tells the Source's health.
func (s *Source) fly(l *limit, f *flight, p int, req flow.GlobalRequest) {
	f.err = errNoAnswer // until there is one (a panic below)
	defer f.end()
	var probe bool
	defer func() {
		if v := recover(); v != nil {
			s.fail(l.health, probe)
			panic(v) // to goCall, which ends it
		}
	}()
	prev := f.prev
	if prev != nil {
		<-prev.done
		f.prev = nil
	}
	want := f.seal()
	if prev != nil && prev.spare > 0 {
		// The call before brought tokens too late to lease, and this one
		// was gathering: its requests have them, without a call, as far
		// as they go (those left out join the next call).
		if got := min(prev.spare, want); got > 0 && got >= f.need.Load() && s.opts.Clock.Now() < prev.expires {
			f.err = nil
			s.reserve(l, f, prev.bucket, got, prev.expires)
			prev.spare -= got
		}
		if prev.spare > 0 {
			l.giveBackLater(giveBack{bucket: prev.bucket.UnixMicro(), n: prev.spare})
		}
		if f.err == nil {
			return
		}
	}
	if prev != nil && want > 0 {
		// Or it brought a lease that has enough for them.
		now := s.opts.Clock.Now()
		for i := range l.leases {
			if ls := l.leases[i].Load(); ls.take(now, want) {
				f.err = nil
				s.reserve(l, f, ls.bucket, want, now+int64(s.opts.Timeout))
				return
			}
		}
	}
	need := max(f.need.Load(), 1)
	probe, err := s.callable(l.health)
	if err != nil {
		f.err = err
		return
	}
	var maxLease int64
	if l.perKey {
		l.calls.add(s.opts.Clock.Now(), l.window)
	}
	if s.leasing(l) {
		maxLease = l.batch.Load()
	}
	sent := s.opts.Clock.Now()
	d, err := s.takeCounted(l, perWindow(req), need, want, maxLease)
	switch {
	case err != nil && s.closed.Load():
		f.err = errClosed
		return
	case err != nil:
		s.failed(l.health, probe, sent, err)
		f.err = err
		return
	}
	s.succeed(l.health)
	f.err = nil
	if !d.Allowed {
		f.refused = true
		if d.RetryAfter > 0 {
			// Nothing leaves the window before then (server time, read
			// after we sent): refuse locally until sent + RetryAfter.
			l.closed.Store(&closedWindow{until: sent + int64(d.RetryAfter), need: need})
		}
		return
	}
	reserved := min(d.Granted, want)
	s.reserve(l, f, d.BucketStart, reserved, s.opts.Clock.Now()+int64(s.opts.Timeout))
	if extra := d.Granted - reserved; extra > 0 && !s.install(l, &l.leases[p], d, extra, sent) {
		// Too late to lease (the bucket ends before they could be
		// spent): requests gathering for the next call may have them;
		// else they go back with the next call.
		if l.cur.Load() != f {
			f.bucket, f.spare = d.BucketStart, extra
		} else {
			l.giveBackLater(giveBack{bucket: d.BucketStart.UnixMicro(), n: extra})
		}
		// Replies this late need more than a lease's worth for the
		// requests that gather meanwhile.
		l.batch.Store(min(max(l.batch.Load(), want)*2, s.opts.MaxBatch))
	}
}

// reserve makes n tokens counted in bucket claimable by f's requests until
// expires. What they do not claim (they gave up) goes back with the first
// call after that; in exact mode it stays counted for a window.
func (s *Source) reserve(l *limit, f *flight, bucket time.Time, n, expires int64) {
	f.bucket, f.expires = bucket, expires
	if n <= 0 {
		return
	}
	f.left.Store(n)
	if !l.exact {
		l.backMu.Lock()
		l.reserves = append(l.reserves, f)
		l.backMu.Unlock()
	}
}

// errNoAnswer is the answer of a call that ended without one (a panic in a
// user hook).
var errNoAnswer = errors.New("global: the call ended without an answer")

// decision is one answer of the Redis script.
type decision struct {
	Allowed    bool
	Granted    int64         // tokens counted for the caller (>= need when allowed)
	Count      int64         // in the window after the call
	Remaining  int64         // threshold minus Count
	RetryAfter time.Duration // when refused: until enough leaves the window (-1: never)
	ServerTime time.Time
	// BucketStart and BucketLen place the bucket the tokens were counted in
	// on the server clock.
	BucketStart time.Time
	BucketLen   time.Duration
}

// takeFor asks Redis once, outside the request path, for n admissions of
// the limit of req and a lease of up to maxLease.
func (s *Source) takeFor(req flow.GlobalRequest, maxLease int64) (decision, error) {
	return s.take(s.limitFor(req), perWindow(req), req.Count, req.Count, maxLease)
}

// take makes one call for l: want tokens for the waiting requests (at
// least need, or none), a lease of up to maxLease, and the unspent tokens
// given back.
func (s *Source) take(l *limit, threshold, need, want, maxLease int64) (decision, error) {
	now := s.opts.Clock.Now()
	back := s.unspent(l, now)
	cs := l.carried.take(now, l.window)
	d, err := s.takeAs(s.id+strconv.FormatInt(s.seq.Inc(), 36), l, threshold, need, want, maxLease, back, cs)
	if err == nil {
		for _, g := range back {
			s.returned.Add(g.n)
		}
		l.carried.sent(cs)
	}
	// On an error the tokens are not given back (the call may have run,
	// and a retry under a new ID would give them back twice): they stay
	// counted, at most a window. What it carried is sent again by the
	// next call, which Redis counts only if this one did not run.
	return d, err
}

// giveBack is tokens leased in one server bucket and never spent.
type giveBack struct {
	bucket int64 // µs, the limit's time
	n      int64
}

// unspent collects the tokens of l's leases whose deadline passed before
// they were spent, and of calls whose requests gave up before claiming
// them: they go back to their server buckets with the next call. A take
// that raced the collection finds nothing left.
func (s *Source) unspent(l *limit, now int64) []giveBack {
	l.backMu.Lock()
	back := l.back
	l.back = nil
	keep := l.reserves[:0]
	for _, f := range l.reserves {
		if now < f.expires {
			keep = append(keep, f)
		} else if n := f.left.Swap(0); n > 0 {
			back = append(back, giveBack{bucket: f.bucket.UnixMicro(), n: n})
		}
	}
	clear(l.reserves[len(keep):])
	l.reserves = keep
	l.backMu.Unlock()
	for i := range l.leases {
		ls := l.leases[i].Load()
		if ls == nil || now < ls.deadline || ls.left.Load() <= 0 {
			continue
		}
		if n := ls.left.Swap(0); n > 0 {
			back = append(back, giveBack{bucket: ls.bucket.UnixMicro(), n: n})
			if batch := l.batch.Load(); n > batch/2 {
				// Most of a lease went unspent: lease less.
				l.batch.Store(max(batch/2, 1))
			}
		}
	}
	return back
}

// takeAs is take for the call named id: a call that runs again with the
// same id (a retry after a lost reply) gets the first answer and counts
// nothing more.
func (s *Source) takeAs(id string, l *limit, threshold, need, want, maxLease int64, back []giveBack, cs []carry) (decision, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.CallTimeout)
	defer cancel()
	s.calls.Inc()
	ttl := 2*l.window/1000 + 1000
	replyTTL := max(int64(time.Second), 2*int64(s.opts.CallTimeout)) / int64(time.Millisecond)
	hold := s.opts.PresenceHold.Microseconds()
	var cmd *redis.Cmd
	if l.exact {
		args := carryArgs([]any{threshold, l.window, want, ttl, serverStep, replyTTL, need, hold}, cs, s.id)
		cmd = logScript.Run(ctx, s.client, []string{l.keys.log, l.keys.meta, l.keys.reply + id}, args...)
	} else {
		window, buckets := l.window, int64(s.opts.Buckets)
		if l.span {
			// One bucket more: every span of the interval lies within
			// Buckets+1 consecutive buckets, and the script keeps each
			// such sum within the threshold.
			window, buckets = window/buckets*(buckets+1), buckets+1
		}
		args := carryArgs([]any{threshold, window, buckets, want, maxLease, ttl, serverStep, replyTTL, need, hold}, cs, s.id)
		for _, g := range back {
			args = append(args, strconv.FormatInt(g.bucket, 10), g.n)
		}
		cmd = windowScript.Run(ctx, s.client, []string{l.keys.window, l.keys.reply + id}, args...)
	}
	vals, err := cmd.Int64Slice()
	if err != nil {
		return decision{}, fmt.Errorf("global: %w", err)
	}
	if len(vals) != 7 {
		return decision{}, fmt.Errorf("global: script returned %d values, want 7", len(vals))
	}
	d := decision{
		Allowed:     vals[0] > 0,
		Granted:     vals[0],
		Count:       vals[1],
		Remaining:   vals[2],
		RetryAfter:  time.Duration(vals[3]) * time.Microsecond,
		ServerTime:  time.UnixMicro(vals[4]),
		BucketStart: time.UnixMicro(vals[5]),
		BucketLen:   time.Duration(vals[6]) * time.Microsecond,
	}
	if vals[3] < 0 {
		d.RetryAfter = -1
	}
	return d, nil
}

func (s *Source) admitted(bucket time.Time, n int64) {
	if s.opts.OnAdmit != nil {
		s.opts.OnAdmit(bucket, n)
	}
}
