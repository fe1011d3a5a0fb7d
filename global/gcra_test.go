package global

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
)

func gcraReq(key string, perSecond float64, burst int64) flow.GlobalRequest {
	return flow.GlobalRequest{Key: key, Resource: key, Threshold: perSecond, Interval: time.Second, GCRA: true, Burst: burst}
}

// gcraModel is the GCRA in Go on the server's clock: what the script
// must decide, to the nanosecond.
type gcraModel struct{ tat, interval, tol int64 }

func (m *gcraModel) take(nowUs, n int64) gcraDecision {
	now := nowUs * 1000
	ahead := min(max(m.tat-now, 0), m.tol)
	cost := n * m.interval
	d := gcraDecision{ServerTime: time.UnixMicro(nowUs)}
	switch {
	case cost > m.tol:
		d.RetryAfter = -1
	case ahead+cost > m.tol:
		d.RetryAfter = time.Duration(ahead + cost - m.tol)
	default:
		d.Allowed = true
		ahead += cost
		m.tat = now + ahead
	}
	d.Reset = time.Duration(ahead)
	d.Remaining = (m.tol - ahead) / m.interval
	return d
}

// TestGCRAScriptMatchesTheModel: one client's calls, at random sizes and
// gaps, decide as the model does on the server times the script reports,
// at a slow rate and at one whose interval is not a whole microsecond.
func TestGCRAScriptMatchesTheModel(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client())
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		rate  float64
		burst int64
		gap   time.Duration
	}{{7, 4, 60 * time.Millisecond}, {3000, 50, 3 * time.Millisecond}} {
		b := s.gcraBoundFor(gcraReq("model", tc.rate, tc.burst))
		b.l = s.gcraLimitFor("model-" + time.Duration(b.interval).String())
		m := gcraModel{interval: b.interval, tol: b.tolerance}
		allowed := 0
		for i := range 80 {
			n := 1 + rng.Int64N(tc.burst+1) // now and then more than the bucket
			if i < int(tc.burst) {
				n = 1
			}
			d, err := s.takeGCRA(t.Context(), b, n)
			require.NoError(t, err)
			want := m.take(d.ServerTime.UnixMicro(), n)
			require.Equal(t, want, d, "rate %g, call %d for %d", tc.rate, i, n)
			if d.Allowed {
				allowed++
			}
			time.Sleep(time.Duration(rng.Int64N(int64(tc.gap))))
		}
		assert.Greater(t, allowed, int(tc.burst), "rate %g: the bucket refilled", tc.rate)
	}
}

// TestGCRABurstThenRefused: a full bucket admits exactly Burst, then
// refuses and says when a token is back; the key expires once the bucket
// is full again.
func TestGCRABurstThenRefused(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := newSource(t, c)
	// A token every 10 s: however slow the machine, none comes back
	// during the test.
	b := s.Bind(gcraReq("id:burst", 0.1, 5)).(*gcraBound)
	for i := range 5 {
		ok, err := b.Acquire(t.Context(), 1)
		require.NoError(t, err)
		require.True(t, ok, "request %d of the burst", i)
	}
	calls := s.Stats().Calls
	for range 3 {
		ok, err := b.Acquire(t.Context(), 1)
		require.NoError(t, err)
		require.False(t, ok, "the bucket is empty")
	}
	assert.Equal(t, calls+1, s.Stats().Calls, "a refusal is remembered until its retry-after")
	d, ok := b.RetryIn(1)
	require.True(t, ok)
	assert.Greater(t, d, 9*time.Second)
	assert.LessOrEqual(t, d, 10*time.Second)
	_, ok = b.RetryIn(6)
	assert.False(t, ok, "more than the bucket holds never fits")

	tat := gcraKey("leapflow", "id:burst")
	ttl, err := c.PTTL(t.Context(), tat).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 40*time.Second, "the key lives until the bucket is full: 50 s")
	assert.LessOrEqual(t, ttl, 51*time.Second)
}

