package flow

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

// TestDryRunCountsWithoutBlocking: a dry-run rule blocks nothing and
// counts, in a window of its own, what it would have blocked of what the
// other rules admitted; a reload that keeps it keeps its count.
func TestDryRunCountsWithoutBlocking(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	rules := []Rule{
		{ID: "real", Resource: "api", Threshold: 5},
		{ID: "trial", Resource: "api", Threshold: 2, DryRun: true},
		{ID: "alone", Resource: "other", Threshold: 1, DryRun: true},
	}
	load(t, e, rules...)
	clock.Set(100 * ms)
	admitted := 0
	for range 7 {
		if try(e, "api") {
			admitted++
		}
	}
	assert.Equal(t, 5, admitted, "the real rule decides")
	for range 3 {
		require.True(t, try(e, "other"), "a dry-run rule alone blocks nothing")
	}
	runs := e.DryRuns()
	require.Len(t, runs, 2)
	assert.Equal(t, "trial", runs[0].Rule.ID)
	assert.Equal(t, int64(3), runs[0].WouldBlock, "of the 5 admitted, 3 over its 2")
	assert.Equal(t, int64(2), runs[1].WouldBlock)

	clock.Set(1500 * ms) // a new window: the trial admits 2 again
	for range 3 {
		require.True(t, try(e, "api"))
	}
	load(t, e, rules...) // unchanged: kept
	assert.Equal(t, int64(4), e.DryRuns()[0].WouldBlock)

	// A dry-run rule does not speak for the resource: one real rule still
	// says when to retry.
	clock.Set(1600 * ms)
	for range 2 {
		try(e, "api")
	}
	en, err := e.Entry("api")
	require.ErrorIs(t, err, ErrBlocked)
	_, ok := en.retryAfter()
	assert.True(t, ok)
}

// TestDryRunCoversEveryKind: a dry-run rule of every kind blocks nothing
// and counts what it would have blocked, as that kind in force would have
// (a fake clock, one resource per kind, a real rule admitting everything);
// a PerKey Concurrency rule cannot be dry-run, naming DryRun.
func TestDryRunCoversEveryKind(t *testing.T) {
	clock := stattest.NewClock(0)
	refuseOver2 := atomic.Int64{}
	src := sourceFunc(func(_ context.Context, req GlobalRequest) (bool, error) {
		return refuseOver2.Add(req.Count) <= 2, nil
	})
	e, _ := newEngine(t, clock, WithTokenSource(src))
	dry := []Rule{
		{ID: "per-key", Resource: "per-key", Threshold: 2, PerKey: true},
		{ID: "global", Resource: "global", Threshold: 2, Global: true},
		{ID: "concurrency", Resource: "concurrency", Metric: Concurrency, Threshold: 2},
		{ID: "gcra", Resource: "gcra", Threshold: 1, Behavior: GCRA, Burst: 2},
		{ID: "throttle", Resource: "throttle", Threshold: 10, Behavior: Throttle, MaxQueueing: 100 * ms},
		{ID: "warm-up", Resource: "warm-up", Threshold: 30, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second, ColdFactor: 3},
		{ID: "span-exact", Resource: "span-exact", Threshold: 2, SpanExact: true},
		{ID: "related", Resource: "related", Threshold: 2, RelatedResource: "per-key"},
	}
	var rules []Rule
	for _, r := range dry {
		r.DryRun = true
		rules = append(rules, r, Rule{Resource: r.Resource, Threshold: 1e6})
	}
	load(t, e, rules...)
	clock.Set(100 * ms)
	var held []Entry
	for _, r := range dry {
		for i := range 5 {
			var opts []EntryOption
			if r.PerKey {
				opts = append(opts, WithKey([]string{"a", "a", "a", "a", "b"}[i]))
			}
			en, err := e.Entry(r.Resource, opts...)
			require.NoError(t, err, "%s: a dry-run rule blocks nothing", r.ID)
			if r.Metric == Concurrency {
				held = append(held, en) // all 5 in flight
				continue
			}
			en.Exit(nil)
		}
	}
	want := map[string]int64{
		"per-key":     2, // a's third and fourth; b's one fits
		"global":      3, // the source admits 2
		"concurrency": 3, // the 3rd, 4th and 5th find 2 in flight
		"gcra":        3, // a burst of 2
		"throttle":    3, // slots 100 ms apart, 100 ms of queue: 2 fit
		"warm-up":     0, // cold, a third of 30/s: 10 fit
		"span-exact":  3,
		"related":     5, // per-key passed 5 this second, over 2
	}
	got := map[string]int64{}
	for _, d := range e.DryRuns() {
		got[d.Rule.ID] = d.WouldBlock
	}
	assert.Equal(t, want, got)
	for _, en := range held {
		en.Exit(nil)
	}
	assert.Equal(t, "concurrency: Concurrency 2 in flight (dry run)", Rule{ID: "concurrency", Metric: Concurrency, Threshold: 2, DryRun: true}.String())

	err := e.LoadRules([]Rule{{Resource: "a", Metric: Concurrency, Threshold: 1, PerKey: true, DryRun: true}})
	var re *RuleError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, "DryRun", re.Field)
}

