package global

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
	"github.com/leapflow/leapflow/stat"
)

// newSource makes a Source for a test. Tests that do not exercise timeouts
// get a generous one: on a loaded machine (CI, the race detector) a round
// trip can pass the 50 ms default, and a fallback would then change what
// they measure.
func newSource(t testing.TB, c redis.UniversalClient, opts ...Option) *Source {
	t.Helper()
	s, err := New(c, append([]Option{WithTimeout(2 * time.Second)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func req(key string, perSecond float64, interval time.Duration, n int64) flow.GlobalRequest {
	return flow.GlobalRequest{Key: key, Resource: key, Threshold: perSecond, Interval: interval, Count: n}
}

func TestHashTagAndKeys(t *testing.T) {
	assert.Equal(t, "{api}", hashTag("api"))
	assert.Equal(t, "{a%7Bb%7Dc%25}", hashTag("a{b}c%"))
	k := keysFor("leapflow", "we{ird}", "v2/1000ms/log")
	for _, key := range []string{k.window, k.log, k.meta} {
		assert.Equal(t, 1, strings.Count(key, "{"), key)
		assert.Contains(t, key, "{we%7Bird%7D}")
	}
}

func TestOptionErrors(t *testing.T) {
	_, err := New(nil)
	assert.ErrorContains(t, err, "client must not be nil")
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tc := range []struct {
		o    []Option
		want string
	}{
		{[]Option{WithBuckets(-1)}, "WithBuckets must be in [1, 1000], got -1"},
		{[]Option{WithBuckets(0)}, "WithBuckets must be in [1, 1000], got 0"},
		{[]Option{WithMaxBatch(-5)}, "WithMaxBatch must be >= 1, got -5"},
		{[]Option{WithExactBelow(-1)}, "WithExactBelow must be >= 0, got -1"},
		{[]Option{WithTimeout(0)}, "WithTimeout must be > 0, got 0s"},
		{[]Option{WithBackoff(time.Minute), WithMaxBackoff(time.Second)}, "WithBackoff must be in [0, WithMaxBackoff], got 1m0s"},
		{[]Option{WithPrefix("a{b}")}, "WithPrefix must not contain"},
		{[]Option{WithClock(nil)}, "WithClock must not be nil"},
	} {
		_, err := New(c, tc.o...)
		assert.ErrorContains(t, err, tc.want)
	}
}

func TestDecision(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client(), WithBuckets(4))
	ctx := context.Background()
	r := req("decide", 5, time.Second, 1)
	for i := range 5 {
		d, err := s.takeFor(r, 0)
		require.NoError(t, err)
		require.True(t, d.Allowed, "request %d", i)
		assert.Equal(t, int64(i+1), d.Count)
		assert.Equal(t, int64(4-i), d.Remaining)
	}
	d, err := s.takeFor(r, 0)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, int64(5), d.Count)
	assert.Zero(t, d.Remaining)
	assert.Positive(t, d.RetryAfter)
	assert.LessOrEqual(t, d.RetryAfter, time.Second)
	assert.WithinDuration(t, time.Now(), d.ServerTime, 2*time.Second, "server time, same machine")
	assert.Equal(t, 250*time.Millisecond, d.BucketLen)
	big, err := s.takeFor(req("decide", 5, time.Second, 6), 0)
	require.NoError(t, err)
	assert.False(t, big.Allowed)
	assert.Equal(t, time.Duration(-1), big.RetryAfter, "a batch above the threshold never fits")

	// The key expires when idle.
	ttl, err := srv.Client().PTTL(ctx, keysFor("leapflow", "decide", "v2/1000ms/4").window).Result()
	require.NoError(t, err)
	assert.Positive(t, ttl)
	assert.LessOrEqual(t, ttl, 3*time.Second)
}

// A day is flow's longest window: on Redis its buckets are a day over the
// source's bucket count, its keys live a day, and a PerKey rule of a day
// holds each key to its threshold through an engine.
func TestADayWindowHoldsItsThreshold(t *testing.T) {
	const day = 24 * time.Hour
	srv := redistest.Start(t)
	s := newSource(t, srv.Client(), WithBuckets(4))
	r := req("daily", 5/day.Seconds(), day, 1)
	for i := range 5 {
		d, err := s.takeFor(r, 0)
		require.NoError(t, err)
		require.True(t, d.Allowed, "request %d", i)
	}
	d, err := s.takeFor(r, 0)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, 6*time.Hour, d.BucketLen)
	assert.Greater(t, d.RetryAfter, day-6*time.Hour, "until the bucket of the five leaves the day")
	assert.LessOrEqual(t, d.RetryAfter, day)
	ttl, err := srv.Client().PTTL(context.Background(), keysFor("leapflow", "daily", "v2/86400000ms/4").window).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 23*time.Hour)

	eng, err := flow.New(flow.WithTokenSource(newSource(t, srv.Client())))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "per-key-daily", Resource: "api", Threshold: 3 / day.Seconds(), StatInterval: day, Global: true, PerKey: true}}))
	admitted := func(key string) (n int) {
		for range 5 {
			if _, err := eng.Allow("api", flow.WithKey(key)); err == nil {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 3, admitted("ann"))
	assert.Equal(t, 3, admitted("bob"))
}

func TestWindowSlidesAndServerTimeBackwards(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := newSource(t, c, WithBuckets(4), WithMaxBatch(1))
	ctx := context.Background()
	// 4 per second: admit's round trips to Redis stay inside one window
	// even on a loaded machine.
	const window, bucket = time.Second, 250 * time.Millisecond
	r := req("slide", 4, window, 1)
	admit := func(r flow.GlobalRequest) int {
		n := 0
		for range 10 {
			if ok, err := s.Acquire(ctx, r); err == nil && ok {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 4, admit(r))
	// Every admission so far is in a bucket that started before now, and
	// such a bucket has left the window a window and a bucket later.
	time.Sleep(window + bucket)
	assert.Equal(t, 4, admit(r), "the window slid")

	// As if the server clock had been 10 s ahead before a failover (or the
	// new master's is 10 s behind): the newest bucket is in the "future",
	// with 3 of the 4. A limit of its own, so that only that bucket can shut
	// the gate.
	back := req("slide-back", 4, window, 1)
	key := keysFor("leapflow", "resource:slide-back", "v2/1000ms/4").window
	back.Key = "resource:slide-back"
	now, err := c.Time(ctx).Result()
	require.NoError(t, err)
	future := now.Add(10 * time.Second).UnixMicro()
	future -= future % bucket.Microseconds()
	require.NoError(t, c.HSet(ctx, key, "latest", future, fmt.Sprint(future), 3).Err())
	assert.Equal(t, 1, admit(back), "the limit's time continues from the newest bucket: one more fits there")
	held, err := c.HGetAll(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, "4", held[fmt.Sprint(future)], "the admission was counted in the newest bucket, not in one behind it")
	assert.NotEmpty(t, held["off"], "the step went into the limit's offset")
	// The step does not stall the limit for its 10 s: a window later it
	// admits again.
	time.Sleep(window + bucket)
	assert.Equal(t, 4, admit(back), "a window after the step, not 10 s")
}

// Instances that disagree on a limit's threshold (a rolling change) share
// it, and the smaller applies while an instance asks with it.
func TestSmallerThresholdApplies(t *testing.T) {
	srv := redistest.Start(t)
	small := newSource(t, srv.Client(), WithMaxBatch(1))
	large := newSource(t, srv.Client(), WithMaxBatch(1))
	ctx := context.Background()
	// Per 10 s, so that the calls stay inside one window.
	rs, rl := req("rolling", 10, 10*time.Second, 1), req("rolling", 10.1, 10*time.Second, 1)
	admitted := 0
	for i := range 300 {
		src, r := small, rs
		if i%2 == 1 {
			src, r = large, rl
		}
		if ok, err := src.Acquire(ctx, r); err == nil && ok {
			admitted++
		}
	}
	assert.Equal(t, 100, admitted, "100 and 101 per window: 100 in all, not 101")
}

// A rule's ID and a resource's name are different limits, and the key of
// a limit does not change with its threshold.
func TestLimitKeys(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), WithMaxBatch(1))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: "api", Resource: "checkout", Threshold: 0.5, StatInterval: 10 * time.Second, Global: true, Fallback: flow.FallbackClosed},
		{Resource: "api", Threshold: 0.5, StatInterval: 10 * time.Second, Global: true, Fallback: flow.FallbackClosed},
	}))
	for _, res := range []string{"checkout", "api"} {
		n := 0
		for range 10 {
			if _, err := eng.Entry(res); err == nil {
				n++
			}
		}
		assert.Equal(t, 5, n, "%s: a limit of its own", res)
	}
	keys, err := srv.Client().Keys(context.Background(), "*:w").Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"leapflow:{id:api}:v2/10000ms/10:w", "leapflow:{resource:api}:v2/10000ms/10:w"}, keys)

	_, err = New(srv.Client(), WithPrefix("app{x}"))
	assert.ErrorContains(t, err, `Prefix must not contain '{' or '}', got "app{x}"`)
}

