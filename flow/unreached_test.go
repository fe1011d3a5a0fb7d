package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestUnreachedRulesAreReported: a rule whose resource sees no request
// while a catch-all resource does is reported, once it has been in force
// for 10 s, and no longer once its resource counts one (passed or
// blocked); a reload that keeps rules on the resource keeps its time; no
// catch-all traffic, nothing reported.
func TestUnreachedRulesAreReported(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	rules := []Rule{
		{Resource: "GET /items/{id}", Threshold: 10},
		{Resource: "GET /other", Threshold: 10},
		{Resource: "GET /dry", Threshold: 10, DryRun: true},
	}
	load(t, e, rules...)
	assert.Nil(t, e.Unreached(), "no catch-all traffic")
	for range 5 {
		require.True(t, try(e, "GET /other"))
		require.True(t, try(e, "http"+CatchAllSuffix))
	}
	clock.Advance(5 * time.Second)
	assert.Nil(t, e.Unreached(), "in force for 5 s: too soon")
	load(t, e, rules...)
	clock.Advance(6 * time.Second)
	got := e.Unreached()
	require.Len(t, got, 2, "the reload kept their time")
	assert.Equal(t, "GET /items/{id}", got[0].Resource)
	assert.Equal(t, "GET /dry", got[1].Resource)

	for range 11 {
		try(e, "GET /items/{id}") // the 11th is blocked: counted too
	}
	got = e.Unreached()
	require.Len(t, got, 1)
	assert.Equal(t, "GET /dry", got[0].Resource)

	clock.Advance(2 * time.Minute)
	assert.Nil(t, e.Unreached(), "the catch-all's traffic is over a minute old")

	// Two quiet minutes after "GET /items/{id}" and "GET /other" were
	// reached: they still were, whatever the catch-all sees now.
	require.True(t, try(e, "http"+CatchAllSuffix))
	got = e.Unreached()
	require.Len(t, got, 1)
	assert.Equal(t, "GET /dry", got[0].Resource)

	// A rule that refuses everything it sees is reached.
	load(t, e, append(rules, Rule{Resource: "GET /closed", Threshold: 0})...)
	clock.Advance(11 * time.Second)
	try(e, "GET /closed")
	require.True(t, try(e, "http"+CatchAllSuffix))
	for _, r := range e.Unreached() {
		assert.NotEqual(t, "GET /closed", r.Resource)
	}
}
