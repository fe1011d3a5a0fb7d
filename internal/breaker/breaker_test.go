package breaker

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

const (
	ms  = int64(time.Millisecond)
	sec = int64(time.Second)
)

// recorder keeps the transitions a breaker reports.
type recorder struct {
	mu sync.Mutex
	ts []Transition
}

func (r *recorder) add(t Transition) {
	r.mu.Lock()
	r.ts = append(r.ts, t)
	r.mu.Unlock()
}

func (r *recorder) all() []Transition {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Transition(nil), r.ts...)
}

func newBreaker(cfg Config) (*Breaker, *recorder) {
	if cfg.Interval == 0 {
		cfg.Interval, cfg.Buckets = sec, 10
	}
	if cfg.RetryTimeout == 0 {
		cfg.RetryTimeout = 5 * sec
	}
	if cfg.ProbeTimeout == 0 {
		cfg.ProbeTimeout = 2 * sec
	}
	rec := &recorder{}
	return New(cfg, rec.add), rec
}

// enter asserts a request at now is admitted (as the probe or not).
func enter(t *testing.T, b *Breaker, now int64, probe bool) {
	t.Helper()
	ok, p, _ := b.Enter(now)
	require.True(t, ok, "admitted at %v", time.Duration(now))
	require.Equal(t, probe, p, "the probe at %v", time.Duration(now))
}

// refused asserts a request at now is refused, told to retry in retry.
func refused(t *testing.T, b *Breaker, now, retry int64) {
	t.Helper()
	ok, p, r := b.Enter(now)
	require.False(t, ok, "refused at %v", time.Duration(now))
	require.False(t, p)
	require.Equal(t, time.Duration(retry), time.Duration(r), "retry at %v", time.Duration(now))
}

// The error-count breaker, step by step on a fake clock: it trips at the
// threshold, refuses until the retry timeout, admits one probe, reopens on
// a failed probe, closes on a good one with its window forgotten, and
// counts nothing of requests admitted before it last closed.
func TestErrorCountTripsProbesAndRecovers(t *testing.T) {
	b, rec := newBreaker(Config{Strategy: ErrorCount, Threshold: 3, MinRequests: 1})
	for range 3 {
		enter(t, b, 0, false)
	}
	b.Exit(0, 0, 10*ms, true, true)
	b.Exit(0, 0, 10*ms, true, true)
	s, _ := b.State()
	assert.Equal(t, Closed, s, "two errors of three")
	b.Exit(0, 0, 10*ms, true, true)
	s, at := b.State()
	assert.Equal(t, Open, s)
	assert.Equal(t, 10*ms, at)
	require.Equal(t, []Transition{{From: Closed, To: Open, At: 10 * ms, Value: 3}}, rec.all())

	refused(t, b, sec, 4*sec+10*ms)
	refused(t, b, 5*sec+9*ms, ms)
	enter(t, b, 5*sec+10*ms, true)
	refused(t, b, 5*sec+10*ms, 2*sec) // the probe holds its place
	refused(t, b, 6*sec, sec+10*ms)
	b.Exit(0, 5*sec+10*ms, 6*sec, true, true)
	s, at = b.State()
	assert.Equal(t, Open, s, "a failed probe reopens")
	assert.Equal(t, 6*sec, at)

	refused(t, b, 10*sec, sec)
	enter(t, b, 11*sec, true)
	b.Exit(0, 11*sec, 11*sec+20*ms, false, true)
	s, at = b.State()
	assert.Equal(t, Closed, s, "a good probe closes")
	assert.Equal(t, 11*sec+20*ms, at)
	all, bad := b.Sum(11*sec + 20*ms)
	assert.Zero(t, all+bad, "the window starts afresh")

	// A request admitted before the breaker opened completes now, failed:
	// it counts for nothing.
	b.Exit(0, 0, 11*sec+30*ms, true, true)
	all, _ = b.Sum(11*sec + 30*ms)
	assert.Zero(t, all)
	enter(t, b, 11*sec+40*ms, false)

	assert.Equal(t, []Transition{
		{From: Closed, To: Open, At: 10 * ms, Value: 3},
		{From: Open, To: HalfOpen, At: 5*sec + 10*ms},
		{From: HalfOpen, To: Open, At: 6 * sec, Value: 1},
		{From: Open, To: HalfOpen, At: 11 * sec},
		{From: HalfOpen, To: Closed, At: 11*sec + 20*ms, Value: float64(20 * ms)},
	}, rec.all())
}

