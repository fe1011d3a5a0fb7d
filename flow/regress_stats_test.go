package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRegressSpanExactWaiterCountsOccupied: the doc says a waiter admitted
// against a later bucket of a Reject or span-exact window "counts as Pass
// and OccupiedPass there". A plain Reject waiter shows in the resource's
// OccupiedQPS; a span-exact one does not (its borrow is folded into the
// span window, which no statistic reads, and the node gets only a Pass).
func TestRegressSpanExactWaiterCountsOccupied(t *testing.T) {
	for _, span := range []bool{false, true} {
		e, clock, _ := waitEngine(t)
		load(t, e, Rule{Resource: "api", Threshold: 4, SpanExact: span})
		clock.Set(100 * ms)
		for range 4 {
			en, err := e.Entry("api")
			require.NoError(t, err)
			en.Exit(nil)
		}
		en, err := e.Entry("api", WithWait(2*time.Second))
		require.NoError(t, err, "span=%v", span)
		en.Exit(nil)
		snap, ok := e.Snapshot("api")
		require.True(t, ok)
		assert.Equal(t, 1.0, snap.OccupiedQPS, "span=%v: the waiter's occupied pass (stamp %d, now %d)", span, en.Start(), clock.Now())
	}
}