// TestGCRARefillsOneTokenPerInterval: waiting k intervals after the
// bucket ran dry brings exactly k tokens back (10/s; the waits aim at the
// middle of an interval, and the exact count is checked on the server's
// clock, so a late wake-up cannot make it flake).
func TestGCRARefillsOneTokenPerInterval(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client())
	b := s.gcraBoundFor(gcraReq("id:refill", 10, 3))
	const interval = 100 * time.Millisecond
	for k := 1; k <= 3; k++ {
		// Empty the bucket: take until refused.
		var last gcraDecision
		for {
			d, err := s.takeGCRA(t.Context(), b, 1)
			require.NoError(t, err)
			if !d.Allowed {
				last = d
				break
			}
		}
		// The bucket gets its j-th token back at full - (burst-j) x
		// interval; the refusal says when the first comes.
		first := last.ServerTime.Add(last.RetryAfter)
		time.Sleep(last.RetryAfter + time.Duration(k-1)*interval + interval/2)
		got := 0
		var at time.Time
		for {
			d, err := s.takeGCRA(t.Context(), b, 1)
			require.NoError(t, err)
			if got == 0 {
				at = d.ServerTime
			}
			if !d.Allowed {
				break
			}
			got++
		}
		back := int(at.Sub(first)/interval) + 1 // tokens back when the first call ran
		t.Logf("k=%d: %d admitted, first call %v after the first token was back", k, got, at.Sub(first))
		assert.GreaterOrEqual(t, got, k, "k intervals bring k tokens")
		assert.GreaterOrEqual(t, got, min(back, 3))
		if back == k && at.Sub(first) < time.Duration(k)*interval-20*time.Millisecond {
			// Woken in time (not past the next token, by a margin that
			// covers the calls): exactly k.
			assert.Equal(t, k, got)
		}
	}
}

// TestGCRAHammerKeepsTheBound: four instances (four clients), many
// goroutines each, on one Global GCRA rule: in every span of the server
// clock, of any length L, they admit at most Burst + rate x L together.
func TestGCRAHammerKeepsTheBound(t *testing.T) {
	srv := redistest.Start(t)
	const rate, burst = 200.0, 20
	var mu sync.Mutex
	var times []int64 // µs, the server clock
	record := func(at time.Time, n int64) {
		mu.Lock()
		for range n {
			times = append(times, at.UnixMicro())
		}
		mu.Unlock()
	}
	var engs []*flow.Engine
	var srcs []*Source
	for range 4 {
		src := newSource(t, srv.Client(), WithOnAdmit(record))
		eng, err := flow.New(flow.WithTokenSource(src))
		require.NoError(t, err)
		require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "hammer", Resource: "api", Threshold: rate, Behavior: flow.GCRA, Burst: burst, Global: true, Fallback: flow.FallbackClosed}}))
		engs, srcs = append(engs, eng), append(srcs, src)
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(1500 * time.Millisecond)
	for _, eng := range engs {
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					n := 1 + rand.IntN(2)
					if en, err := eng.Entry("api", flow.WithCount(n)); err == nil {
						admitted.Add(int64(n))
						en.Exit(nil)
					}
				}
			}()
		}
	}
	wg.Wait()
	slices.Sort(times)
	require.Equal(t, admitted.Load(), int64(len(times)), "every admission was reported with its server time")
	require.GreaterOrEqual(t, len(times), burst, "at least the first burst")
	for _, span := range []time.Duration{time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond, time.Second} {
		most := mostInSpan(times, span.Microseconds())
		bound := burst + int(rate*span.Seconds()) + 1
		t.Logf("span %v: at most %d admitted (bound %d)", span, most, bound)
		assert.LessOrEqual(t, most, bound, "span %v", span)
	}
	var calls, fallbacks int64
	for i, src := range srcs {
		calls += src.Stats().Calls
		snap, _ := engs[i].Snapshot("api")
		fallbacks += snap.Fallbacks
	}
	assert.Zero(t, fallbacks, "Redis answered throughout")
	t.Logf("%d admitted in %d calls", len(times), calls)
}

