package flow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// BUG 14: shade() runs before a Throttle wait and is not undone when the
// wait is cancelled: the dry-run rule counts requests that were never
// admitted, and they fill its window (the next ones count as would-block).
func TestDryRunHostileDryRunCountsCancelledThrottleWaits(t *testing.T) {
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

// BUG 15: a priority request the real rule admits by borrowing from the
// next window is shaded with a plain AdmitOn: a dry-run twin of the real
// rule (same threshold) reports would-blocks the rule in force never made.
func TestDryRunHostileDryRunTwinOfRealRuleWithPriority(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithOccupyTimeout(time.Second))
	load(t, e,
		Rule{ID: "real", Resource: "api", Threshold: 5},
		Rule{ID: "twin", Resource: "api", Threshold: 5, DryRun: true},
	)
	clock.Set(100 * ms)
	for i := range 8 {
		var opts []EntryOption
		if i >= 5 {
			opts = append(opts, WithPriority())
		}
		en, err := e.Entry("api", opts...)
		require.NoError(t, err, "the real rule admits all 8 (3 borrowed)")
		en.Exit(nil)
	}
	assert.Equal(t, int64(0), e.DryRuns()[0].WouldBlock, "its twin in force would have admitted them too")
}
