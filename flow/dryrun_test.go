package flow

import (
	"context"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// TestDryRunIsForQPSRejectRules: other kinds are refused, naming DryRun.
func TestDryRunIsForQPSRejectRules(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	for _, r := range []Rule{
		{Resource: "a", Metric: Concurrency, Threshold: 1, DryRun: true},
		{Resource: "a", Threshold: 1, Behavior: Throttle, DryRun: true},
		{Resource: "a", Threshold: 1, PerKey: true, DryRun: true},
		{Resource: "a", Threshold: 1, RelatedResource: "b", DryRun: true},
	} {
		err := e.LoadRules([]Rule{r})
		var re *RuleError
		require.ErrorAs(t, err, &re, "%+v", r)
		assert.Equal(t, "DryRun", re.Field)
	}
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