// mostInSpan is the most of sorted times in any half-open span of length
// span.
func mostInSpan(times []int64, span int64) int {
	most, lo := 0, 0
	for hi, t := range times {
		for t-times[lo] >= span {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

// TestGCRAFallsBackAndRecovers: Redis killed mid-run: FallbackLocal
// admits on a local bucket at LocalShare of the rate and burst, Closed
// refuses, Open admits; once Redis is back, the shared bucket decides
// again.
func TestGCRAFallsBackAndRecovers(t *testing.T) {
	srv := redistest.Start(t)
	var served atomic.Int64
	src := newSource(t, srv.Client(), WithTimeout(50*time.Millisecond), WithCallTimeout(100*time.Millisecond), WithBackoff(20*time.Millisecond), WithMaxBackoff(200*time.Millisecond), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		// Falls back on 0.5/s with a bucket of 5.
		{ID: "gcra-local", Resource: "local", Threshold: 1, Behavior: flow.GCRA, Burst: 10, Global: true, LocalShare: 0.5},
		{ID: "gcra-closed", Resource: "closed", Threshold: 1000, Behavior: flow.GCRA, Burst: 1000, Global: true, Fallback: flow.FallbackClosed},
		{ID: "gcra-open", Resource: "open", Threshold: 1, Behavior: flow.GCRA, Burst: 1, Global: true, Fallback: flow.FallbackOpen},
	}))
	tries := func(res string, n int) (admitted int, reasons map[flow.Reason]int) {
		reasons = map[flow.Reason]int{}
		for range n {
			en, err := eng.Entry(res)
			var be *flow.BlockError
			switch {
			case err == nil:
				admitted++
				en.Exit(nil)
			case errors.As(err, &be):
				reasons[be.Reason]++
			}
		}
		return admitted, reasons
	}
	fallbacks := func(res string) int64 { snap, _ := eng.Snapshot(res); return snap.Fallbacks }

	// Up: the shared buckets decide. (A refusal is remembered until its
	// retry-after, a second at most here: only then does a request find
	// Redis gone.)
	got, why := tries("local", 12)
	assert.Equal(t, 10, got)
	assert.Equal(t, 2, why[flow.ReasonGlobal])
	got, _ = tries("open", 3)
	assert.Equal(t, 1, got, "Redis refuses: Open is only for when it fails")
	got, _ = tries("closed", 3)
	assert.Equal(t, 3, got)
	require.Equal(t, int64(14), served.Load())

	srv.Stop()
	down := time.Now()
	const long = 15 * time.Second // met in milliseconds
	localAdmitted := 0
	for _, res := range []string{"local", "closed", "open"} {
		require.Eventually(t, func() bool {
			got, _ := tries(res, 1)
			if res == "local" {
				localAdmitted += got
			}
			return fallbacks(res) > 0
		}, long, 5*time.Millisecond, "%s falls back", res)
	}
	got, why = tries("local", 20)
	localAdmitted += got
	elapsed := time.Since(down)
	assert.Positive(t, why[flow.ReasonFlow], "the local bucket refuses")
	assert.GreaterOrEqual(t, localAdmitted, 5, "the local bucket starts full: floor(10 x 0.5)")
	assert.LessOrEqual(t, localAdmitted, 5+int(0.5*elapsed.Seconds())+1, "0.5/s after the burst of 5 (%v down)", elapsed)
	got, why = tries("closed", 10)
	assert.Zero(t, got, "Closed refuses")
	assert.Equal(t, 10, why[flow.ReasonGlobal])
	got, _ = tries("open", 10)
	assert.Equal(t, 10, got, "Open admits")
	assert.Equal(t, int64(14), served.Load(), "nothing served by Redis while it was down")

	t.Logf("down for %v", time.Since(down))
	require.NoError(t, srv.Restart()) // empty: every bucket full
	up := time.Now()
	require.Eventually(t, func() bool {
		tries("open", 1)
		return served.Load() > 14
	}, long, 5*time.Millisecond, "a probe finds Redis back, and the shared bucket decides")
	t.Logf("back after %v", time.Since(up))
	fb := fallbacks("open")
	got, why = tries("open", 5)
	assert.Zero(t, got, "the shared bucket of 1 was spent: no more Open fallback")
	assert.Equal(t, 5, why[flow.ReasonGlobal])
	assert.Equal(t, fb, fallbacks("open"))
	require.Eventually(t, func() bool {
		tries("closed", 1)
		return fallbacks("closed") > 0 && served.Load() > 15
	}, long, 5*time.Millisecond)
	got, _ = tries("closed", 10)
	assert.Equal(t, 10, got, "Closed admits again, through Redis")
}

// TestGCRABatchLargerThanBurst: a batch above the burst is refused every
// time without a call, and its retry is unknown; the script itself says
// never (-1).
func TestGCRABatchLargerThanBurst(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client())
	eng, err := flow.New(flow.WithTokenSource(s))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "big", Resource: "api", Threshold: 1000, Behavior: flow.GCRA, Burst: 5, Global: true}}))
	calls := s.Stats().Calls
	for range 10 {
		en, err := eng.Entry("api", flow.WithCount(6))
		require.ErrorIs(t, err, flow.ErrBlocked)
		assert.Negative(t, en.Refusal().RetryAfter, "never: the retry is unknown")
	}
	assert.Equal(t, calls, s.Stats().Calls, "refused without a call")
	en, err := eng.Entry("api", flow.WithCount(5))
	require.NoError(t, err, "the whole bucket fits")
	en.Exit(nil)

	d, err := s.takeGCRA(t.Context(), s.gcraBoundFor(gcraReq("id:big", 1000, 5)), 6)
	require.NoError(t, err)
	assert.False(t, d.Allowed)
	assert.Equal(t, time.Duration(-1), d.RetryAfter)
}