// TestManyEnginesHoldTheGlobalLimit runs several engines, each with its own
// client and Source as separate instances would, against one global rule,
// and checks every server window.
// It runs in real time (about 5 s): the server windows are Redis's.
func TestManyEnginesHoldTheGlobalLimit(t *testing.T) {
	srv := redistest.Start(t)
	for _, batch := range []int64{1, 100} {
		t.Run(fmt.Sprintf("maxbatch=%d", batch), func(t *testing.T) {
			const threshold, engines, perEngine = 300, 4, 8
			key := fmt.Sprintf("hammer-%d", batch)
			audit := NewAudit()
			var admitted, globalBlocks atomic.Int64
			var wg sync.WaitGroup
			var engs []*flow.Engine
			deadline := time.Now().Add(2500 * time.Millisecond)
			for range engines {
				src := newSource(t, srv.Client(), WithBuckets(10), WithMaxBatch(batch), WithOnAdmit(audit.Record))
				eng, err := flow.New(flow.WithTokenSource(src))
				require.NoError(t, err)
				require.NoError(t, eng.LoadRules([]flow.Rule{{ID: key, Resource: "api", Threshold: threshold, Global: true, Fallback: flow.FallbackClosed}}))
				engs = append(engs, eng)
				for range perEngine {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for time.Now().Before(deadline) {
							en, err := eng.Entry("api")
							if err == nil {
								admitted.Inc()
								en.Exit(nil)
								continue
							}
							var be *flow.BlockError
							if errors.As(err, &be) && be.Reason == flow.ReasonGlobal {
								globalBlocks.Inc()
							}
						}
					}()
				}
			}
			wg.Wait()
			// The rule fails closed: a failed call blocks too, as a fallback.
			var fallbacks int64
			for _, eng := range engs {
				snap, _ := eng.Snapshot("api")
				fallbacks += snap.Fallbacks
			}
			refused := globalBlocks.Load() - fallbacks
			total := audit.Total()
			worst := audit.Fullest(time.Second)
			t.Logf("maxbatch=%d: admitted %d, global refusals %d, fallbacks %d, fullest server window %d",
				batch, total, refused, fallbacks, worst)
			assert.Equal(t, admitted.Load(), total, "every admission was counted in a server bucket")
			assert.LessOrEqual(t, worst, int64(threshold))
			// Redis refuses only a full window (and the Source then refuses
			// locally until its retry-after): the limit was reached.
			assert.Positive(t, refused, "the load reached the limit: Redis refused")
			if batch == 1 {
				// Without leases every token Redis counts is an admission,
				// so a refusal means a server window held the threshold
				// (slack for a call that timed out after being counted).
				assert.GreaterOrEqual(t, worst, int64(threshold)*8/10, "refused only when full, not starved")
			}
		})
	}
}

