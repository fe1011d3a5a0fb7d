// Package warmup is the warm-up token bucket: the model of Guava's
// SmoothWarmingUp, as Sentinel uses it, that lets a cold resource take
// traffic slowly and rise to its full rate as traffic keeps it busy.
//
// Package flow's WarmUp rules (a limit per window) and WarmUpThrottle
// rules (a pacer's rate) read their rate from a Bucket each, kept across
// reloads. Times are int64 nanoseconds of the caller's clock, and the
// previous second's passes come from a func the caller passes, so tests
// drive it with plain numbers.
package warmup

import (
	"math"
	"time"

	"go.uber.org/atomic"
)

const nsPerSecond = float64(time.Second)

// Bucket is the model's state: a cold resource holds maxToken tokens and
// admits threshold / coldFactor per second; every second the tokens drain
// by the previous second's passes and refill towards maxToken while
// traffic stays under the cold rate, and the allowed rate rises linearly
// as tokens fall towards warningToken, below which the full threshold
// applies. A Bucket is safe for simultaneous use by multiple goroutines
// and must not be copied after first use.
type Bucket struct {
	count        float64 // the threshold, per second
	coldFactor   float64
	warningToken int64
	maxToken     int64
	slope        float64

	stored     atomic.Int64 // tokens
	lastFilled atomic.Int64 // start of the last second synced, ns
}

// New returns a cold bucket for threshold per second, admitting
// threshold / coldFactor when cold and rising to threshold over about
// period of traffic at it. coldFactor is more than 1.
func New(threshold, coldFactor float64, period time.Duration) *Bucket {
	b := &Bucket{count: threshold, coldFactor: coldFactor}
	warning, cold := Tokens(threshold, coldFactor, period)
	b.warningToken = int64(warning)
	b.maxToken = b.warningToken + int64(cold)
	if b.maxToken > b.warningToken && threshold > 0 {
		b.slope = (coldFactor - 1) / threshold / float64(b.maxToken-b.warningToken)
	}
	b.stored.Store(b.maxToken) // start cold
	b.lastFilled.Store(math.MinInt64 / 2)
	return b
}

// Tokens returns the tokens a bucket of New's arguments holds at its
// warning line, and how many more it holds when cold (its most is their
// sum): what validation bounds before a bucket is made.
func Tokens(threshold, coldFactor float64, period time.Duration) (warning, cold float64) {
	p := period.Seconds()
	return p * threshold / (coldFactor - 1), 2 * p * threshold / (1 + coldFactor)
}

// Rate returns the admissions per second allowed at now. The first call
// in a new second syncs the bucket: only that goroutine calls
// prevSecondPasses, for the passes of the whole second before now's.
func (b *Bucket) Rate(now int64, prevSecondPasses func() int64) float64 {
	if b.count <= 0 {
		return 0
	}
	b.sync(now, prevSecondPasses)
	rest := b.stored.Load()
	if rest < b.warningToken {
		return b.count
	}
	above := float64(rest - b.warningToken)
	return 1 / (above*b.slope + 1/b.count)
}

// sync refills and drains the tokens once per second. One goroutine wins
// the second by CAS on lastFilled and does the update; the rest read.
func (b *Bucket) sync(now int64, prevSecondPasses func() int64) {
	cur := now - now%int64(time.Second)
	last := b.lastFilled.Load()
	if cur <= last || !b.lastFilled.CompareAndSwap(last, cur) {
		return
	}
	passed := prevSecondPasses()
	old := b.stored.Load()
	next := old
	refill := int64(float64(cur-last) / nsPerSecond * b.count)
	if last < 0 || refill < 0 { // first sync, or an overflow: full
		refill = b.maxToken
	}
	switch {
	case old < b.warningToken:
		next = old + refill
	case old > b.warningToken && float64(passed) < b.count/b.coldFactor:
		next = old + refill
	}
	next = min(next, b.maxToken) - passed
	b.stored.Store(max(next, 0))
}

// Follow makes b, a new bucket for a rule whose warm-up changed, as warm
// as old was: the same share of its tokens, rounded towards cold, synced
// to the same second (load time).
func (b *Bucket) Follow(old *Bucket) {
	share := 1.0
	if old.maxToken > 0 {
		share = float64(old.stored.Load()) / float64(old.maxToken)
	}
	b.stored.Store(min(int64(math.Ceil(share*float64(b.maxToken))), b.maxToken))
	b.lastFilled.Store(old.lastFilled.Load())
}
