package global

import (
	"context"
	"fmt"
	"strconv"
	"sync"
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
	src := newSource(t, srv.Client(), WithMaxBatch(1))
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
	src.limits.Range(func(_, v any) bool {
		assert.False(t, v.(*limit).fellBack.Load(), "not counted as a fallback of the limit")
		return true
	})
}

// A rule reloaded with other thresholds keeps one limit in the Source, and
// its share follows the latest rule.
func TestReloadsKeepOneLimit(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
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
	src := newSource(t, c, WithMaxBatch(1))
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
	src := newSource(t, srv.Client(), WithMaxBatch(1))
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
	src := newSource(t, srv.Client(), WithMaxBatch(1))
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
	src := newSource(t, srv.Client(), WithBuckets(3))
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
	src := newSource(t, srv.Client())
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
	src := newSource(t, srv.Client())
	r := req("beyond", 1e6, time.Second, 1)
	l := src.limitFor(r)
	d, err := src.take(l, perWindow(r), 1, 300, 100)
	require.NoError(t, err)
	assert.Equal(t, int64(400), d.Granted, "300 for the requests, 100 leased")
}

// An exact limit (sliding log) half full; Redis was backed off and the
// backoff just ended: the probe (a call for no request) must not close the
// window locally (its retry-after used to be read from the wrong end of
// the log).
func TestProbeOnExactLimitLeavesItOpen(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client(), WithExactBelow(1000))
	r := req("exactprobe", 10, time.Second, 1)
	ctx := context.Background()
	for range 5 {
		ok, err := s.Acquire(ctx, r)
		require.NoError(t, err)
		require.True(t, ok)
	}
	l := s.limitFor(r)
	// Backing off, and the backoff has just ended.
	l.failures.Store(2)
	l.downUntil.Store(s.opts.Clock.Now() - 1)
	_, err := s.Acquire(ctx, r)
	require.ErrorIs(t, err, ErrUnavailable)
	require.Eventually(t, func() bool { f := l.cur.Load(); return f != nil && f.ended.Load() && l.downUntil.Load() == 0 },
		2*time.Second, time.Millisecond)
	f := l.cur.Load()
	t.Logf("probe: err=%v refused=%v closed=%+v", f.err, f.refused, l.closed.Load())
	admitted := 0
	for range 5 {
		if ok, _ := s.Acquire(ctx, r); ok {
			admitted++
		}
	}
	assert.Equal(t, 5, admitted, "5 of 10 used: 5 more fit, but the probe closed the window")
}

// Redis stalls for one CallTimeout while an instance has calls out on many
// limits: they all fail at once, and the backoff must stay Backoff (it
// used to jump to MaxBackoff, though no probe had failed).
func TestManyFailedCallsDoNotDoubleTheBackoff(t *testing.T) {
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr(), 0)
	s := newSource(t, p.Client(), WithTimeout(50*time.Millisecond), WithCallTimeout(300*time.Millisecond))
	ctx := context.Background()
	const limits = 20
	for i := range limits { // warm: scripts loaded, connections made
		_, err := s.Acquire(ctx, req(fmt.Sprint("k", i), 1000, time.Second, 1))
		require.NoError(t, err)
	}
	// Stall: replies take 10 s. Requests on every limit without a lease.
	p.SetRTT(10 * time.Second)
	var wg sync.WaitGroup
	for i := range limits {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = s.Acquire(ctx, req(fmt.Sprint("k", i), 1000, time.Second, 1000)) // no lease serves 1000
		}()
	}
	wg.Wait()
	time.Sleep(400 * time.Millisecond) // the calls time out
	p.SetRTT(0)
	p.Drop()
	var down time.Duration
	s.limits.Range(func(_, v any) bool {
		down = max(down, time.Duration(v.(*limit).downUntil.Load()-s.opts.Clock.Now()))
		return true
	})
	t.Logf("backing off for %v more at most", down)
	assert.Less(t, down, 200*time.Millisecond, "doc: Backoff (100 ms) doubles only after FailAfter failed probes")
}

// Three instances hammer one limit of small buckets through a delaying
// proxy whose connections drop every so often; one closes midway. Every
// server window must hold at most the threshold; the race detector watches.
func TestStressBoundUnderDropsAndClose(t *testing.T) {
	srv := redistest.Start(t)
	p := redistest.StartProxy(t, srv.Addr(), 4*time.Millisecond)
	audit := NewAudit()
	const perSec, interval = 500.0, 200 * time.Millisecond // 100 per window, buckets of 20 ms
	var srcs []*Source
	for range 3 {
		srcs = append(srcs, newSource(t, p.Client(), WithTimeout(30*time.Millisecond), WithOnAdmit(audit.Record)))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var admitted [3]int64
	var mu sync.Mutex
	for i, s := range srcs {
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				b := s.Bind(req("stress", perSec, interval, 1))
				n := int64(1 + g%3)
				for {
					select {
					case <-stop:
						return
					default:
					}
					ok, _ := b.Acquire(context.Background(), n)
					if ok {
						mu.Lock()
						admitted[i] += n
						mu.Unlock()
					}
					if g%2 == 0 {
						time.Sleep(100 * time.Microsecond)
					}
				}
			}()
		}
	}
	for k := range 15 {
		time.Sleep(100 * time.Millisecond)
		if k%4 == 3 {
			p.Drop()
		}
		if k == 8 {
			require.NoError(t, srcs[2].Close())
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("admitted %v, fullest window %d (threshold 100), total %d", admitted, audit.Fullest(interval), audit.Total())
	for _, s := range srcs {
		t.Logf("%+v", s.Stats())
	}
	assert.LessOrEqual(t, audit.Fullest(interval), int64(100))
}

// After Close, lease takes that want a top-up make no chain of flights
// (each used to keep the one before it).
func TestNoFlightChainAfterClose(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client())
	r := req("chain", 1e6, time.Second, 1)
	ok, err := s.Acquire(context.Background(), r)
	require.NoError(t, err)
	require.True(t, ok)
	l := s.limitFor(r)
	require.NoError(t, s.Close())
	now := s.opts.Clock.Now()
	for i := range l.leases {
		ls := &lease{deadline: now + int64(time.Minute), installed: now - int64(time.Second)}
		ls.size.Store(1_000_000)
		ls.left.Store(200_000) // 80% spent in 1 s of a minute: short
		l.leases[i].Store(ls)
	}
	for range 10_000 {
		_, _ = s.Acquire(context.Background(), r)
	}
	depth := 0
	for f := l.cur.Load(); f != nil; f = f.prev {
		depth++
	}
	t.Logf("flight chain after 10000 lease takes: %d", depth)
	assert.Less(t, depth, 3)
}
