package global

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
	"github.com/leapflow/leapflow/stat/stattest"
)

// windowSum is what a limit's window hash on Redis counts (its bucket
// fields).
func windowSum(t *testing.T, srv *redistest.Server, hash string) int64 {
	t.Helper()
	kv, err := srv.Client().HGetAll(context.Background(), hash).Result()
	require.NoError(t, err)
	var sum int64
	for f, v := range kv {
		if _, err := strconv.ParseInt(f, 10, 64); err != nil {
			continue // not a bucket
		}
		n, err := strconv.ParseInt(v, 10, 64)
		require.NoError(t, err)
		sum += n
	}
	return sum
}

// TestRestartedRedisHoldsWhatTheFallbackAdmitted: an instance that fell
// back while Redis was down carries what it admitted on its own into the
// limit's window once Redis is back, though Redis restarted empty: the
// window then holds those admissions and the one Redis granted, and the
// others cannot admit them again. Before, the restarted window held only
// what Redis granted, and four instances each admitted their share twice
// within a second.
func TestRestartedRedisHoldsWhatTheFallbackAdmitted(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []Option
		span bool
	}{
		{"window", nil, false},
		{"span-exact", nil, true},
		{"log", []Option{WithExactBelow(1000)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			var granted atomic.Int64
			src, err := New(srv.Client(), append([]Option{WithMaxBatch(1), WithBackoff(0), WithFailAfter(1),
				WithOnAdmit(func(_ time.Time, n int64) { granted.Add(n) })}, tc.opts...)...)
			require.NoError(t, err)
			t.Cleanup(func() { _ = src.Close() })
			eng, err := flow.New(flow.WithTokenSource(src))
			require.NoError(t, err)
			rule := flow.Rule{ID: "carry-" + tc.name, Resource: "api", Threshold: 10, StatInterval: 10 * time.Second, Global: true,
				Fallback: flow.FallbackLocal, LocalShare: 0.5, SpanExact: tc.span}
			require.NoError(t, eng.LoadRules([]flow.Rule{rule}))
			l := src.limitFor(flow.GlobalRequest{Key: "id:" + rule.ID, Threshold: 10, Interval: 10 * time.Second, SpanExact: tc.span})
			hash := l.keys.window
			if l.exact {
				hash = l.keys.log
			}
			sum := func() int64 {
				if l.exact {
					n, err := srv.Client().ZCard(context.Background(), hash).Result()
					require.NoError(t, err)
					return n
				}
				return windowSum(t, srv, hash)
			}
			entry := func() error {
				e, err := eng.Entry("api")
				if err == nil {
					e.Exit(nil)
				}
				return err
			}
			for range 10 {
				require.NoError(t, entry(), "Redis admits")
			}
			require.Equal(t, int64(10), sum())

			srv.Kill()
			fellBack := func() int64 { snap, _ := eng.Snapshot("api"); return snap.Fallbacks }
			for range 20 {
				require.NoError(t, entry(), "the fallback admits")
			}
			assert.Equal(t, int64(20), fellBack())

			require.NoError(t, srv.Restart())
			require.Zero(t, sum(), "restarted empty")
			from := granted.Load()
			require.Eventually(t, func() bool {
				from := fellBack()
				return entry() == nil && fellBack() == from
			}, 5*time.Second, time.Millisecond, "back on Redis")
			require.NoError(t, entry(), "a call after the one that found Redis carries what raced it")
			local := fellBack() // 20, and any until the probe found Redis
			require.GreaterOrEqual(t, local, int64(20))
			// The probe that found Redis asked for a token of its own,
			// which may still wait for a request.
			held := sum() - (granted.Load() - from)
			assert.True(t, held == local || held == local+1,
				"the window holds what the fallback admitted (%d) and what Redis granted: %d", local, held)
			require.NoError(t, entry())
			assert.Equal(t, held, sum()-(granted.Load()-from), "carried once")
		})
	}
}

