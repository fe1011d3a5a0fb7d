package flow

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

const ms = time.Millisecond

func TestRuleValidation(t *testing.T) {
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Threshold: 1}, `rule "" (#0): Resource must not be empty, got ""`},
		{Rule{Resource: "api", Threshold: -1}, `rule "api" (#0): Threshold must be a finite number >= 0, got -1`},
		{Rule{Resource: "api", Threshold: math.NaN()}, "Threshold must be a finite number >= 0, got NaN"},
		{Rule{Resource: "api", Threshold: math.Inf(1)}, "Threshold must be a finite number >= 0, got +Inf"},
		{Rule{ID: "r1", Resource: "api", Metric: 7}, `rule "r1" (#0): Metric must be QPS or Concurrency, got Metric(7)`},
		{Rule{Resource: "api", Behavior: 9}, "Behavior must be Reject, WarmUp, Throttle, WarmUpThrottle or GCRA, got Behavior(9)"},
		{Rule{Resource: "api", Metric: Concurrency, Behavior: Throttle}, "Behavior must be Reject for a Concurrency rule, got Throttle"},
		{Rule{Resource: "api", StatInterval: 1500 * time.Microsecond}, "StatInterval must be a positive whole number of milliseconds, got 1.5ms"},
		{Rule{Resource: "api", StatInterval: -time.Second}, "StatInterval must be a positive whole number of milliseconds, got -1s"},
		{Rule{Resource: "api", StatInterval: 25 * time.Hour}, "StatInterval must be at most 24h, got 25h0m0s"},
		{Rule{Resource: "api", Threshold: 1e12, StatInterval: 24 * time.Hour}, "Threshold admits 8.64e+16 per StatInterval of 24h0m0s, more than a window counts (9007199254740991), got 1e+12"},
		{Rule{Resource: "api", Behavior: Throttle, MaxQueueing: -ms}, "MaxQueueing must be in [0, 1h], got -1ms"},
		{Rule{Resource: "api", Behavior: WarmUp, Threshold: 10}, "WarmUpPeriod must be > 0 for WarmUp, got 0s"},
		{Rule{Resource: "api", Behavior: WarmUp, Threshold: 10, WarmUpPeriod: time.Second, ColdFactor: 0.5}, "ColdFactor must be > 1 and at most 1e6, got 0.5"},
		{Rule{Resource: "api", RelatedResource: "api"}, "RelatedResource must differ from Resource, got api"},
		{Rule{Resource: "api", Metric: Concurrency, Global: true}, "Global is not supported for Concurrency rules, got true"},
		{Rule{Resource: "api", Global: true}, "Global needs an engine made WithTokenSource, got true"},
		{Rule{Resource: "api", Global: true, Behavior: Throttle}, "Behavior must be Reject or GCRA for a Global rule, got Throttle"},
		{Rule{Resource: "api", RelatedResource: "db", Behavior: WarmUp, WarmUpPeriod: time.Second}, "RelatedResource needs a QPS rule with Behavior Reject, got db"},
		{Rule{Resource: "api", RelatedResource: "db", Metric: Concurrency}, "RelatedResource needs a QPS rule with Behavior Reject, got db"},
	} {
		e, _ := newEngine(t, stattest.NewClock(0))
		err := e.LoadRules([]Rule{tc.rule})
		require.Error(t, err, "%+v", tc.rule)
		assert.Contains(t, err.Error(), tc.want)
		assert.ErrorIs(t, err, ErrInvalidRule)
		var re *RuleError
		require.ErrorAs(t, err, &re)
	}
}

func TestOneBadRuleChangesNothing(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 2})
	err := e.LoadRules([]Rule{
		{Resource: "api", Threshold: 100},
		{Resource: "other", Threshold: 5},
		{Resource: "bad", Threshold: -3},
	})
	var re *RuleError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, 2, re.Index)
	assert.Equal(t, "Threshold", re.Field)
	assert.Equal(t, []Rule{{Resource: "api", Threshold: 2, StatInterval: time.Second}}, e.Rules())
	for i := range 3 {
		en, err := e.Entry("api")
		if i < 2 {
			require.NoError(t, err)
			en.Exit(nil)
		} else {
			assert.ErrorIs(t, err, ErrBlocked, "the old threshold of 2 still holds")
		}
	}
}