// TestGCRARulesAreChecked: a bad Global GCRA rule is refused, naming the
// field and value; the Source refuses what flow never asks.
func TestGCRARulesAreChecked(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client())
	eng, err := flow.New(flow.WithTokenSource(s))
	require.NoError(t, err)
	for _, tc := range []struct {
		rule flow.Rule
		want string
	}{
		{flow.Rule{ID: "r", Resource: "a", Threshold: 1, Behavior: flow.GCRA, Global: true, PerKey: true}, `rule "r" (#0): Behavior GCRA is for plain local or Global rules (not PerKey or related), got GCRA`},
		{flow.Rule{ID: "r", Resource: "a", Threshold: 1, Behavior: flow.GCRA, Global: true, Burst: 1<<30 + 1}, `rule "r" (#0): Burst must be in [1, 1073741824], got 1073741825`},
		{flow.Rule{ID: "r", Resource: "a", Threshold: 0.01, Behavior: flow.GCRA, Global: true, Burst: 1 << 20}, `rule "r" (#0): Burst takes 1.049e+08 s to refill at Threshold 0.01`},
		{flow.Rule{ID: "r", Resource: "a", Threshold: 0.001, Behavior: flow.GCRA, Global: true, LocalShare: 0.1}, `rule "r" (#0): LocalShare leaves a local rate of 0.0001/s`},
	} {
		err := eng.LoadRules([]flow.Rule{tc.rule})
		require.ErrorIs(t, err, flow.ErrInvalidRule)
		assert.ErrorContains(t, err, tc.want)
	}
	for _, tc := range []struct {
		req  flow.GlobalRequest
		want string
	}{
		{gcraReq("id:x", 1, 0), `global: GCRA limit "id:x": Threshold must be >= 0 and Burst >= 1, got 1 and 0`},
		{gcraReq("id:x", 0.001, 1<<30), `global: GCRA limit "id:x": Burst 1073741824 at Threshold 0.001 takes more than 30 days to refill`},
	} {
		_, err := s.Acquire(t.Context(), tc.req)
		assert.EqualError(t, err, tc.want)
	}
	keyed := gcraReq("id:x", 1, 1)
	keyed.PerKey, keyed.Count = true, 1
	_, err = s.Acquire(t.Context(), keyed)
	assert.ErrorIs(t, err, errPerKeyGCRA)
	_, err = s.Bind(keyed).Acquire(t.Context(), 1)
	assert.ErrorIs(t, err, errPerKeyGCRA)
}

