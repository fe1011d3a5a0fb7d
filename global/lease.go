package global

import (
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

type paddedLease struct {
	atomic.Pointer[lease]
	_ [cpu.CacheLine - 8]byte
}

// lease is a batch of tokens counted in one server bucket, to be spent
// before deadline (the Source's clock).
type lease struct {
	left     atomic.Int64
	deadline int64
	bucket   time.Time
	// size (every token put in it, top-ups included) and installed (the
	// Source's clock) let a prefetch judge whether the lease will run out
	// before its deadline.
	size      atomic.Int64
	installed int64
}

// short reports whether, spent at the pace it has been so far, the lease
// runs out before its deadline: only then is the next one worth fetching
// within this bucket (tokens fetched and not spent stay counted in the
// server window).
func (l *lease) short(now int64) bool {
	left := l.left.Load()
	used, elapsed := l.size.Load()-left, now-l.installed
	if used <= 0 || elapsed <= 0 {
		return false
	}
	return used*(l.deadline-now) > left*elapsed
}

func (l *lease) take(now, n int64) bool {
	if l == nil || now >= l.deadline {
		return false
	}
	for {
		left := l.left.Load()
		if left < n {
			return false
		}
		if l.left.CompareAndSwap(left, left-n) {
			return true
		}
	}
}

// install makes extra tokens of decision d spendable until their server
// bucket ends, timed from when the call was sent: the server read its
// clock after that, so the lease never outlives its bucket, however the
// round trip splits between its legs (a loaded machine can take far
// longer to schedule the reply than the request took to arrive; timing
// from the middle let leases be spent up to half a round trip late). It
// costs the lease that much of its life. Tokens of the bucket the current
// lease is in join it. The batch doubles when a whole lease was spent
// within one bucket and halves when a bucket ended with most of one
// unspent. It returns false, and
// installs nothing, when the bucket ends before they could be spent (the
// call came in its last moments).
func (s *Source) install(l *limit, slot *paddedLease, d decision, extra, sent int64) bool {
	now := s.opts.Clock.Now()
	deadline := sent + int64(d.BucketStart.Add(d.BucketLen).Sub(d.ServerTime)) - int64(s.opts.ClockSlack)
	if deadline <= now {
		return false
	}
	s.leased.Add(extra)
	old := slot.Load()
	batch := l.batch.Load()
	switch {
	case old != nil && old.bucket.Equal(d.BucketStart):
		// Another lease within the same bucket: the last was nearly spent.
		// size first, so that the pace short reads never counts the new
		// tokens as spent.
		old.size.Add(extra)
		old.left.Add(extra)
		l.batch.Store(min(batch*2, s.opts.MaxBatch))
		return true
	case old != nil && old.left.Load() > batch/2:
		l.batch.Store(max(batch/2, 1))
	}
	if old != nil && old.bucket.Before(d.BucketStart) {
		// Replaced before its deadline (the call that leased the new one
		// was sent in the old bucket): give its tokens back too.
		if n := old.left.Swap(0); n > 0 {
			l.giveBackLater(giveBack{bucket: old.bucket.UnixMicro(), n: n})
		}
	}
	nl := &lease{deadline: deadline, bucket: d.BucketStart, installed: now}
	nl.size.Store(extra)
	nl.left.Store(extra)
	slot.Store(nl)
	return true
}