// The error-ratio breaker trips when the share of errors reaches the
// threshold, not before its minimum of requests; the check runs as a
// request fails.
func TestErrorRatioTripsAtItsShareAfterItsMinimum(t *testing.T) {
	b, rec := newBreaker(Config{Strategy: ErrorRatio, Threshold: 0.5, MinRequests: 4})
	now := int64(0)
	exit := func(failed bool) {
		enter(t, b, now, false)
		b.Exit(0, now, now+ms, failed, true)
	}
	exit(true)
	exit(true)
	exit(true)
	s, _ := b.State()
	assert.Equal(t, Closed, s, "3 of 3 failed, under the minimum of 4")
	exit(false)
	exit(false)
	exit(false)
	s, _ = b.State()
	assert.Equal(t, Closed, s, "3 of 6")
	exit(true)
	s, _ = b.State()
	assert.Equal(t, Open, s, "4 of 7")
	require.Len(t, rec.all(), 1)
	assert.InDelta(t, 4.0/7, rec.all()[0].Value, 1e-12)
}

// The slow-ratio breaker counts requests slower than MaxRT, not errors;
// a probe reopens it when slow, closes it when fast, failed or not.
func TestSlowRatioCountsSlowRequests(t *testing.T) {
	b, rec := newBreaker(Config{Strategy: SlowRatio, Threshold: 0.6, MaxRT: 100 * ms, MinRequests: 5})
	for i := range 5 {
		enter(t, b, 0, false)
		rt := 50 * ms
		if i%2 == 0 {
			rt = 101 * ms
		}
		b.Exit(0, 0, rt, i == 1, true) // the failure is fast: not counted bad
	}
	all, bad := b.Sum(101 * ms)
	assert.Equal(t, [2]int64{5, 3}, [2]int64{all, bad})
	s, _ := b.State()
	assert.Equal(t, Open, s, "3 of 5 slow")
	assert.InDelta(t, 0.6, rec.all()[0].Value, 1e-12)

	enter(t, b, 6*sec, true)
	b.Exit(0, 6*sec, 6*sec+100*ms+1, false, true)
	s, _ = b.State()
	assert.Equal(t, Open, s, "a slow probe reopens")
	assert.Equal(t, float64(100*ms+1), rec.all()[2].Value)
	enter(t, b, 12*sec, true)
	b.Exit(0, 12*sec, 12*sec+100*ms, true, true)
	s, _ = b.State()
	assert.Equal(t, Closed, s, "a probe at MaxRT closes, failed or not")
}

// A probe that never completes holds its place for ProbeTimeout only: the
// next request then is the probe, without a transition, and the first
// probe's late completion decides nothing.
func TestAProbeThatNeverExitsGivesItsPlaceBack(t *testing.T) {
	b, rec := newBreaker(Config{Strategy: ErrorCount, Threshold: 1, MinRequests: 1})
	enter(t, b, 0, false)
	b.Exit(0, 0, 0, true, true)
	enter(t, b, 5*sec, true) // never exits in time
	refused(t, b, 6*sec, sec)
	enter(t, b, 7*sec, true)
	refused(t, b, 7*sec, 2*sec)
	b.Exit(0, 5*sec, 7*sec+ms, true, true) // the first probe, late
	s, at := b.State()
	assert.Equal(t, HalfOpen, s)
	assert.Equal(t, 7*sec, at)
	b.Exit(0, 7*sec, 7*sec+2*ms, false, true)
	s, _ = b.State()
	assert.Equal(t, Closed, s)
	assert.Len(t, rec.all(), 3, "closed to open, open to half-open, half-open to closed: %v", rec.all())
}

// The window's sums match a brute-force oracle: completions at random
// times on random stripes, summed over the buckets of the last Interval.
func TestWindowSumsMatchTheOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 20 {
		buckets := 1 + rng.IntN(12)
		bucketLen := (1 + rng.Int64N(50)) * ms
		b, _ := newBreaker(Config{Strategy: ErrorCount, Threshold: 1e9, MinRequests: 1, Interval: bucketLen * int64(buckets), Buckets: buckets})
		type done struct {
			at  int64
			bad bool
		}
		var log []done
		now := int64(0)
		for range 2000 {
			now += rng.Int64N(bucketLen / 2)
			bad := rng.IntN(3) == 0
			b.Exit(rng.IntN(64), now, now, bad, true)
			log = append(log, done{now, bad})
			if rng.IntN(10) == 0 {
				e := now / bucketLen
				var all, nbad int64
				for _, d := range log {
					if de := d.at / bucketLen; de > e-int64(buckets) && de <= e {
						all++
						if d.bad {
							nbad++
						}
					}
				}
				gotAll, gotBad := b.Sum(now)
				require.Equal(t, [2]int64{all, nbad}, [2]int64{gotAll, gotBad}, "round %d at %v", round, time.Duration(now))
			}
		}
	}
}