// TestPausedProcessIsNotARedisFailure: a call that fails after far longer
// than its CallTimeout (on the Source's monotonic clock) ran while this
// process was paused (SIGSTOP, a frozen VM): it is not counted against
// Redis, and a backoff in force ends at once, so the next request probes
// and the Source is back on Redis as soon as Redis answers, whatever the
// backoff had grown to. A call that fails in its time is counted as
// before.
func TestPausedProcessIsNotARedisFailure(t *testing.T) {
	srv := redistest.Start(t)
	clk := stattest.NewClock(time.Hour)
	src, err := New(srv.Client(), WithClock(clk), WithFailAfter(1), WithBackoff(time.Hour), WithMaxBackoff(time.Hour),
		WithTimeout(50*time.Millisecond), WithCallTimeout(200*time.Millisecond), WithMaxBatch(1))
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	src.bg.Wait()
	r := req("paused", 100, time.Second, 1)
	l := src.limitFor(r)
	// acquireWhile asks once, doing jump while its call is out.
	acquireWhile := func(jump func()) error {
		done := make(chan error, 1)
		go func() { _, err := src.Acquire(context.Background(), r); done <- err }()
		require.Eventually(t, func() bool { return l.inFlight.Load() > 0 }, 5*time.Second, time.Millisecond)
		if jump != nil {
			jump()
		}
		require.Eventually(t, func() bool { return l.inFlight.Load() == 0 }, 5*time.Second, time.Millisecond)
		return <-done
	}
	ok, err := src.Acquire(context.Background(), r)
	require.NoError(t, err)
	require.True(t, ok)

	require.NoError(t, srv.Pause())
	t.Cleanup(func() { _ = srv.Resume() })
	_ = acquireWhile(func() { clk.Advance(10 * time.Second) })
	st := src.Stats()
	assert.Equal(t, int64(1), st.Paused, "the call outlived its CallTimeout by 10 s: this process was paused")
	assert.Zero(t, st.Errors, "not counted against Redis")
	assert.Zero(t, l.downUntil.Load(), "no backoff")

	_ = acquireWhile(nil)
	assert.Equal(t, int64(1), src.Stats().Errors, "a call that fails in its time counts")
	require.NotZero(t, l.downUntil.Load(), "FailAfter 1: backing off, for an hour")
	_, err = src.Acquire(context.Background(), r)
	require.ErrorIs(t, err, ErrUnavailable)

	// The backoff ends (as after an hour) and a probe goes out; the
	// process is paused while it runs.
	l.downUntil.Store(clk.Now())
	_, err = src.Acquire(context.Background(), r)
	require.ErrorIs(t, err, ErrUnavailable, "falls back while the probe runs")
	require.Eventually(t, func() bool { return l.inFlight.Load() > 0 }, 5*time.Second, time.Millisecond)
	clk.Advance(10 * time.Second)
	require.Eventually(t, func() bool { return l.inFlight.Load() == 0 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, int64(2), src.Stats().Paused)
	assert.Equal(t, int64(1), src.Stats().Errors)
	assert.Equal(t, clk.Now(), l.downUntil.Load(), "the backoff ends now: the next request probes")

	require.NoError(t, srv.Resume())
	require.Eventually(t, func() bool {
		ok, err := src.Acquire(context.Background(), r)
		return ok && err == nil
	}, 5*time.Second, 5*time.Millisecond, "back on Redis at the next probe, not an hour later")
}

// TestBackoffEndsOnTheWallClocksMultiples: a backoff ends on a multiple of
// itself on the wall clock, at least half of it and at most one and a half
// away, so that instances cut off together probe at the same moments.
func TestBackoffEndsOnTheWallClocksMultiples(t *testing.T) {
	const d = 100 * time.Millisecond
	for _, wall := range []int64{0, 1, int64(d / 2), int64(d/2) + 1, int64(d) - 1, int64(d), 1_234_567_891_011} {
		got := aligned(wall, d)
		assert.Zero(t, (wall+int64(got))%int64(d), "wall %d: ends on a multiple", wall)
		assert.GreaterOrEqual(t, got, d/2, "wall %d", wall)
		assert.LessOrEqual(t, got, 3*d/2, "wall %d", wall)
	}
	assert.Zero(t, aligned(12345, 0), "no backoff: at once")
	a, b := aligned(1_000_000_000+3_000_000, d), aligned(1_000_000_000+43_000_000, d)
	assert.Equal(t, int64(1_000_000_000+3_000_000)+int64(a), int64(1_000_000_000+43_000_000)+int64(b),
		"two instances that failed 40 ms apart probe at the same moment")
}

// TestCarriedAdmissionsCountOnceWhateverTheCallsThatSendThem: a slot of
// what the fallback admitted is sent as its running total until a call
// succeeds; Redis counts what it had not yet applied of it, so a call
// that ran although its reply was lost and the one that sends the slot
// again count it once, and a slot that grew adds only what is new.
func TestCarriedAdmissionsCountOnceWhateverTheCallsThatSendThem(t *testing.T) {
	srv := redistest.Start(t)
	for _, tc := range []struct {
		name string
		opts []Option
		span bool
	}{{"window", nil, false}, {"span-exact", nil, true}, {"log", []Option{WithExactBelow(1000)}, false}} {
		t.Run(tc.name, func(t *testing.T) {
			src := newSource(t, srv.Client(), append([]Option{WithMaxBatch(1)}, tc.opts...)...)
			r := flow.GlobalRequest{Key: "id:once-" + tc.name, Threshold: 100, Interval: 10 * time.Second, Count: 1, SpanExact: tc.span}
			l := src.limitFor(r)
			sum := func() int64 {
				if l.exact {
					n, err := srv.Client().ZCard(context.Background(), l.keys.log).Result()
					require.NoError(t, err)
					return n
				}
				return windowSum(t, srv, l.keys.window)
			}
			cs := []carry{{idx: 7, total: 5, age: 1000}}
			_, err := src.takeAs("call-1", l, perWindow(r), 1, 1, 0, nil, cs)
			require.NoError(t, err)
			assert.Equal(t, int64(6), sum(), "one granted and five carried")
			_, err = src.takeAs("call-2", l, perWindow(r), 1, 1, 0, nil, cs)
			require.NoError(t, err)
			assert.Equal(t, int64(7), sum(), "the same slot again: not counted again")
			cs[0].total, cs[0].age = 8, 2000
			_, err = src.takeAs("call-3", l, perWindow(r), 1, 1, 0, nil, cs)
			require.NoError(t, err)
			assert.Equal(t, int64(11), sum(), "the slot grew by 3: those 3")
		})
	}
}

// TestGivenBackAdmissionsComeOffWhatWaits: admissions given back (a later
// rule refused the request) come off the newest buckets not yet sent,
// whichever bucket the give-back falls in; what a call already carried
// stays counted.
func TestGivenBackAdmissionsComeOffWhatWaits(t *testing.T) {
	c := newCarried(1_000_000, 10) // buckets of 100 ms
	ms := int64(time.Millisecond)
	c.add(50*ms, 3)
	c.add(150*ms, -1) // in the next bucket: comes off the first
	cs := c.take(200*ms, 1_000_000)
	require.Len(t, cs, 1)
	assert.Equal(t, int64(2), cs[0].total)
	c.sent(cs)
	c.add(250*ms, -1)
	assert.Empty(t, c.take(300*ms, 1_000_000), "sent already: stays counted")
	c.add(350*ms, 2)
	c.add(360*ms, -3)
	assert.Empty(t, c.take(400*ms, 1_000_000), "more given back than waits: what waits goes")
}