// TestLeasedTokensExpireWithTheirBucket: a lease is never spent after its
// server bucket ends (same machine: one wall clock). An admission is late
// only if the call started after the end of the bucket it was counted in.
func TestLeasedTokensExpireWithTheirBucket(t *testing.T) {
	srv := redistest.Start(t)
	var bucket time.Time
	var count int64
	src := newSource(t, srv.Client(), WithBuckets(10), WithMaxBatch(1000), WithOnAdmit(func(b time.Time, n int64) {
		bucket = b // one goroutine: no race
		count += n
	}))
	r := req("expiry", 1e9, time.Second, 1) // far above what one goroutine reaches in 700 ms
	late := 0
	end := time.Now().Add(700 * time.Millisecond)
	for time.Now().Before(end) {
		started := time.Now()
		ok, err := src.Acquire(context.Background(), r)
		require.NoError(t, err)
		require.True(t, ok)
		if started.After(bucket.Add(100 * time.Millisecond)) {
			late++
		}
	}
	st := src.Stats()
	t.Logf("%d admissions, %d calls, %d leased", count, st.Calls, st.Leased)
	assert.Zero(t, late, "tokens spent after their bucket ended")
	assert.Less(t, st.Calls*50, count, "leasing: far fewer calls than admissions")
}

type offsetClock struct{ offset int64 }