// TestGCRAAndWindowKeysApart: a GCRA rule and a window rule of the same
// ID are two limits, in keys no script shares; the TokenSource path (no
// Bind) decides a GCRA request too.
func TestGCRAAndWindowKeysApart(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	s := newSource(t, c, WithMaxBatch(1))
	g := gcraReq("id:same", 0.1, 2) // no token back during the test
	g.Count = 1
	w := req("same", 1000, time.Second, 1)
	w.Key = "id:same"
	for range 3 {
		_, err := s.Acquire(t.Context(), w)
		require.NoError(t, err)
	}
	got := 0
	for range 3 {
		ok, err := s.Acquire(t.Context(), g)
		require.NoError(t, err)
		if ok {
			got++
		}
	}
	assert.Equal(t, 2, got, "the bucket of 2, not touched by the window's 3")
	keys, err := c.Keys(t.Context(), "leapflow:{id:same}:*").Result()
	require.NoError(t, err)
	slices.Sort(keys)
	var data []string
	for _, k := range keys {
		if !slices.Contains([]string{"string", "hash"}, c.Type(t.Context(), k).Val()) || len(k) > 40 {
			continue // reply keys
		}
		data = append(data, k)
	}
	assert.Equal(t, []string{"leapflow:{id:same}:v2/1000ms/10:w", "leapflow:{id:same}:v2/gcra"}, data)
}

// TestGCRACancelledAndClosed: a request whose context ended is refused
// without a fallback; a closed Source refuses.
func TestGCRACancelledAndClosed(t *testing.T) {
	srv := redistest.Start(t)
	s := newSource(t, srv.Client())
	b := s.Bind(gcraReq("id:ctx", 1000, 10))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ok, err := b.Acquire(ctx, 1)
	assert.False(t, ok)
	if err != nil {
		assert.ErrorIs(t, err, context.Canceled)
	}
	require.NoError(t, s.Close())
	ok, err = b.Acquire(t.Context(), 1)
	assert.False(t, ok)
	assert.NoError(t, err, "refused, not failed over")
	assert.Positive(t, s.Stats().Refused)
}

// TestGCRASilentRedisIsDetected: a Redis that stops answering refuses
// GCRA requests as late (each waits Timeout at most) until FailAfter
// calls apart fail within CallTimeout; the fallback then applies, no
// request waits on a probe, and once Redis answers again the shared
// bucket decides.
func TestGCRASilentRedisIsDetected(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv.Addr(), 0)
	var served atomic.Int64
	src := newSource(t, px.Client(), WithTimeout(50*time.Millisecond), WithCallTimeout(200*time.Millisecond), WithFailAfter(2), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "gcra-silent", Resource: "api", Threshold: 1e6, Behavior: flow.GCRA, Burst: 1000,
		Global: true, Fallback: flow.FallbackOpen}}))
	fallbacks := func() int64 { snap, _ := eng.Snapshot("api"); return snap.Fallbacks }
	var answered atomic.Int64
	l := startLoad(eng, 4, func(error) { answered.Inc() })
	const long = 15 * time.Second
	require.Eventually(t, func() bool { return served.Load() > 0 }, long, 5*time.Millisecond, "Redis decides")

	px.SetRTT(2 * time.Hour)
	px.Drop() // new connections, and every byte on them held
	errsFrom := src.Stats().Errors
	require.Eventually(t, func() bool { return fallbacks() > 0 }, long, 5*time.Millisecond, "the fallback applies")
	st := src.Stats()
	assert.GreaterOrEqual(t, st.Errors-errsFrom, int64(2), "only after FailAfter calls failed")
	assert.Positive(t, st.Late, "until then, requests were refused as late")
	// Requests that asked just before the backoff began are late within
	// Timeout; after that, none waits for Redis.
	time.Sleep(100 * time.Millisecond)
	st = src.Stats()
	require.Eventually(t, func() bool { return src.Stats().Errors >= st.Errors+2 }, long, 5*time.Millisecond, "probes fail")
	assert.Equal(t, st.Late, src.Stats().Late, "no request waited on a probe")

	px.SetRTT(0)
	px.Drop()
	from := served.Load()
	require.Eventually(t, func() bool { return served.Load() > from }, long, 5*time.Millisecond, "recovers on its own")
	l.Stop()
	t.Logf("answered %d, fallbacks %d, %+v", answered.Load(), fallbacks(), src.Stats())
}
