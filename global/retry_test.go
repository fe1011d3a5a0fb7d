package global

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
)

// TestGlobalRefusalSaysWhenToRetry: a request a global rule refused is
// told when the shared window has room (Redis's retry-after), for a plain
// and a PerKey rule; coming back then, it is admitted. A resource with a
// second rule, or a source that failed, cannot say.
func TestGlobalRefusalSaysWhenToRetry(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), WithMaxBatch(1))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: "g-retry", Resource: "api", Threshold: 2, Global: true},
		{ID: "g-retry-key", Resource: "keyed", Threshold: 2, Global: true, PerKey: true},
		{ID: "g-retry-two", Resource: "two", Threshold: 2, Global: true},
		{Resource: "two", Threshold: 1000},
	}))
	for _, tc := range []struct {
		res  string
		opts []flow.EntryOption
	}{{"api", nil}, {"keyed", []flow.EntryOption{flow.WithKey("alice")}}} {
		for range 2 {
			en, err := eng.Entry(tc.res, tc.opts...)
			require.NoError(t, err, tc.res)
			en.Exit(nil)
		}
		en, err := eng.Entry(tc.res, tc.opts...)
		require.ErrorIs(t, err, flow.ErrBlocked, tc.res)
		d := en.Refusal().RetryAfter
		assert.Positive(t, d, tc.res)
		assert.LessOrEqual(t, d, time.Second, tc.res)
		time.Sleep(d + 20*time.Millisecond) // Redis's clock and ours tick apart by a little
		en, err = eng.Entry(tc.res, tc.opts...)
		require.NoError(t, err, "%s: admitted after the retry", tc.res)
		en.Exit(nil)
	}
	_, err = eng.Entry("keyed", flow.WithKey("bob"))
	require.NoError(t, err, "bob has his own limit")

	for range 2 {
		en, err := eng.Entry("two")
		require.NoError(t, err)
		en.Exit(nil)
	}
	en, err := eng.Entry("two")
	require.ErrorIs(t, err, flow.ErrBlocked)
	d := en.Refusal().RetryAfter
	assert.Positive(t, d, "two rules: the global one's wait, the local one had room")
	assert.LessOrEqual(t, d, time.Second)
	assert.Equal(t, "g-retry-two", en.Refusal().Err.Rule.ID)
}

// TestFailedSourceCannotSay: a global rule whose source failed (Redis
// gone, FallbackClosed) blocks without a retry time.
func TestFailedSourceCannotSay(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), WithMaxBatch(1), WithTimeout(50*time.Millisecond))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "g-down", Resource: "api", Threshold: 2, Global: true, Fallback: flow.FallbackClosed}}))
	srv.Stop()
	en, err := eng.Entry("api", flow.WithContext(context.Background()))
	require.ErrorIs(t, err, flow.ErrBlocked)
	assert.Negative(t, en.Refusal().RetryAfter)
}