func TestRejectSteps(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{ID: "api-qps", Resource: "api", Threshold: 3})
	for i, st := range []struct {
		at    time.Duration
		count int
		pass  bool
	}{
		{0, 1, true},
		{100 * ms, 2, true},
		{200 * ms, 1, false},
		{300 * ms, 4, false}, // a batch above the threshold never passes
		{999 * ms, 1, false},
		{1000 * ms, 1, true}, // the 0-250ms bucket left the window
		{1100 * ms, 2, true},
		{1100 * ms, 1, false},
	} {
		clock.Set(st.at)
		en, err := e.Entry("api", WithCount(st.count))
		if st.pass {
			require.NoError(t, err, "step %d", i)
			en.Exit(nil)
			continue
		}
		require.Error(t, err, "step %d", i)
		var be *BlockError
		require.ErrorAs(t, err, &be, "step %d", i)
		assert.Equal(t, "api-qps", be.Rule.ID)
		assert.Equal(t, ReasonFlow, be.Reason)
		assert.Contains(t, be.Error(), `"api" blocked by rule "api-qps" (QPS 3, Reject, flow)`)
	}
	snap, ok := e.Snapshot("api")
	require.True(t, ok)
	assert.InDelta(t, 3.0, snap.PassQPS, 1e-9)
	assert.InDelta(t, 6.0, snap.BlockQPS, 1e-9, "blocks at 300ms (a batch of 4), 999ms and 1100ms")
	_, ok = e.Snapshot("nope")
	assert.False(t, ok)
}

func TestSeenOnBlock(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 2})
	for range 2 {
		_, err := e.Entry("api")
		require.NoError(t, err)
	}
	en, err := e.Entry("api")
	require.ErrorIs(t, err, ErrBlocked)
	assert.Equal(t, 2.0, en.seen())
	en.Exit(nil) // nothing held: a no-op
}

func TestThresholdZeroBlocksAll(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api"}, Rule{Resource: "conc", Metric: Concurrency})
	_, err := e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked)
	_, err = e.Entry("conc")
	assert.ErrorIs(t, err, ErrBlocked)
}

func TestExitRecordsAndIsIdempotent(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 2})
	a, err := e.Entry("api")
	require.NoError(t, err)
	b, err := e.Entry("api")
	require.NoError(t, err)
	_, err = e.Entry("api")
	require.ErrorIs(t, err, ErrBlocked)
	clock.Advance(30 * ms)
	a.Exit(errors.New("boom"))
	a.Exit(nil)
	a.Exit(errors.New("again"))
	c, err := e.Entry("api")
	require.NoError(t, err, "one slot came back, once")
	_, err = e.Entry("api")
	require.ErrorIs(t, err, ErrBlocked)
	clock.Advance(10 * ms)
	b.Exit(nil)
	c.Exit(nil)
	snap, _ := e.Snapshot("api")
	assert.InDelta(t, 3.0, snap.SuccessQPS, 1e-9)
	assert.InDelta(t, 1.0, snap.ExceptionQPS, 1e-9)
	assert.Equal(t, int64(0), snap.Inflight)
	assert.Equal(t, 10*ms, snap.MinRT)
	assert.Equal(t, (30*ms+40*ms+10*ms)/3, snap.AvgRT)
	assert.Zero(t, e.registry.Lookup("api").Concurrency())
}

func TestNoRulePassesAndCounts(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	for range 5 {
		en, err := e.Entry("free", WithCount(2))
		require.NoError(t, err)
		en.Exit(nil)
	}
	snap, _ := e.Snapshot("free")
	assert.InDelta(t, 10.0, snap.PassQPS, 1e-9)
	assert.InDelta(t, 10.0, snap.SuccessQPS, 1e-9)

	// Without options: by name and through a handle, one each.
	h, err := e.Resource("free")
	require.NoError(t, err)
	for range 3 {
		en, err := e.Entry("free")
		require.NoError(t, err)
		en.Exit(nil)
		en, err = h.Entry()
		require.NoError(t, err)
		en.Exit(nil)
	}
	snap, _ = e.Snapshot("free")
	assert.InDelta(t, 16.0, snap.PassQPS, 1e-9)
	assert.InDelta(t, 16.0, snap.SuccessQPS, 1e-9)
	assert.Zero(t, e.registry.Lookup("free").Concurrency())
}

