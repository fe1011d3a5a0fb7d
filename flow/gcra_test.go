package flow

import (
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestGCRAStepByStep: a burst, then one token per interval; a blocked
// request is told when its tokens are there; a batch larger than the
// burst never passes; a later rule's block gives the tokens back.
func TestGCRAStepByStep(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{ID: "bucket", Resource: "api", Threshold: 10, Behavior: GCRA, Burst: 3},
		Rule{Resource: "two", Threshold: 10, Behavior: GCRA, Burst: 2},
		Rule{Resource: "two", Metric: Concurrency, Threshold: 0},
	)
	clock.Set(time.Second)
	for range 3 {
		require.True(t, try(e, "api"), "the burst")
	}
	en, err := e.Entry("api")
	require.ErrorIs(t, err, ErrBlocked)
	d, ok := en.retryAfter()
	require.True(t, ok)
	assert.Equal(t, 100*ms, d, "one token every 100 ms")
	clock.Set(time.Second + 99*ms)
	assert.False(t, try(e, "api"))
	clock.Set(time.Second + 100*ms)
	assert.True(t, try(e, "api"))
	assert.False(t, try(e, "api"))
	clock.Set(2 * time.Second)
	_, err = e.Entry("api", WithCount(4))
	assert.ErrorIs(t, err, ErrBlocked, "more than the burst never passes")
	en, err = e.Entry("api", WithCount(3))
	require.NoError(t, err, "the bucket refilled")
	en.Exit(nil)

	// A Concurrency rule of 0 blocks after the GCRA rule took its token:
	// the token goes back.
	for range 5 {
		assert.False(t, try(e, "two"))
	}
	load(t, e, Rule{Resource: "two", Threshold: 10, Behavior: GCRA, Burst: 2})
	assert.True(t, try(e, "two"))
	assert.True(t, try(e, "two"), "both tokens were given back")
}

// TestGCRAMatchesXTimeRate: on the same monotonic sequence of arrivals
// and batch sizes, at rates whose interval is a whole number of
// nanoseconds, GCRA decides as x/time/rate does.
func TestGCRAMatchesXTimeRate(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 3))
		rates := []float64{1, 4, 10, 250, 1000, 8000}
		r := rates[rng.IntN(len(rates))]
		burst := 1 + rng.IntN(8)
		clock := stattest.NewClock(0)
		e, _ := newEngine(t, clock)
		load(t, e, Rule{Resource: "api", Threshold: r, Behavior: GCRA, Burst: burst})
		base := time.Unix(1_700_000_000, 0)
		lim := rate.NewLimiter(rate.Limit(r), burst)
		interval := time.Duration(1e9 / r)
		now := time.Duration(0)
		mismatches := 0
		for i := range 2000 {
			// Arrivals on a grid of an eighth of the interval: integer
			// token counts, no floating-point edge.
			now += time.Duration(rng.IntN(12)) * interval / 8
			n := 1 + rng.IntN(burst+1)
			clock.Set(time.Second + now)
			want := lim.AllowN(base.Add(time.Second+now), n)
			en, err := e.Entry("api", WithCount(n))
			got := err == nil
			if got {
				en.Exit(nil)
			}
			if got != want {
				mismatches++
				t.Logf("seed %d rate %v burst %d step %d at %v n %d: leapflow %v, x/time/rate %v", seed, r, burst, i, now, n, got, want)
			}
		}
		assert.Zero(t, mismatches, "seed %d", seed)
	}
}

// TestGCRAUnderAHammer: goroutines on a running fake clock; every span of
// the recorded admission times (the engine's own) holds at most
// Burst + rate x span: with a small burst, taken from the bucket's one
// cell, and with a large one, from its per-P lanes (see gcra.Cell).
func TestGCRAUnderAHammer(t *testing.T) {
	for _, c := range []struct {
		burst     int
		perSecond float64
	}{{5, 1000}, {4000, 1e5}} {
		clock := stattest.NewClock(time.Second)
		e, _ := newEngine(t, clock)
		load(t, e, Rule{Resource: "api", Threshold: c.perSecond, Behavior: GCRA, Burst: c.burst})
		interval := int64(1e9 / c.perSecond)
		stop := make(chan struct{})
		var tick sync.WaitGroup
		tick.Add(1)
		go func() {
			defer tick.Done()
			for {
				select {
				case <-stop:
					return
				default:
					clock.Advance(time.Duration(interval) * 37 / 1000)
				}
			}
		}()
		var mu sync.Mutex
		var times []int64
		var wg sync.WaitGroup
		for range 64 {
			wg.Go(func() {
				for range 500 {
					en, err := e.Entry("api")
					if err != nil {
						continue
					}
					mu.Lock()
					times = append(times, en.Start())
					mu.Unlock()
					en.Exit(nil)
				}
			})
		}
		wg.Wait()
		close(stop)
		tick.Wait()
		sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
		require.NotEmpty(t, times)
		// For admissions i <= j: (j - i + 1) x interval - (t_j - t_i) <= burst x interval.
		minU, worst := int64(0), int64(0)
		for k, at := range times {
			u := int64(k)*interval - at
			if k == 0 || u < minU {
				minU = u
			}
			worst = max(worst, u-minU+interval)
		}
		assert.LessOrEqual(t, worst, int64(c.burst)*interval, "burst %d: %d admissions", c.burst, len(times))
	}
}

// TestGCRARuleChecks: the fields GCRA needs, and those it refuses.
func TestGCRARuleChecks(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	for field, r := range map[string]Rule{
		"Burst":        {Resource: "a", Threshold: 1, Burst: 3},
		"Behavior":     {Resource: "a", Threshold: 1, Behavior: GCRA, PerKey: true},
		"Threshold":    {Resource: "a", Threshold: 0.0001, Behavior: GCRA},
		"StatInterval": {Resource: "a", Threshold: 1, Behavior: GCRA, StatInterval: 2 * time.Second},
	} {
		var re *RuleError
		require.ErrorAs(t, e.LoadRules([]Rule{r}), &re, field)
		assert.Equal(t, field, re.Field)
	}
	require.NoError(t, e.LoadRules([]Rule{{Resource: "a", Threshold: 1, Behavior: GCRA}}))
	assert.Equal(t, 1, e.Rules()[0].Burst, "a burst of 1 by default")
}

// TestGCRARefillIsBounded: a bucket that would take more than 30 days to
// refill is refused by name (Burst x a token's cost would otherwise wrap
// int64 at the slowest rates and largest bursts).
func TestGCRARefillIsBounded(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	err := e.LoadRules([]Rule{{Resource: "a", Threshold: 0.001, Behavior: GCRA, Burst: maxBurst}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "Burst")
	assert.Contains(t, err.Error(), "to refill")
	require.NoError(t, e.LoadRules([]Rule{{Resource: "a", Threshold: 0.001, Behavior: GCRA, Burst: 2000}}), "2000 s to refill")
}