var monotonic = stat.NewMonotonic()

func (c offsetClock) Now() int64 { return monotonic.Now() + c.offset }

func TestSkewedInstancesAgree(t *testing.T) {
	srv := redistest.Start(t)
	const threshold = 50
	var total atomic.Int64
	var wg sync.WaitGroup
	for _, skew := range []time.Duration{-time.Hour, 0, 3 * time.Hour} {
		// No leasing: every admission is a server decision, so the total is
		// exact (leased tokens left unused would only lower it).
		src := newSource(t, srv.Client(), WithMaxBatch(1), WithClock(offsetClock{int64(skew)}))
		clock := stattestClock(skew)
		eng, err := flow.New(flow.WithTokenSource(src), flow.WithClock(clock))
		require.NoError(t, err)
		require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "skew", Resource: "api", Threshold: threshold, StatInterval: 10 * time.Second, Global: true, Fallback: flow.FallbackClosed}}))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 400 {
				if _, err := eng.Entry("api"); err == nil {
					total.Inc()
				}
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, int64(threshold*10), total.Load(), "server time rules: the 10 s window admits exactly its threshold")
}

// stattestClock is a fixed local clock far from the others.
func stattestClock(skew time.Duration) stat.Clock {
	return offsetClock{int64(skew) + int64(24*time.Hour)}
}

func TestScriptFlushReloads(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := newSource(t, c, WithMaxBatch(1))
	ctx := context.Background()
	r := req("flush", 100, time.Second, 1)
	ok, err := s.Acquire(ctx, r)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, c.ScriptFlush(ctx).Err())
	ok, err = s.Acquire(ctx, r)
	require.NoError(t, err, "NOSCRIPT is answered by loading the script again")
	assert.True(t, ok)
	assert.Zero(t, s.Stats().Errors)
}

// TestExactMode checks the sliding log on the server's own clock: the
// script admits at the time it read, reported as the bucket start, so the
// check needs no allowance for how long a call took.
func TestExactMode(t *testing.T) {
	srv := redistest.Start(t)
	// OnAdmit runs inside Acquire, on this goroutine: exact limits lease
	// nothing, so no refill runs in the background.
	var admitted []time.Time
	s := newSource(t, srv.Client(), WithExactBelow(10), WithOnAdmit(func(at time.Time, n int64) {
		for range n {
			admitted = append(admitted, at)
		}
	}))
	ctx := context.Background()
	const window = 300 * time.Millisecond
	r := req("exact", 10, window, 1) // 3 per 300ms
	// Ask until the log has slid at least twice: 7 admissions need three
	// windows. The deadline only bounds a broken limiter.
	deadline := time.Now().Add(30 * time.Second)
	for len(admitted) < 7 && time.Now().Before(deadline) {
		_, err := s.Acquire(ctx, r)
		require.NoError(t, err)
	}
	require.GreaterOrEqual(t, len(admitted), 7, "the log admits again as it slides")
	// Exact in every span shorter than the window: the 4th admission after
	// any admission is a whole window later on the server clock.
	for i := 0; i+3 < len(admitted); i++ {
		assert.GreaterOrEqual(t, admitted[i+3].Sub(admitted[i]), window, "admissions %d and %d", i, i+3)
	}
	assert.Zero(t, s.Stats().Leased, "exact mode does not lease")

	// A refusal says when the log has room again: one per 10s.
	once := req("exact-once", 0.1, 10*time.Second, 1)
	d, err := s.takeFor(once, 0)
	require.NoError(t, err)
	require.True(t, d.Allowed)
	d, err = s.takeFor(once, 0)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, int64(1), d.Count)
	assert.Positive(t, d.RetryAfter)
	assert.LessOrEqual(t, d.RetryAfter, 10*time.Second)
}