func TestRegistryCapThroughEntry(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0), WithMaxResources(2))
	_, err := e.Entry("a")
	require.NoError(t, err)
	_, err = e.Entry("b")
	require.NoError(t, err)
	_, err = e.Entry("c")
	assert.ErrorIs(t, err, stat.ErrTooManyResources)
	err = e.LoadRules([]Rule{{Resource: "d", Threshold: 1}})
	assert.ErrorContains(t, err, `rule "d" (#0): Resource has no room in the registry`)
}

func TestSeveralRulesOnOneWindowCountOnce(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{ID: "loose", Resource: "api", Threshold: 10},
		Rule{ID: "tight", Resource: "api", Threshold: 4},
		Rule{ID: "two-seconds", Resource: "api", Threshold: 3, StatInterval: 2 * time.Second},
	)
	// try makes 10 requests and returns how many passed and the last error.
	try := func() (passed int, last error) {
		for range 10 {
			if en, err := e.Entry("api"); err == nil {
				passed++
				en.Exit(nil)
			} else {
				last = err
			}
		}
		return passed, last
	}
	passed, last := try()
	assert.Equal(t, 4, passed, "min(10, 4, 3 per second over 2s = 6)")
	var be *BlockError
	require.ErrorAs(t, last, &be)
	assert.Equal(t, "tight", be.Rule.ID)
	snap, _ := e.Snapshot("api")
	assert.InDelta(t, 4.0, snap.PassQPS, 1e-9, "each pass counted once")
	// At 1s the 1s window is empty again but the 2s window holds 4 of 6.
	clock.Set(time.Second)
	passed, last = try()
	assert.Equal(t, 2, passed)
	require.ErrorAs(t, last, &be)
	assert.Equal(t, "two-seconds", be.Rule.ID)
}

func TestLaterBlockGivesBackEarlierGrants(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "api", Metric: Concurrency, Threshold: 100},
		Rule{Resource: "api", Threshold: 100},
		Rule{Resource: "api", Threshold: 5, RelatedResource: "db"},
	)
	for range 10 {
		en, err := e.Entry("db")
		require.NoError(t, err)
		en.Exit(nil)
	}
	for range 3 {
		_, err := e.Entry("api")
		require.ErrorIs(t, err, ErrBlocked, "db is busy")
	}
	n := e.registry.Lookup("api")
	assert.Zero(t, n.Concurrency(), "concurrency slots given back")
	assert.Zero(t, n.Second().Sum(clock.Now(), metric.Pass), "window admissions given back")
	assert.Equal(t, int64(3), n.Second().Sum(clock.Now(), metric.Block))
}

func TestWarmUpRisesFromColdToThreshold(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	const threshold = 100
	load(t, e, Rule{Resource: "api", Threshold: threshold, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second, ColdFactor: 3})
	var perSecond []int
	for s := range 30 {
		admitted := 0
		for i := range 1000 { // a request every ms: far more than allowed
			clock.Set(time.Duration(s)*time.Second + time.Duration(i)*ms)
			if en, err := e.Entry("api"); err == nil {
				admitted++
				en.Exit(nil)
			}
		}
		perSecond = append(perSecond, admitted)
	}
	t.Logf("admitted per second: %v", perSecond)
	assert.InDelta(t, threshold/3, perSecond[0], 3, "starts near threshold/coldFactor")
	for s := 1; s < len(perSecond); s++ {
		assert.GreaterOrEqual(t, perSecond[s]+1, perSecond[s-1], "second %d: never falls under sustained load", s)
		assert.LessOrEqual(t, perSecond[s], threshold)
	}
	assert.Less(t, perSecond[5], threshold, "still warming half-way")
	assert.Equal(t, threshold, perSecond[len(perSecond)-1], "warm after the period")
}

