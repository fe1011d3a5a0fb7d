package flow

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// gcraSource is a token source that records what it is asked and fails
// while err is set.
type gcraSource struct {
	mu   sync.Mutex
	reqs []GlobalRequest
	err  error
}

func (s *gcraSource) Acquire(_ context.Context, req GlobalRequest) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, req)
	return s.err == nil, s.err
}

func (s *gcraSource) fail(err error) {
	s.mu.Lock()
	s.err = err
	s.mu.Unlock()
}

// TestGlobalGCRARequest: a Global GCRA rule asks its source with the
// bucket's shape, and a window rule of the same ID without it.
func TestGlobalGCRARequest(t *testing.T) {
	src := &gcraSource{}
	e, _ := newEngine(t, stattest.NewClock(time.Second), WithTokenSource(src))
	load(t, e,
		Rule{ID: "bucket", Resource: "g", Threshold: 10, Behavior: GCRA, Burst: 5, Global: true, LocalShare: 0.5},
		Rule{ID: "bucket", Resource: "w", Threshold: 10, Global: true},
	)
	require.True(t, try(e, "g", WithCount(2)))
	require.True(t, try(e, "w"))
	require.Len(t, src.reqs, 2)
	g, w := src.reqs[0], src.reqs[1]
	assert.True(t, g.GCRA)
	assert.Equal(t, int64(5), g.Burst)
	assert.Equal(t, int64(2), g.Count)
	assert.Equal(t, 10.0, g.Threshold)
	assert.Equal(t, 0.5, g.LocalShare)
	assert.False(t, w.GCRA, "a window rule")
	assert.Zero(t, w.Burst)
	assert.Equal(t, g.Key, w.Key, "one identity: the source keeps the two kinds apart")
}

// TestGlobalGCRAFallbacks: while the source fails, FallbackLocal is a
// local bucket at LocalShare of the rate and burst (kept across a reload
// that keeps the rule), Closed refuses and Open admits; a local
// admission a later rule blocks is given back.
func TestGlobalGCRAFallbacks(t *testing.T) {
	src := &gcraSource{}
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock, WithTokenSource(src))
	rules := []Rule{
		// Local: 10/s x 0.5 = 5/s, burst floor(5 x 0.5) = 2.
		{ID: "local", Resource: "l", Threshold: 10, Behavior: GCRA, Burst: 5, Global: true, LocalShare: 0.5},
		{ID: "tiny", Resource: "t", Threshold: 10, Behavior: GCRA, Burst: 1, Global: true, LocalShare: 0.5},
		{ID: "open", Resource: "o", Threshold: 10, Behavior: GCRA, Burst: 5, Global: true, Fallback: FallbackOpen},
		{ID: "closed", Resource: "c", Threshold: 10, Behavior: GCRA, Burst: 5, Global: true, Fallback: FallbackClosed},
		{ID: "later", Resource: "x", Threshold: 10, Behavior: GCRA, Burst: 2, Global: true, LocalShare: 1},
		{Resource: "x", Metric: Concurrency, Threshold: 0},
	}
	load(t, e, rules...)
	src.fail(errors.New("down"))

	count := func(res string, tries int) int {
		n := 0
		for range tries {
			if try(e, res) {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 2, count("l", 10), "the local burst: floor(5 x 0.5)")
	assert.Equal(t, 1, count("t", 10), "a local burst of at least 1")
	assert.Equal(t, 10, count("o", 10), "Open admits")
	assert.Equal(t, 0, count("c", 10), "Closed refuses")
	en, err := e.Entry("l")
	require.ErrorIs(t, err, ErrBlocked)
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonFlow, be.Reason, "refused by the local fallback")
	_, ok := en.retryAfter()
	assert.False(t, ok, "a fallback's refusal does not say when")

	clock.Advance(200 * time.Millisecond) // 5/s: one token back
	assert.Equal(t, 1, count("l", 10))
	load(t, e, rules...) // a reload that keeps the rule keeps its bucket
	assert.Equal(t, 0, count("l", 10), "the reload kept the empty bucket")
	clock.Advance(time.Second)
	assert.Equal(t, 2, count("l", 10), "refilled to the local burst only")

	// The Concurrency rule of 0 blocks every request after the local
	// bucket took its token: the token goes back each time.
	assert.Equal(t, 0, count("x", 10))
	load(t, e, rules[4])
	assert.Equal(t, 2, count("x", 10), "both tokens were given back")

	src.fail(nil)
	assert.Equal(t, 10, count("c", 10), "the source decides again")
}

// TestGlobalGCRAValidation: what a Global GCRA rule refuses names the
// field and value.
func TestGlobalGCRAValidation(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0), WithTokenSource(&gcraSource{}))
	for _, tc := range []struct {
		rule Rule
		want string
	}{
		{Rule{Resource: "a", Threshold: 1, Behavior: GCRA, Global: true, PerKey: true}, "Behavior GCRA is for plain local or Global rules (not PerKey or related), got GCRA"},
		{Rule{Resource: "a", Threshold: 1, Behavior: GCRA, Global: true, Burst: -1}, "Burst must be in [1, 1073741824], got -1"},
		{Rule{Resource: "a", Threshold: 0.001, Behavior: GCRA, Global: true, Burst: 10_000}, "Burst takes 1e+07 s to refill at Threshold 0.001, more than a GCRA rule allows (720h0m0s), got 10000"},
		{Rule{Resource: "a", Threshold: 0.001, Behavior: GCRA, Global: true, LocalShare: 0.5}, "LocalShare leaves a local rate of 0.0005/s, below 0.001 (one request per 1000 s), for a GCRA rule of Threshold 0.001, got 0.5"},
		{Rule{Resource: "a", Threshold: 1, Behavior: GCRA, Global: true, StatInterval: 2 * time.Second}, "StatInterval must be 1s (or left zero) for GCRA rules, which have no window, got 2s"},
		{Rule{Resource: "a", Threshold: 1, Behavior: Throttle, Global: true}, "Behavior must be Reject or GCRA for a Global rule, got Throttle"},
		{Rule{Resource: "a", Threshold: 1, Behavior: GCRA, Global: true, Fallback: FallbackOpen, LocalShare: 0.5}, "LocalShare is used only by Global rules with Fallback Local and must be left zero here, got 0.5"},
	} {
		err := e.LoadRules([]Rule{tc.rule})
		require.ErrorIs(t, err, ErrInvalidRule, tc.want)
		assert.ErrorContains(t, err, tc.want)
	}
	// The edges that pass: a bucket that refills in exactly 30 days, a
	// local share of exactly 0.001/s, and a rule of 0 (refuses all).
	require.NoError(t, e.LoadRules([]Rule{
		{Resource: "a", Threshold: 0.001, Behavior: GCRA, Global: true, Burst: 2592},
		{Resource: "b", Threshold: 0.002, Behavior: GCRA, Global: true, LocalShare: 0.5},
		{Resource: "c", Threshold: 0, Behavior: GCRA, Global: true, Burst: 3},
	}))
}