// A Throttle wait that is cancelled was never admitted: the dry-run rule
// beside it counts nothing for it, and its window stays free for the
// requests that do go (none of them counts as would-block).
func TestDryRunCountsNoCancelledThrottleWait(t *testing.T) {
	clock := stattest.NewClock(0)
	e, err := New(WithClock(clock), WithSleep(func(ctx context.Context, d time.Duration) error {
		return context.Canceled // every caller gives up its wait
	}))
	require.NoError(t, err)
	load(t, e,
		Rule{ID: "pace", Resource: "api", Threshold: 10, Behavior: Throttle, MaxQueueing: time.Second},
		Rule{ID: "trial", Resource: "api", Threshold: 2, DryRun: true},
	)
	clock.Set(100 * ms)
	admitted := 0
	for range 6 {
		if en, err := e.Entry("api"); err == nil {
			admitted++
			en.Exit(nil)
		}
	}
	require.Equal(t, 1, admitted, "only the request that needed no wait")
	assert.Equal(t, int64(0), e.DryRuns()[0].WouldBlock, "of 1 admitted request a threshold-2 rule blocks none")
}

// A priority request the real rule admits by borrowing from the next window
// is shaded the same way by a dry-run twin of that rule (same threshold):
// the twin reports no would-block the rule in force did not make.
func TestDryRunTwinOfARealRuleAgreesOnPriorityBorrows(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{ID: "real", Resource: "api", Threshold: 5},
		Rule{ID: "twin", Resource: "api", Threshold: 5, DryRun: true},
	)
	clock.Set(100 * ms)
	for i := range 8 {
		var opts []EntryOption
		if i >= 5 {
			opts = append(opts, WithWait(time.Second))
		}
		en, err := e.Entry("api", opts...)
		require.NoError(t, err, "the real rule admits all 8 (3 borrowed)")
		en.Exit(nil)
	}
	assert.Equal(t, int64(0), e.DryRuns()[0].WouldBlock, "its twin in force would have admitted them too")
}

// TestDryRunsAllocateNothing: Entry and Exit on a resource with a dry-run
// rule of every kind allocate nothing, once their state exists.
func TestDryRunsAllocateNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Second), WithTokenSource(stubSource))
	var rules []Rule
	for _, r := range everyKind() {
		if r.PerKey && r.Metric == Concurrency || r.DryRun {
			continue
		}
		r.Resource, r.DryRun = "dry", true
		rules = append(rules, r)
	}
	load(t, e, append(rules, Rule{Resource: "dry", Threshold: 1e12})...)
	for range 3 {
		en, err := e.Entry("dry", WithKey("k"))
		require.NoError(t, err)
		en.Exit(nil)
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() {
		en, err := e.Entry("dry", WithKey("k"))
		if err == nil {
			en.Exit(nil)
		}
	}))
}

// TestDryRunGlobalTakesNothingFromTheRealLimit: a dry-run Global rule asks
// its source for a limit of its own, whatever its ID, so that the rule in
// force beside it (no IDs, or the same one) admits its whole limit.
func TestDryRunGlobalTakesNothingFromTheRealLimit(t *testing.T) {
	for _, ids := range [][2]string{{"", ""}, {"g", "g"}, {"g", "g-dry"}} {
		var mu sync.Mutex
		taken := map[string]int64{}
		src := sourceFunc(func(_ context.Context, req GlobalRequest) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			if taken[req.Key]+req.Count > 10 {
				return false, nil
			}
			taken[req.Key] += req.Count
			return true, nil
		})
		e, _ := newEngine(t, stattest.NewClock(0), WithTokenSource(src))
		load(t, e,
			Rule{ID: ids[0], Resource: "r", Threshold: 10, Global: true, Fallback: FallbackClosed},
			Rule{ID: ids[1], Resource: "r", Threshold: 5, Global: true, Fallback: FallbackClosed, DryRun: true},
		)
		admitted := 0
		for range 20 {
			if try(e, "r") {
				admitted++
			}
		}
		assert.Equal(t, 10, admitted, "IDs %q", ids)
		assert.Equal(t, int64(0), e.DryRuns()[0].WouldBlock, "IDs %q: its own limit of 10 admitted the 10", ids)
		assert.Len(t, taken, 2, "IDs %q: two limits", ids)
	}
}