// load is g goroutines entering and exiting "api" on an engine, a
// millisecond apart, until Stop.
type load struct {
	slowest atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
}

// startLoad starts the goroutines; each gets every Entry's error.
func startLoad(eng *flow.Engine, g int, each func(err error)) *load {
	l := &load{stop: make(chan struct{})}
	for range g {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				t0 := time.Now()
				en, err := eng.Entry("api")
				d := int64(time.Since(t0))
				for s := l.slowest.Load(); d > s && !l.slowest.CompareAndSwap(s, d); s = l.slowest.Load() {
				}
				each(err)
				en.Exit(nil)
				time.Sleep(time.Millisecond)
			}
		}()
	}
	return l
}

// Stop ends the goroutines and waits for them.
func (l *load) Stop() {
	close(l.stop)
	l.wg.Wait()
}

// Slowest returns the longest an Entry took.
func (l *load) Slowest() time.Duration { return time.Duration(l.slowest.Load()) }

// TestFaultsFallBackAndRecover kills the server under load, restarts it,
// stalls it with DEBUG SLEEP: requests keep being admitted by the fallback
// (never failed closed; refused only while a call is late and Redis not
// yet known to be down), the Source backs off, nothing panics, no goroutine
// leaks, and Redis decides again after each fault.
// Every phase waits for what it checks, with long bounds, rather than for
// a fixed time.
func TestFaultsFallBackAndRecover(t *testing.T) {
	srv := redistest.Start(t)
	before := runtime.NumGoroutine()
	client := srv.Client()
	var served atomic.Int64 // admissions decided by Redis
	src := newSource(t, client, WithTimeout(50*time.Millisecond), WithCallTimeout(100*time.Millisecond), WithBackoff(20*time.Millisecond), WithMaxBackoff(200*time.Millisecond), WithMaxBatch(1), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	// A threshold the load never reaches, globally or in the fallback's
	// share: every request goes to Redis (MaxBatch 1, never refused), and
	// every one is admitted, by Redis or by the fallback.
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "faults", Resource: "api", Threshold: 1e6, Global: true, LocalShare: 0.5}}))
	_, err = eng.Entry("api")
	require.NoError(t, err)
	fallbacks := func() int64 { snap, _ := eng.Snapshot("api"); return snap.Fallbacks }

	var answered, blocked atomic.Int64
	l := startLoad(eng, 8, func(err error) {
		answered.Inc()
		if err != nil {
			blocked.Inc()
		}
	})
	const long = 15 * time.Second // bounds for a loaded machine; met in milliseconds
	require.Eventually(t, func() bool { return served.Load() > 0 }, long, 5*time.Millisecond, "Redis decides while up")

	srv.Stop()
	downFrom, refusedFrom := fallbacks(), src.Stats().Refused
	require.Eventually(t, func() bool {
		return fallbacks() >= downFrom+100 && src.Stats().Refused > refusedFrom
	}, long, 5*time.Millisecond, "while down, the fallback answers and the Source backs off")

	require.NoError(t, srv.Restart())
	upFrom := served.Load()
	require.Eventually(t, func() bool { return served.Load() > upFrom }, long, 5*time.Millisecond,
		"the backoff ends and a probe finds the restarted server")

	// Stall the server for 600ms: calls time out after 100ms, two in a row
	// put the Source off Redis, and the fallback answers until it wakes.
	stallFrom, errsFrom := fallbacks(), src.Stats().Errors
	stall := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	require.NoError(t, stall.Do(context.Background(), "DEBUG", "SLEEP", "0.6").Err())
	stall.Close()
	stallFallbacks, stallErrs := fallbacks()-stallFrom, src.Stats().Errors-errsFrom
	upFrom = served.Load()
	require.Eventually(t, func() bool { return served.Load() > upFrom }, long, 5*time.Millisecond,
		"Redis decides again after the stall")
	l.Stop()

	st := src.Stats()
	t.Logf("answered %d, blocked %d, slowest %v, fallbacks %d (%d in the stall, %d timeouts), stats %+v",
		answered.Load(), blocked.Load(), l.Slowest(), fallbacks(), stallFallbacks, stallErrs, st)
	assert.Positive(t, stallErrs, "calls to the stalled server time out")
	assert.Positive(t, stallFallbacks, "the fallback answers while the server is stalled")
	assert.Equal(t, st.Late, blocked.Load(),
		"every request admitted, by Redis or, while it fails, by the fallback; refused only when late")
	client.Close()
	require.Eventually(t, func() bool { return runtime.NumGoroutine() <= before+2 }, long, 20*time.Millisecond,
		"goroutines leaked: %d before, %d after", before, runtime.NumGoroutine())
}

