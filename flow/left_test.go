package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestLeftReadsTheStrictestRule: Left says what the rule with the least
// left has left and when its window empties, for a window, a PerKey rule
// (the caller's key; a key never seen has its whole limit) and a GCRA
// rule, on a fake clock, counting nothing and allocating nothing.
func TestLeftReadsTheStrictestRule(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{ID: "all", Resource: "api", Threshold: 5},
		Rule{ID: "each", Resource: "api", Threshold: 3, PerKey: true},
		Rule{ID: "bucket", Resource: "gcra", Threshold: 1, Behavior: GCRA, Burst: 4},
		Rule{Resource: "paced", Threshold: 1, Behavior: Throttle},
	)
	clock.Set(100 * ms)
	for range 2 {
		require.True(t, try(e, "api", WithKey("a")))
	}
	l, ok := e.Left("api", WithKey("a"))
	require.True(t, ok)
	assert.Equal(t, "each", l.Err.Rule.ID, "a has 1 left, the resource 3")
	assert.Equal(t, int64(1), l.Remaining)
	assert.Equal(t, 900*ms, l.Reset, "a's bucket of 0-250 ms leaves at 1 s")

	l, ok = e.Left("api", WithKey("new"))
	require.True(t, ok)
	assert.Equal(t, "all", l.Err.Rule.ID, "a new key has 3 left, as the resource: the first rule")
	assert.Equal(t, int64(3), l.Remaining)
	assert.Equal(t, 900*ms, l.Reset, "the bucket of 0-250 ms leaves at 1 s")

	require.True(t, try(e, "api", WithKey("b")))
	require.True(t, try(e, "api", WithKey("c")))
	l, _ = e.Left("api", WithKey("new"))
	assert.Equal(t, int64(1), l.Remaining, "the resource has 1 left")
	require.True(t, try(e, "api", WithKey("d")))
	l, _ = e.Left("api", WithKey("a"))
	assert.Equal(t, int64(0), l.Remaining)
	assert.False(t, try(e, "api", WithKey("new")), "and 0 it is")

	for range 3 {
		require.True(t, try(e, "gcra"))
	}
	l, ok = e.Left("gcra")
	require.True(t, ok)
	assert.Equal(t, "bucket", l.Err.Rule.ID)
	assert.Equal(t, int64(1), l.Remaining)
	assert.Equal(t, 3*time.Second, l.Reset, "3 tokens at 1/s")

	_, ok = e.Left("paced")
	assert.False(t, ok, "a Throttle rule is not read")
	_, ok = e.Left("nowhere")
	assert.False(t, ok)
	_, ok = e.Left("api", WithKey(""))
	assert.False(t, ok, "an invalid option")

	s, _ := e.Snapshot("api")
	assert.Equal(t, 5.0, s.PassQPS+s.BlockQPS-1, "Left counted nothing: 5 passed, 1 blocked")
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = e.Left("api", WithKey("a")) }))
}