func TestThrottleSpacesEvenly(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, s := newEngine(t, clock)
	load(t, e, Rule{ID: "pace", Resource: "api", Threshold: 10, Behavior: Throttle, MaxQueueing: 500 * ms})
	for i := range 6 {
		en, err := e.Entry("api")
		require.NoError(t, err, "request %d", i)
		en.Exit(nil)
	}
	assert.Equal(t, []time.Duration{100 * ms, 200 * ms, 300 * ms, 400 * ms, 500 * ms}, s.waits)
	_, err := e.Entry("api")
	var be *BlockError
	require.ErrorAs(t, err, &be, "600ms of queue is over MaxQueueing")
	assert.Equal(t, ReasonQueue, be.Reason)

	// A cancelled wait gives its slot back.
	clock.Advance(500 * ms) // the queue head is now at +0
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = e.Entry("api", WithContext(ctx))
	assert.ErrorIs(t, err, context.Canceled)
	s.waits = nil
	_, err = e.Entry("api")
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{100 * ms}, s.waits, "the cancelled slot was reused")
}

func TestThrottleNanosecondExactAboveOneThousand(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, s := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 3000, Behavior: Throttle, MaxQueueing: time.Second})
	// One at once, then 2999 queued 333334ns apart: the 3000th would wait
	// 1.000002s, over MaxQueueing.
	for range 3000 {
		_, err := e.Entry("api")
		require.NoError(t, err)
	}
	cost := time.Duration(math.Ceil(1e9 / 3000.0))
	require.Len(t, s.waits, 2999)
	for i, w := range s.waits {
		require.Equal(t, time.Duration(i+1)*cost, w, "request %d", i+1)
	}
	_, err := e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked, "the next slot is over a second away")
}

func TestWarmUpThrottleStartsSlow(t *testing.T) {
	clock := stattest.NewClock(0)
	e, s := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 90, Behavior: WarmUpThrottle, WarmUpPeriod: 10 * time.Second, MaxQueueing: time.Second})
	for range 3 {
		_, err := e.Entry("api")
		require.NoError(t, err)
	}
	// Cold rate 30/s: 33.4ms apart, not 11.1ms.
	require.Len(t, s.waits, 2)
	assert.InDelta(t, float64(time.Second/30), float64(s.waits[0]), float64(ms))
}

func TestPriorityBorrowsTheNextWindow(t *testing.T) {
	clock := stattest.NewClock(0)
	e, s := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 4})
	clock.Set(600 * ms)
	for range 4 {
		_, err := e.Entry("api")
		require.NoError(t, err)
	}
	_, err := e.Entry("api")
	require.ErrorIs(t, err, ErrBlocked, "without priority")
	en, err := e.Entry("api", WithWait(time.Second))
	require.NoError(t, err)
	// Buckets of 250ms: 500-750 holds 4; the first window without it
	// starts at 1500ms.
	assert.Equal(t, []time.Duration{900 * ms}, s.waits)
	en.Exit(nil)
	n := e.registry.Lookup("api")
	assert.Equal(t, int64(1), second(n).Borrowed())
	clock.Set(1500 * ms)
	assert.Equal(t, int64(1), n.Second().Sum(clock.Now(), metric.Pass)+second(n).Borrowed(), "not yet folded or folded once")
	_, err = e.Entry("api", WithCount(3))
	require.NoError(t, err)
	assert.Equal(t, int64(1), n.Second().Sum(clock.Now(), metric.OccupiedPass))
	assert.Equal(t, int64(4), n.Second().Sum(clock.Now(), metric.Pass))
	_, err = e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked, "the borrowed pass counts in its window")
}

type fakeSource struct {
	allow atomic.Bool
	err   atomic.Error
	calls atomic.Int64
}

func (f *fakeSource) Acquire(_ context.Context, req GlobalRequest) (bool, error) {
	f.calls.Inc()
	if err := f.err.Load(); err != nil {
		return false, err
	}
	return f.allow.Load(), nil
}