func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	ctx := context.Background()
	k := keysFor("leapflow", "cl{uster}", "v2/10000ms/log")
	slots := map[int64]bool{}
	for _, key := range []string{k.window, k.log, k.meta} {
		slot, err := c.ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		slots[slot] = true
	}
	assert.Len(t, slots, 1, "every key of a limit in one slot")
	for _, exact := range []int64{0, 100} {
		// A cluster client loads the slot map on its first call: allow it.
		s := newSource(t, c, WithMaxBatch(1), WithExactBelow(exact), WithTimeout(2*time.Second))
		n := 0
		for range 20 {
			// 7 per 10s: the calls stay inside one window however slow.
			ok, err := s.Acquire(ctx, req(fmt.Sprintf("cl{uster}-%d", exact), 0.75, 10*time.Second, 1))
			require.NoError(t, err)
			if ok {
				n++
			}
		}
		assert.Equal(t, 7, n, "exact=%d", exact)
	}
}

// TestSentinelFailover runs a global rule through a failover client while
// the sentinel promotes the replica: requests keep being answered (by Redis
// or, in the gap, by the local fallback) and fail only with blocks, and
// once the new master serves, global limiting resumes on it and holds its
// threshold.
// It runs in real time, longer than 5 s, as an exception: Redis Sentinel
// needs its down-after period (1 s) and an election before it promotes,
// and neither runs on a fake clock.
func TestSentinelFailover(t *testing.T) {
	st := redistest.StartSentinel(t)
	var after atomic.Bool
	before, since := NewAudit(), NewAudit()
	src := newSource(t, st.Client(t), WithBuckets(10), WithMaxBatch(1), WithTimeout(200*time.Millisecond), WithBackoff(20*time.Millisecond), WithMaxBackoff(200*time.Millisecond), WithOnAdmit(func(b time.Time, n int64) {
		if after.Load() {
			since.Record(b, n)
		} else {
			before.Record(b, n)
		}
	}))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	const threshold = 200
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "failover", Resource: "api", Threshold: threshold, Global: true, LocalShare: 0.5}}))

	// The load goroutines keep what they saw; the test goroutine checks it.
	var answered atomic.Int64
	var mu sync.Mutex
	var unexpected []error
	l := startLoad(eng, 4, func(err error) {
		answered.Inc()
		if err != nil && !errors.Is(err, flow.ErrBlocked) {
			mu.Lock()
			unexpected = append(unexpected, err)
			mu.Unlock()
		}
	})
	const long = 15 * time.Second // bounds for a loaded machine
	require.Eventually(t, func() bool { return before.Total() > 0 }, long, 10*time.Millisecond, "the old master served")
	// Once Failover returns, only the new master takes writes: what is
	// admitted from then on is counted there, on top of what it had
	// replicated. Failover takes seconds: requests go on being answered.
	during := answered.Load()
	st.Failover(t)
	during = answered.Load() - during
	after.Store(true)
	require.Eventually(t, func() bool { return since.Total() > 0 }, long, 10*time.Millisecond,
		"global limiting resumed on the new master")
	// A whole window more of load (far above the threshold) for the check
	// that the new master holds it.
	time.Sleep(time.Second)
	l.Stop()

	snap, ok := eng.Snapshot("api")
	require.True(t, ok)
	t.Logf("admitted by Redis: %d before the failover, %d after; %d answered during it; fallbacks %d; stats %+v; slowest %v",
		before.Total(), since.Total(), during, snap.Fallbacks, src.Stats(), l.Slowest())
	mu.Lock()
	require.Empty(t, unexpected, "Entry fails only with blocks")
	mu.Unlock()
	assert.Positive(t, during, "requests answered while the sentinel fails over")
	assert.LessOrEqual(t, since.Fullest(time.Second), int64(threshold), "the new master holds the threshold")
	// The new master holds the limit's window.
	keys, err := st.Replica.Client().Keys(context.Background(), "*failover*").Result()
	require.NoError(t, err)
	assert.NotEmpty(t, keys)
}

