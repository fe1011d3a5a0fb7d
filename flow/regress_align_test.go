package flow

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// mostInAlignedWindow is the most stamps in any window of four 250 ms
// buckets (the 1 s window a Reject rule limits).
func mostInAlignedWindow(st []stamp) int64 {
	own := map[int64]int64{}
	for _, x := range st {
		own[x.t/int64(250*ms)] += x.n
	}
	var best int64
	for b := range own {
		best = max(best, own[b]+own[b-1]+own[b-2]+own[b-3])
	}
	return best
}

func admitAll(t *testing.T, e *Engine, clock *stattest.Clock, at time.Duration, k int, opts func(i int) []EntryOption) []stamp {
	t.Helper()
	clock.Set(at)
	var st []stamp
	for i := range k {
		en, err := e.Entry("api", opts(i)...)
		if err != nil {
			continue
		}
		st = append(st, stamp{en.Start(), 1})
		en.Exit(nil)
	}
	return st
}

// TestRegressAlignRejectSharingAWarmUpWindow: a Reject rule whose window also
// holds a WarmUp rule is not borrowable, so when a Throttle rule makes the
// request wait, align keeps its admission at now, in an earlier bucket than
// the instant it goes: the Reject rule's threshold is exceeded on the
// engine's own stamps. Without the WarmUp rule (control), align moves the
// count to the bucket it goes in and the window holds.
func TestRegressAlignRejectSharingAWarmUpWindow(t *testing.T) {
	for _, withWarm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warmup=%v", withWarm), func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock)
			rules := []Rule{
				{Resource: "api", Threshold: 10},
				{Resource: "api", Threshold: 20, Behavior: Throttle, MaxQueueing: 2 * time.Second},
			}
			if withWarm {
				// Cold rate 1000/3 per second: never the tighter limit.
				rules = append(rules, Rule{Resource: "api", Threshold: 1000, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second})
			}
			load(t, e, rules...)
			none := func(int) []EntryOption { return nil }
			st := admitAll(t, e, clock, 990*ms, 20, none)
			st = append(st, admitAll(t, e, clock, 1750*ms, 20, none)...)
			assert.LessOrEqual(t, mostInAlignedWindow(st), int64(10), "Reject 10/s on the stamps %v", st)
		})
	}
}

// TestRegressAlignIgnoresPerKeyThrottle: a PerKey Throttle rule makes requests
// wait, but rateRules does not count it, so a Reject rule on the same
// resource counts the request at now, not at the instant it goes: the
// Reject threshold is exceeded on the engine's own stamps.
func TestRegressAlignIgnoresPerKeyThrottle(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "api", Threshold: 10},
		Rule{Resource: "api", Threshold: 1, Behavior: Throttle, PerKey: true, MaxQueueing: 2 * time.Second})
	// Five keys, twice each at 0.9 s: the second of each goes at 1.9 s, all
	// ten counted in the bucket of 0.9 s.
	st := admitAll(t, e, clock, 900*ms, 10, func(i int) []EntryOption { return []EntryOption{WithKey(fmt.Sprint("k", i%5))} })
	require.Len(t, st, 10)
	// At 1.9 s that bucket has left the window: ten new keys pass too.
	st = append(st, admitAll(t, e, clock, 1900*ms, 10, func(i int) []EntryOption { return []EntryOption{WithKey(fmt.Sprint("n", i))} })...)
	assert.LessOrEqual(t, mostInAlignedWindow(st), int64(10), "Reject 10/s on the stamps %v", st)
}