func TestGlobalRulesAndFallbacks(t *testing.T) {
	src := &fakeSource{}
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithTokenSource(src))
	load(t, e,
		Rule{ID: "g-local", Resource: "a", Threshold: 10, Global: true, LocalShare: 0.3},
		Rule{ID: "g-open", Resource: "b", Threshold: 10, Global: true, Fallback: FallbackOpen},
		Rule{ID: "g-closed", Resource: "c", Threshold: 10, Global: true, Fallback: FallbackClosed},
	)
	src.allow.Store(true)
	for _, r := range []string{"a", "b", "c"} {
		_, err := e.Entry(r)
		assert.NoError(t, err, r)
	}
	src.allow.Store(false)
	_, err := e.Entry("a")
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonGlobal, be.Reason)

	src.err.Store(errors.New("redis down"))
	passed := 0
	for range 10 {
		if _, err := e.Entry("a"); err == nil {
			passed++
		}
	}
	assert.Equal(t, 2, passed, "local fallback: 30% of 10, less the one the source admitted in the window")
	_, err = e.Entry("b")
	assert.NoError(t, err, "fail open")
	_, err = e.Entry("c")
	assert.ErrorIs(t, err, ErrBlocked, "fail closed")
	snap, _ := e.Snapshot("a")
	assert.Equal(t, int64(10), snap.Fallbacks, "fallbacks are counted")
}

func TestPrecisionBoundThroughEntry(t *testing.T) {
	const threshold = 50
	for _, n := range []int{1, 4, 10} {
		clock := stattest.NewClock(0)
		e, _ := newEngine(t, clock, WithSampleCount(n))
		load(t, e, Rule{Resource: "api", Threshold: threshold})
		var admits []int
		for tms := range 4000 {
			clock.Set(time.Duration(tms) * ms)
			a := 0
			for {
				if _, err := e.Entry("api"); err != nil {
					break
				}
				a++
			}
			admits = append(admits, a)
		}
		spanMax := func(L int) int {
			best, run := 0, 0
			for i := range admits {
				run += admits[i]
				if i >= L {
					run -= admits[i-L]
				}
				best = max(best, run)
			}
			return best
		}
		if short := 1000 - 1000/n - 1; short > 0 {
			assert.LessOrEqual(t, spanMax(short), threshold, "n=%d", n)
		}
		assert.LessOrEqual(t, spanMax(1000), 2*threshold, "n=%d", n)
	}
}

func TestResourceHandleFollowsReloads(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithMaxResources(1))
	r, err := e.Resource("api")
	require.NoError(t, err)
	assert.Equal(t, "api", r.name)
	for range 5 {
		en, err := r.Entry()
		require.NoError(t, err, "no rules yet")
		en.Exit(nil)
	}
	load(t, e, Rule{Resource: "api", Threshold: 6})
	_, err = r.Entry()
	require.NoError(t, err, "5 counted before the rule, 1 more fits")
	_, err = r.Entry()
	assert.ErrorIs(t, err, ErrBlocked, "the handle sees the new rule")
	load(t, e)
	_, err = r.Entry()
	assert.NoError(t, err, "and its removal")
	_, err = e.Resource("other")
	assert.ErrorIs(t, err, stat.ErrTooManyResources)
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		en, _ := r.Entry()
		en.Exit(nil)
	}))
}

// Allow admits what Entry would admit and ends it at once (a pass, no
// Success, nothing in flight after it), refuses with the rule's error and
// a Refusal that describes it, takes WithKey and WithCount, refuses a
// wait, and allocates nothing, by name and through a handle.
func TestAllowAdmitsAndEndsAtOnce(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Second))
	load(t, e, Rule{Resource: "api", Threshold: 3}, Rule{Resource: "keyed", Threshold: 1, PerKey: true})
	h, err := e.Resource("api")
	require.NoError(t, err)
	r, err := e.Allow("api")
	require.NoError(t, err)
	assert.Zero(t, r)
	_, err = h.Allow(WithCount(2))
	require.NoError(t, err)
	r, err = h.Allow()
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Same(t, be, r.Err)
	assert.Equal(t, "api", r.Resource)
	assert.Positive(t, r.RetryAfter)
	snap, _ := e.Snapshot("api")
	assert.Equal(t, 3.0, snap.PassQPS)
	assert.Zero(t, snap.SuccessQPS, "no completion, no RT")
	assert.Zero(t, snap.Inflight, "and nothing in flight")

	_, err = e.Allow("keyed", WithKey("a"))
	require.NoError(t, err)
	_, err = e.Allow("keyed", WithKey("a"))
	require.ErrorIs(t, err, ErrBlocked)
	_, err = e.Allow("keyed", WithKey("b"))
	require.NoError(t, err, "b has its own limit")

	_, err = e.Allow("free", WithWait(time.Second))
	assert.ErrorIs(t, err, ErrInvalidOption)
	_, err = e.Allow("free", WithWait(0))
	assert.NoError(t, err, "WithWait(0) asks for no wait")

	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = e.Allow("free") }))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = h.Allow() }), "refused")
}