// However many goroutines race into a breaker whose retry timeout has
// passed, exactly one is the probe, and the open-to-half-open transition
// is reported once; round after round.
func TestExactlyOneProbePerHalfOpenPeriod(t *testing.T) {
	for _, g := range []int{1, 2, 4, 16, 64, 256, 1024} {
		b, rec := newBreaker(Config{Strategy: ErrorCount, Threshold: 1, MinRequests: 1})
		enter(t, b, 0, false)
		b.Exit(0, 0, 0, true, true)
		now := int64(0)
		for round := range 5 {
			now += 5 * sec
			var probes, admitted atomic.Int64
			start := make(chan struct{})
			var wg sync.WaitGroup
			for range g {
				wg.Go(func() {
					<-start
					ok, probe, _ := b.Enter(now)
					if ok {
						admitted.Inc()
					}
					if probe {
						probes.Inc()
					}
				})
			}
			close(start)
			wg.Wait()
			require.EqualValues(t, 1, probes.Load(), "g=%d round %d", g, round)
			require.EqualValues(t, 1, admitted.Load(), "g=%d round %d", g, round)
			b.Exit(0, now, now, true, true) // the probe fails: open again
		}
		opened := 0
		for _, tr := range rec.all() {
			if tr.From == Open {
				opened++
			}
		}
		assert.Equal(t, 5, opened, "g=%d: each half-open period reported once", g)
	}
}

// Completions racing on every stripe are each counted once; failures
// racing past the threshold trip the breaker once, reported once.
func TestConcurrentCompletionsCountOnceAndTripOnce(t *testing.T) {
	const g, each = 16, 500
	hammer := func(b *Breaker) {
		var wg sync.WaitGroup
		for i := range g {
			wg.Go(func() {
				for j := range each {
					b.Exit(i, 0, sec, j%4 == 0, true)
				}
			})
		}
		wg.Wait()
	}
	b, rec := newBreaker(Config{Strategy: ErrorCount, Threshold: g*each/4 + 1, MinRequests: 1, Interval: 100 * sec, Buckets: 10})
	hammer(b)
	all, bad := b.Sum(sec)
	assert.EqualValues(t, g*each, all)
	assert.EqualValues(t, g*each/4, bad)
	assert.Empty(t, rec.all())

	b, rec = newBreaker(Config{Strategy: ErrorCount, Threshold: 100, MinRequests: 1, Interval: 100 * sec, Buckets: 10})
	hammer(b)
	s, _ := b.State()
	assert.Equal(t, Open, s)
	assert.Len(t, rec.all(), 1, "tripped once: %v", rec.all())
}

// A state word keeps the state and its instant apart.
func TestStateWordRoundTrips(t *testing.T) {
	for _, s := range []State{Closed, Open, HalfOpen} {
		for _, at := range []int64{0, 1, sec, 1 << 60} {
			gs, gat := unpack(pack(s, at))
			assert.Equal(t, s, gs)
			assert.Equal(t, at, gat)
		}
	}
	assert.Equal(t, "HalfOpen", HalfOpen.String())
}

// A closed breaker's Enter and a good Exit: a load, and one
// compare-and-swap on the caller's stripe; nothing allocated.
func BenchmarkClosedEnterExit(b *testing.B) {
	br, _ := newBreaker(Config{Strategy: SlowRatio, Threshold: 0.5, MaxRT: sec, MinRequests: 5})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		p := rand.IntN(64)
		now := int64(0)
		for pb.Next() {
			now += 100
			if ok, _, _ := br.Enter(now); ok {
				br.Exit(p, now, now+10, false, true)
			}
		}
	})
}

func TestClosedEnterExitAllocatesNothing(t *testing.T) {
	br, _ := newBreaker(Config{Strategy: ErrorRatio, Threshold: 0.5, MinRequests: 5})
	now := int64(0)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		now += ms
		br.Enter(now)
		br.Exit(0, now, now+1, now%3 == 0, true)
	}))
}
