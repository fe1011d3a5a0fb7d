package global

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
)

// A request whose context is cancelled is refused: it neither falls back
// (FallbackOpen would admit it uncounted) nor marks the instance as fallen
// back (its share would then be kept from the others for a window).
func TestCancelledRequestDoesNotFallBack(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), Options{MaxBatch: 1})
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "cancel", Resource: "api", Threshold: 5, Global: true, Fallback: flow.FallbackOpen}}))
	for range 5 {
		en, err := eng.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range 20 {
		_, err := eng.Entry("api", flow.WithContext(ctx))
		require.Error(t, err, "refused, not admitted by the fallback")
	}
	snap, _ := eng.Snapshot("api")
	assert.Zero(t, snap.Fallbacks)
	assert.False(t, src.fellBack.Load(), "not counted as a fallback of the instance")
}

// A rule reloaded with other thresholds keeps one limit in the Source, and
// its share follows the latest rule.
func TestReloadsKeepOneLimit(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), Options{})
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	for i := range 50 {
		require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "reload", Resource: "api", Threshold: float64(1000 - 10*i), Global: true, LocalShare: 0.5}}))
	}
	n := 0
	var l *limit
	src.limits.Range(func(_, v any) bool { n, l = n+1, v.(*limit); return true })
	assert.Equal(t, 1, n, "one limit whatever the threshold")
	assert.Equal(t, int64(255), l.share.Load(), "half of the latest threshold, 510")
}

// Instances that died without a word (their presence lapsed) keep at most
// half the threshold from the others.
func TestLapsedSharesKeepAtMostHalf(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	src := newSource(t, c, Options{MaxBatch: 1})
	r := req("lapsed", 100, time.Second, 1)
	l := src.limitFor(r)
	now, err := c.Time(t.Context()).Result()
	require.NoError(t, err)
	lapsed := strconv.FormatInt(now.UnixMicro()-1000, 10) + ",40,0"
	for i := range 4 { // 4 x 40: more than the threshold
		require.NoError(t, c.HSet(t.Context(), l.keys.window, fmt.Sprintf("p:dead%d", i), lapsed).Err())
	}
	admitted := 0
	for range 100 {
		if ok, err := src.Acquire(t.Context(), r); err == nil && ok {
			admitted++
		}
	}
	assert.Equal(t, 50, admitted, "half the threshold is left")
}

// After Close, requests that no lease serves are refused, not failed over:
// the closed Source took its presence away.
func TestClosedSourceRefuses(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), Options{MaxBatch: 1})
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "closed", Resource: "api", Threshold: 100, Global: true, LocalShare: 0.5}}))
	require.NoError(t, src.Close())
	for range 10 {
		_, err := eng.Entry("api")
		require.Error(t, err)
	}
	snap, _ := eng.Snapshot("api")
	assert.Zero(t, snap.Fallbacks)
	assert.Equal(t, int64(10), src.Stats().Refused)
}

// A refused request for 5 does not close the window to smaller ones.
func TestLargeRefusalLeavesRoomForSmall(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), Options{MaxBatch: 1})
	r := req("sizes", 10, time.Second, 1)
	for range 7 {
		ok, err := src.Acquire(t.Context(), r)
		require.NoError(t, err)
		require.True(t, ok)
	}
	big := r
	big.Count = 5
	ok, err := src.Acquire(t.Context(), big)
	require.NoError(t, err)
	require.False(t, ok)
	for i := range 3 {
		ok, err := src.Acquire(t.Context(), r)
		require.NoError(t, err)
		assert.True(t, ok, "single request %d: 3 left", i)
	}
}

// With buckets that do not divide the interval, a refusal's retry-after
// is when the window has room again.
func TestRetryAfterWithUnevenBuckets(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), Options{Buckets: 3})
	r := req("uneven", 3, time.Second, 1)
	for range 3 {
		d, err := src.takeFor(r, 0)
		require.NoError(t, err)
		require.True(t, d.Allowed)
	}
	d, err := src.takeFor(r, 0)
	require.NoError(t, err)
	require.False(t, d.Allowed)
	require.Positive(t, d.RetryAfter)
	time.Sleep(d.RetryAfter + 20*time.Millisecond)
	d, err = src.takeFor(r, 0)
	require.NoError(t, err)
	assert.True(t, d.Allowed, "room again after the retry-after")
}

// A threshold under one per window admits nothing, without a round trip.
func TestThresholdBelowOneAsksNothing(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), Options{})
	r := req("tiny", 0.5, time.Second, 1)
	for range 100 {
		ok, err := src.Acquire(t.Context(), r)
		require.NoError(t, err)
		require.False(t, ok)
	}
	assert.Zero(t, src.Stats().Calls)
}

// A call for many waiting requests still leases beyond them.
func TestCallLeasesBeyondItsRequests(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), Options{})
	r := req("beyond", 1e6, time.Second, 1)
	l := src.limitFor(r)
	d, err := src.take(l, perWindow(r), 1, 300, 100)
	require.NoError(t, err)
	assert.Equal(t, int64(400), d.Granted, "300 for the requests, 100 leased")
}