// Allow never waits: a Throttle rule (and a PerKey one) admits it only if
// its slot is now, however long its MaxQueueing.
func TestAllowNeverWaits(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var slept time.Duration
	e, err := New(WithClock(clock), WithSleep(func(_ context.Context, d time.Duration) error { slept += d; return nil }))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "paced", Threshold: 5, Behavior: Throttle, MaxQueueing: 500 * time.Millisecond},
		Rule{Resource: "keyed", Threshold: 5, Behavior: Throttle, MaxQueueing: 500 * time.Millisecond, PerKey: true})
	for _, tc := range []struct {
		res  string
		opts []EntryOption
	}{{"paced", nil}, {"keyed", []EntryOption{WithKey("a")}}} {
		_, err := e.Allow(tc.res, tc.opts...)
		require.NoError(t, err, "%s: its slot is now", tc.res)
		_, err = e.Allow(tc.res, tc.opts...)
		require.ErrorIs(t, err, ErrBlocked, "%s: the next slot is 200 ms away", tc.res)
		en, err := e.Entry(tc.res, tc.opts...)
		require.NoError(t, err, "%s: Entry queues for it", tc.res)
		en.Exit(nil)
	}
	assert.Equal(t, 400*time.Millisecond, slept, "only the two Entry calls waited")
}

// TestAllowNeedsNoExit: a minute of Allow-only traffic leaves nothing in
// flight, lets the registry reclaim the resource, and a Concurrency rule
// loaded after it counts none of it; Allow on a resource with a
// Concurrency or PerKey Concurrency rule is an error (ErrNeedsExit) that
// counts nothing, and Allow allocates nothing on every other kind.
func TestAllowNeedsNoExit(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock, WithMaxResources(4), WithTokenSource(stubSource))
	load(t, e, Rule{Resource: "ruled", Threshold: 1000})
	for range 60 {
		for range 100 {
			_, err := e.Allow("ruled")
			require.NoError(t, err)
			_, err = e.Allow("free")
			require.NoError(t, err)
		}
		clock.Advance(time.Second)
	}
	for _, res := range []string{"ruled", "free"} {
		s, _ := e.Snapshot(res)
		assert.Zero(t, s.Inflight, res)
		assert.GreaterOrEqual(t, s.MinutePass, int64(5900), res)
		assert.Zero(t, s.MinuteSuccess, res)
	}
	load(t, e, Rule{Resource: "ruled", Threshold: 1000}, Rule{Resource: "free", Metric: Concurrency, Threshold: 1})
	en, err := e.Entry("free")
	require.NoError(t, err, "the Concurrency rule found nothing in flight")
	_, err = e.Allow("free")
	require.ErrorIs(t, err, ErrNeedsExit)
	assert.Contains(t, err.Error(), "free")
	en.Exit(nil)
	n, _ := e.Snapshot("free")
	load(t, e, Rule{Resource: "ruled", Threshold: 1000})
	clock.Advance(61 * time.Second)
	_, err = e.Entry("a")
	require.NoError(t, err)
	_, err = e.Entry("b")
	require.NoError(t, err)
	_, err = e.Entry("c")
	require.NoError(t, err, "free was idle for a minute: the registry let it go")
	assert.Nil(t, e.registry.Lookup("free"))
	assert.Zero(t, n.Inflight)

	e2, _ := newEngine(t, clock, WithTokenSource(stubSource))
	rules := everyKind()
	load(t, e2, rules...)
	for _, r := range rules {
		var opts []EntryOption
		if r.PerKey {
			opts = []EntryOption{WithKey("k")}
		}
		_, err := e2.Allow(r.Resource, opts...)
		if r.Metric == Concurrency {
			require.ErrorIs(t, err, ErrNeedsExit, r.Resource)
			s, _ := e2.Snapshot(r.Resource)
			assert.Zero(t, s.PassQPS, "%s: nothing admitted", r.Resource)
			assert.Equal(t, 1.0, s.BlockQPS, "%s: counted blocked, so that it shows", r.Resource)
			continue
		}
		if r.DryRun {
			continue // its threshold of 1 is only reported
		}
		require.NoError(t, err, r.Resource)
		assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = e2.Allow(r.Resource, opts...) }), r.Resource)
		s, _ := e2.Snapshot(r.Resource)
		assert.Zero(t, s.Inflight, r.Resource)
	}
}

