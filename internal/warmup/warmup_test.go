package warmup

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/atomic"
)

const s = int64(time.Second)

// step is one Rate at a plain instant: the previous second's passes the
// bucket is told if it syncs, whether it must ask (once, in a new
// second), and the rate it must return.
type step struct {
	t      int64
	passes int64
	reads  int
	want   float64
}

// run calls Rate for every step in order on one bucket and checks each
// result.
func run(t *testing.T, b *Bucket, steps []step) {
	t.Helper()
	for i, st := range steps {
		reads := 0
		got := b.Rate(st.t, func() int64 { reads++; return st.passes })
		if !near(got, st.want) {
			t.Errorf("step %d: Rate(t %v, passes %d) = %v want %v", i, time.Duration(st.t), st.passes, got, st.want)
		}
		if reads != st.reads {
			t.Errorf("step %d: Rate(t %v) read the previous second %d times want %d", i, time.Duration(st.t), reads, st.reads)
		}
	}
}

func near(got, want float64) bool { return math.Abs(got-want) <= 1e-9*math.Abs(want) }

// The bucket of these tests: 10 a second, a cold factor of 3, 10 s of
// warm-up: warningToken 50, maxToken 100, and the rate at t tokens above
// warning is 1 / (t x 0.004 + 0.1).
func newTen() *Bucket { return New(10, 3, 10*time.Second) }

func rateAbove(tokens float64) float64 { return 1 / (tokens*0.004 + 0.1) }

// TestStartsColdAndWarmsAsTrafficDrainsTokens: a new bucket admits
// threshold / coldFactor; each second at the full rate drains that
// second's passes, and the rate rises to the threshold as the tokens fall
// to warningToken; traffic at the rate keeps it there.
func TestStartsColdAndWarmsAsTrafficDrainsTokens(t *testing.T) {
	run(t, newTen(), []step{
		{t: s / 2, passes: 0, reads: 1, want: 10.0 / 3},    // 100 tokens: cold
		{t: s - 1, passes: 1000, reads: 0, want: 10.0 / 3}, // same second: no sync
		{t: 1 * s, passes: 10, reads: 1, want: rateAbove(40)},
		{t: 2 * s, passes: 10, reads: 1, want: rateAbove(30)},
		{t: 3 * s, passes: 10, reads: 1, want: rateAbove(20)},
		{t: 4 * s, passes: 10, reads: 1, want: rateAbove(10)},
		{t: 5 * s, passes: 10, reads: 1, want: 10}, // at warningToken
		{t: 6 * s, passes: 10, reads: 1, want: 10}, // 40: warm
		{t: 7 * s, passes: 10, reads: 1, want: 10}, // 40 + 10 refilled - 10 passed
	})
}

// TestCoolsBackWhenIdle: below the cold rate, tokens refill by the
// threshold per second elapsed, up to maxToken, and the rate falls back to
// threshold / coldFactor; traffic at or above the cold rate stops the
// refill.
func TestCoolsBackWhenIdle(t *testing.T) {
	b := newTen()
	run(t, b, []step{
		{t: 0, passes: 0, reads: 1, want: 10.0 / 3},
		{t: 1 * s, passes: 60, reads: 1, want: 10}, // 40 tokens: warm
		{t: 3 * s, passes: 0, reads: 1, want: rateAbove(10)},
		{t: 4 * s, passes: 0, reads: 1, want: rateAbove(20)},
		{t: 5 * s, passes: 3, reads: 1, want: rateAbove(27)}, // 3 < 10/3: refilled, less 3
		{t: 6 * s, passes: 4, reads: 1, want: rateAbove(23)}, // 4 >= 10/3: no refill
		{t: 30 * s, passes: 0, reads: 1, want: 10.0 / 3},     // full again: cold
		{t: 29 * s, passes: 0, reads: 0, want: 10.0 / 3},     // a second already synced
	})
}

// TestNoThresholdAdmitsNothing: a threshold of 0 gives rate 0 and never
// reads the previous second.
func TestNoThresholdAdmitsNothing(t *testing.T) {
	run(t, New(0, 3, time.Second), []step{
		{t: 0, reads: 0, want: 0},
		{t: 5 * s, passes: 7, reads: 0, want: 0},
	})
}

// TestRateStaysBetweenColdAndThreshold: under any traffic and any gaps,
// the rate is never above the threshold nor below threshold / coldFactor.
func TestRateStaysBetweenColdAndThreshold(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		threshold, coldFactor float64
		period                time.Duration
	}{{10, 3, 10 * time.Second}, {1000, 2, time.Second}, {0.5, 7, time.Minute}, {1e6, 1.5, 3 * time.Second}} {
		b := New(c.threshold, c.coldFactor, c.period)
		now := int64(0)
		for i := range 2000 {
			now += rng.Int64N(3 * s)
			passes := rng.Int64N(int64(2*c.threshold) + 1)
			got := b.Rate(now, func() int64 { return passes })
			if got > c.threshold || got < c.threshold/c.coldFactor*(1-1e-9) {
				t.Fatalf("New(%v, %v, %v): step %d: Rate = %v, outside [%v, %v]", c.threshold, c.coldFactor, c.period, i, got, c.threshold/c.coldFactor, c.threshold)
			}
		}
	}
}

// TestHammerSyncsEachSecondOnce: goroutines on a shared running clock;
// each new second is synced by one of them, which alone reads the
// previous second, and every rate stays within bounds.
func TestHammerSyncsEachSecondOnce(t *testing.T) {
	b := newTen()
	var clock atomic.Int64
	goroutines, ops := 16, 4000
	if testing.Short() {
		goroutines, ops = 4, 1000
	}
	var mu sync.Mutex
	reads := map[int64]int{}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for range ops {
				now := clock.Add(rng.Int64N(s / 1000))
				got := b.Rate(now, func() int64 {
					mu.Lock()
					reads[now-now%s]++
					mu.Unlock()
					return rng.Int64N(20)
				})
				if got > 10 || got < 10.0/3*(1-1e-9) {
					t.Errorf("Rate at %d = %v, outside [10/3, 10]", now, got)
				}
			}
		})
	}
	wg.Wait()
	if len(reads) < 2 {
		t.Fatalf("the clock crossed %d seconds, want at least 2", len(reads))
	}
	for sec, n := range reads {
		if n != 1 {
			t.Errorf("second %v read %d times want 1", time.Duration(sec), n)
		}
	}
}

// TestRateAllocatesNothing: a closure passed to Rate stays on the stack,
// whether it syncs (a new second every run) or not.
func TestRateAllocatesNothing(t *testing.T) {
	b := newTen()
	now, passes := int64(0), int64(5)
	for _, step := range []int64{s, s / 1000} {
		allocs := testing.AllocsPerRun(1000, func() {
			now += step
			b.Rate(now, func() int64 { return passes })
		})
		if allocs != 0 {
			t.Fatalf("Rate, %v apart: %v allocations per run want 0", time.Duration(step), allocs)
		}
	}
}

// BenchmarkRate is the rate read on the hot path, a new second every
// 1000 calls.
func BenchmarkRate(b *testing.B) {
	w := New(1e6, 3, 10*time.Second)
	now, passes := int64(0), int64(1e6)
	b.ReportAllocs()
	for b.Loop() {
		now += s / 1000
		w.Rate(now, func() int64 { return passes })
	}
}