func TestRefusalIsRememberedUntilRetryAfter(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client(), WithMaxBatch(1))
	ctx := context.Background()
	r := req("closed", 2, time.Second, 1)
	for range 2 {
		ok, err := s.Acquire(ctx, r)
		require.NoError(t, err)
		require.True(t, ok)
	}
	ok, err := s.Acquire(ctx, r)
	require.NoError(t, err)
	require.False(t, ok)
	calls := s.Stats().Calls
	for range 50 {
		ok, err := s.Acquire(ctx, r)
		require.NoError(t, err)
		require.False(t, ok)
	}
	assert.Equal(t, calls, s.Stats().Calls, "a full window is not asked again before its retry-after")
	require.Eventually(t, func() bool {
		ok, err := s.Acquire(ctx, r)
		return err == nil && ok
	}, 15*time.Second, 10*time.Millisecond, "admits again once the window slides")
}

func TestAuditFullest(t *testing.T) {
	a := NewAudit()
	base := time.UnixMicro(1_000_000_000)
	for i, n := range []int64{3, 1, 4, 1, 5} { // buckets of 100ms
		a.Record(base.Add(time.Duration(i)*100*time.Millisecond), n)
	}
	a.Record(base.Add(time.Second), 9)
	assert.Equal(t, int64(23), a.Total())
	assert.Equal(t, int64(20), a.Fullest(time.Second), "the 1s window ending at the last bucket drops the first: 1+4+1+5+9")
	assert.Equal(t, int64(9), a.Fullest(100*time.Millisecond))
	assert.Equal(t, int64(9), a.Fullest(200*time.Millisecond), "no pair beats the last bucket alone")
	assert.Equal(t, int64(14), a.Fullest(500*time.Millisecond), "3+1+4+1+5")
}

// A call that runs again under its ID (go-redis retries a command whose
// connection failed after it was sent) gets the first answer and counts
// nothing more.
func TestRetriedCallCountsOnce(t *testing.T) {
	srv := redistest.Start(t)
	for _, exact := range []int64{0, 100} {
		s := newSource(t, srv.Client(), WithMaxBatch(1), WithExactBelow(exact))
		r := req(fmt.Sprintf("retried-%d", exact), 5, 10*time.Second, 2)
		l := s.limitFor(r)
		first, err := s.takeAs("call-1", l, perWindow(r), 2, 2, 0, nil, nil)
		require.NoError(t, err)
		again, err := s.takeAs("call-1", l, perWindow(r), 2, 2, 0, nil, nil)
		require.NoError(t, err)
		assert.Equal(t, first, again, "exact %d: the first answer", exact)
		next, err := s.takeAs("call-2", l, perWindow(r), 2, 2, 0, nil, nil)
		require.NoError(t, err)
		assert.Equal(t, int64(4), next.Count, "exact %d: counted once, then once more", exact)
	}
}