// TestAllowRacingANewConcurrencyRuleLeavesNothing: Allow traffic while a
// Concurrency rule is loaded and unloaded on its resource over and over
// (the rule adopts what is in flight): once it stops, nothing is left in
// flight or counted by the rule, so one request is admitted under a
// threshold of 1.
func TestAllowRacingANewConcurrencyRuleLeavesNothing(t *testing.T) {
	e, _ := newEngine(t, stat.NewMonotonic())
	stop := make(chan struct{})
	done := make(chan struct{})
	var wrong atomic.Int64
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.Allow("r"); err != nil && !errors.Is(err, ErrNeedsExit) {
					wrong.Inc()
				}
			}
		}()
	}
	for range 3000 {
		load(t, e, Rule{Resource: "r", Metric: Concurrency, Threshold: 1})
		load(t, e)
	}
	close(stop)
	for range 4 {
		<-done
	}
	assert.Zero(t, wrong.Load())
	load(t, e, Rule{Resource: "r", Metric: Concurrency, Threshold: 1})
	en, err := e.Entry("r")
	require.NoError(t, err, "nothing left in flight")
	en.Exit(nil)
	s, _ := e.Snapshot("r")
	assert.Zero(t, s.Inflight)
}

// A day is the longest window: its rules count in the buckets of any
// other (the engine's sample count of 6 h; a PerKey rule's 4 of 6 h; a
// span-exact rule's 11 of 2.4 h), on a fake clock.
func TestDayWindowsAdmitTheirThresholdPerDay(t *testing.T) {
	const day = 24 * time.Hour
	perDay := 5.0 / day.Seconds()
	for _, tc := range []struct {
		name  string
		rule  Rule
		opts  []EntryOption
		reset time.Duration // at 23 h: until the bucket of the five leaves
	}{
		{"window", Rule{Resource: "api", Threshold: perDay, StatInterval: day}, nil, time.Hour},
		{"span-exact", Rule{Resource: "api", Threshold: perDay, StatInterval: day, SpanExact: true}, nil, 5*time.Hour + 48*time.Minute},
		{"per key", Rule{Resource: "api", Threshold: perDay, StatInterval: day, PerKey: true}, []EntryOption{WithKey("ann")}, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock)
			load(t, e, tc.rule)
			for i := range 5 {
				clock.Set(time.Duration(i) * time.Hour)
				require.True(t, try(e, "api", tc.opts...), "hour %d", i)
			}
			clock.Set(23 * time.Hour)
			assert.False(t, try(e, "api", tc.opts...), "the sixth within the day")
			left, ok := e.Left("api", tc.opts...)
			require.True(t, ok)
			assert.Zero(t, left.Remaining)
			assert.Equal(t, tc.reset, left.Reset, "what the day holds leaves with its last bucket")
			if tc.rule.PerKey {
				assert.True(t, try(e, "api", WithKey("bob")), "another key has its own day")
			}
			// Once their buckets left the window, the next five.
			clock.Set(23*time.Hour + tc.reset)
			for i := range 5 {
				require.True(t, try(e, "api", tc.opts...), "the next day, request %d", i)
			}
			assert.False(t, try(e, "api", tc.opts...))
		})
	}
}
