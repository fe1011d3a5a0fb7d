package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stamp is n admissions at engine time t (Entry.Start).
type stamp struct{ t, n int64 }

// mostInSpan is the most admitted in any continuous span [s, s+w): the
// brute-force reading of every span, from the admission times alone.
func mostInSpan(stamps []stamp, w int64) int64 {
	s := slices.Clone(stamps)
	slices.SortFunc(s, func(a, b stamp) int { return int(a.t - b.t) })
	var best, run int64
	i := 0
	for j := range s {
		run += s[j].n
		for s[j].t-s[i].t >= w {
			run -= s[i].n
			i++
		}
		best = max(best, run)
	}
	return best
}

func TestMostInSpanOracle(t *testing.T) {
	// The span reader against a literal count over every start.
	r := rand.New(rand.NewPCG(1, 2))
	for range 50 {
		var st []stamp
		for range 40 {
			st = append(st, stamp{r.Int64N(100), 1 + r.Int64N(3)})
		}
		w := 1 + r.Int64N(30)
		var want int64
		for s := int64(-w); s <= 100; s++ {
			var c int64
			for _, x := range st {
				if x.t >= s && x.t < s+w {
					c += x.n
				}
			}
			want = max(want, c)
		}
		assert.Equal(t, want, mostInSpan(st, w))
	}
}

func TestSpanExactValidation(t *testing.T) {
	for _, n := range []int{0, -1, 3, 7, 2000} {
		_, err := New(WithSpanBuckets(n))
		require.Error(t, err, "n=%d", n)
		assert.Contains(t, err.Error(), fmt.Sprintf("WithSpanBuckets must divide 1ms into whole nanoseconds and be at most 1000, got %d", n))
	}
	e, _ := newEngine(t, stattest.NewClock(0))
	for _, r := range []Rule{
		{Resource: "a", Metric: Concurrency, Threshold: 1, SpanExact: true},
		{Resource: "a", Threshold: 1, Behavior: Throttle, SpanExact: true},
		{Resource: "a", Threshold: 1, Behavior: GCRA, Burst: 1, SpanExact: true},
		{Resource: "a", Threshold: 1, PerKey: true, SpanExact: true},
		{Resource: "a", Threshold: 1, RelatedResource: "b", SpanExact: true},
	} {
		err := e.LoadRules([]Rule{{Resource: "ok", Threshold: 5, SpanExact: true}, r})
		require.Error(t, err, "%+v", r)
		assert.Contains(t, err.Error(), "SpanExact")
		assert.Empty(t, e.Rules(), "a set with one bad rule changes nothing")
	}
}

// greedy admits as much as it can at each instant of times, recording
// what it admitted.
// oneStripe runs the rest of the test at GOMAXPROCS 1, so that windows
// made from then on have one stripe and a single goroutine's admissions
// are exact whichever P it runs on.
func oneStripe(t *testing.T) {
	t.Cleanup(func(n int) func() { return func() { runtime.GOMAXPROCS(n) } }(runtime.GOMAXPROCS(1)))
}

func greedy(t *testing.T, e *Engine, clock *stattest.Clock, res string, times ...time.Duration) []stamp {
	t.Helper()
	var st []stamp
	for _, at := range times {
		clock.Set(at)
		for {
			en, err := e.Entry(res)
			if err != nil {
				break
			}
			st = append(st, stamp{en.Start(), 1})
			en.Exit(nil)
		}
	}
	return st
}

// TestSpanExactAdversarialBoundary is the arrival pattern that maximises
// a continuous span of a bucketed window: everything at the end of one
// bucket, then everything at the start of the next window. A plain window
// admits twice its threshold in less than W; a span-exact one never more
// than the threshold in any W.
//
// It counts exact totals, so it runs on one stripe: a goroutine that moves
// between Ps leaves the lease it took on one P's stripe unused, which only
// makes that bucket stricter (see metric's admission by leases) and would
// take one or two off the burst.
func TestSpanExactAdversarialBoundary(t *testing.T) {
	const threshold = 100
	oneStripe(t)
	for _, n := range []int{1, 2, 4, 5, 10, 20, 50} {
		t.Run(fmt.Sprintf("buckets=%d", n), func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock, WithSampleCount(n))
			load(t, e, Rule{Resource: "plain", Threshold: threshold})
			b := time.Second / time.Duration(n)
			at := []time.Duration{b - 1, time.Second, time.Second + b - 1, time.Second + b, 2*time.Second + b}
			plain := greedy(t, e, clock, "plain", at...)
			clock2 := stattest.NewClock(0) // the clock never steps back
			e, _ = newEngine(t, clock2, WithSpanBuckets(n))
			load(t, e, Rule{Resource: "span", Threshold: threshold, SpanExact: true})
			span := greedy(t, e, clock2, "span", at...)
			w := int64(time.Second)
			assert.Equal(t, int64(2*threshold), mostInSpan(plain, w), "the plain window's double burst")
			assert.LessOrEqual(t, mostInSpan(span, w), int64(threshold))
			// The span-exact window admits again exactly when the first
			// burst (at b-1) has left every span: at W + b, not before
			// (stamps are engine time, which runs at an offset).
			require.Greater(t, len(span), threshold)
			assert.Equal(t, int64(time.Second+1), span[threshold].t-span[0].t)
		})
	}
}

// TestSpanExactRandomArrivals checks every continuous span of seeded
// random traffic (steps of any size across bucket edges, batches,
// priority requests borrowing ahead) against the threshold, and the
// steady rate under saturation against n/(n+1) of it.
func TestSpanExactRandomArrivals(t *testing.T) {
	const threshold = 60
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		n := []int{1, 2, 4, 5, 10}[seed%5]
		clock := stattest.NewClock(0)
		e, _ := newEngine(t, clock, WithSpanBuckets(n))
		load(t, e, Rule{Resource: "api", Threshold: threshold, SpanExact: true})
		var st []stamp
		now := time.Duration(0)
		for range 6000 {
			switch r.IntN(10) {
			case 0:
				now += time.Duration(r.Int64N(int64(time.Second)))
			case 1, 2:
				now += time.Duration(r.Int64N(int64(time.Millisecond)))
			default:
				now += time.Duration(r.Int64N(int64(50 * time.Microsecond)))
			}
			clock.Set(now)
			// A burst at this instant, often larger than the room.
			for range r.IntN(12) {
				c := 1 + r.IntN(3)
				opts := []EntryOption{WithCount(c)}
				if r.IntN(8) == 0 {
					opts = append(opts, WithWait(500*ms))
				}
				if en, err := e.Entry("api", opts...); err == nil {
					st = append(st, stamp{en.Start(), int64(c)})
					en.Exit(nil)
				}
			}
		}
		require.NotEmpty(t, st)
		assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(threshold), "seed %d, %d buckets", seed, n)
	}
}

// TestSpanExactSteadyRate: greedy traffic at every millisecond for 60
// windows is admitted at n/(n+1) of the threshold, the documented cost.
func TestSpanExactSteadyRate(t *testing.T) {
	const threshold = 100
	for _, n := range []int{1, 4, 10, 50} {
		clock := stattest.NewClock(0)
		e, _ := newEngine(t, clock, WithSpanBuckets(n))
		load(t, e, Rule{Resource: "api", Threshold: threshold, SpanExact: true})
		var times []time.Duration
		for tms := range 60_000 {
			times = append(times, time.Duration(tms)*ms)
		}
		st := greedy(t, e, clock, "api", times...)
		periods := int64(60*n) / int64(n+1) // whole periods of n+1 buckets
		assert.GreaterOrEqual(t, int64(len(st)), periods*threshold, "n=%d", n)
		assert.LessOrEqual(t, int64(len(st)), (periods+1)*threshold, "n=%d", n)
	}
}

// TestSpanExactHammer runs G goroutines against span-exact rules, each
// moving the engine's clock a random step before each request, through
// four seconds, and checks
// every continuous span of the admission times the engine stamped. One
// resource has the span-exact rule alone (the short path), another has a
// plain rule beside it and priority requests (the full check, borrowing).
func TestSpanExactHammer(t *testing.T) {
	const threshold = 50
	for _, g := range goroutineCounts() {
		t.Run(fmt.Sprintf("goroutines=%d", g), func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock)
			load(t, e,
				Rule{Resource: "alone", Threshold: threshold, SpanExact: true},
				Rule{Resource: "mixed", Threshold: threshold, SpanExact: true},
				Rule{Resource: "mixed", Threshold: 2 * threshold})
			stamps := make([][2][]stamp, g)
			var workers sync.WaitGroup
			for i := range g {
				workers.Add(1)
				go func() {
					defer workers.Done()
					r := rand.New(rand.NewPCG(uint64(i), 2))
					for k := 0; clock.Now() < int64(4*time.Second); k++ {
						// Every worker moves the clock: it cannot starve.
						clock.Advance(time.Duration(r.Int64N(int64(40 * time.Microsecond))))
						res, idx := "alone", 0
						opts := []EntryOption{WithCount(1 + k%2)}
						if k%2 == 1 {
							res, idx = "mixed", 1
							if r.IntN(4) == 0 {
								opts = append(opts, WithWait(300*ms))
							}
						}
						if en, err := e.Entry(res, opts...); err == nil {
							stamps[i][idx] = append(stamps[i][idx], stamp{en.Start(), int64(1 + k%2)})
							en.Exit(nil)
						}
					}
				}()
			}
			workers.Wait()
			for idx, res := range []string{"alone", "mixed"} {
				var all []stamp
				for i := range stamps {
					all = append(all, stamps[i][idx]...)
				}
				require.NotEmpty(t, all, res)
				assert.LessOrEqual(t, mostInSpan(all, int64(time.Second)), int64(threshold), res)
			}
		})
	}
}

func TestSpanExactAllocatesNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "span", Threshold: 1e12, SpanExact: true})
	r, err := e.Resource("span")
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		en, err := r.Entry()
		if err == nil {
			en.Exit(nil)
		}
	}))
}

// TestSpanExactCountsOnTheNode: a span-exact rule keeps its own window,
// and the resource's statistics still count every pass and block once.
func TestSpanExactCountsOnTheNode(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 3, SpanExact: true})
	for range 5 {
		if en, err := e.Entry("api"); err == nil {
			en.Exit(nil)
		}
	}
	snap, ok := e.Snapshot("api")
	require.True(t, ok)
	assert.Equal(t, 3.0, snap.PassQPS)
	assert.Equal(t, 2.0, snap.BlockQPS)
}

// TestGlobalSpanExactFallsBackSpanExact: while the token source fails, a
// Global span-exact rule's local fallback window is span-exact too (the
// adversarial pattern admits twice the share in a plain one), and the
// source is told the rule is span-exact.
func TestGlobalSpanExactFallsBackSpanExact(t *testing.T) {
	src := &fakeSource{}
	src.err.Store(errors.New("down"))
	var got GlobalRequest
	seen := sourceFunc(func(_ context.Context, req GlobalRequest) (bool, error) {
		got = req
		return src.Acquire(context.Background(), req)
	})
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithTokenSource(seen), WithSpanBuckets(4))
	load(t, e, Rule{Resource: "api", Threshold: 100, Global: true, SpanExact: true, LocalShare: 0.5})
	b := time.Second / 4
	st := greedy(t, e, clock, "api", b-1, time.Second, time.Second+b-1, time.Second+b, 2*time.Second+b)
	assert.True(t, got.SpanExact)
	assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(50))
	require.Greater(t, len(st), 50)
	assert.Equal(t, int64(time.Second+1), st[50].t-st[0].t, "the share again once the first burst left every span")
}

// Span-exact and plain rules together, with plain entries, waits (some cut
// short by their context) and batches on the real clock with the CPU
// oversubscribed: every continuous span of the stamps holds the threshold.
func TestSpanExactHoldsOnABusyRealClock(t *testing.T) {
	for _, tc := range []struct {
		name  string
		clock func() stat.Clock
	}{
		{"monotonic", stat.NewMonotonic},
		{"coarse", stat.DefaultClock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const threshold = 30
			interval := 20 * time.Millisecond
			e, err := New(WithClock(tc.clock()), WithSpanBuckets(10))
			require.NoError(t, err)
			require.NoError(t, e.LoadRules([]Rule{
				{Resource: "api", Threshold: threshold * float64(time.Second/interval), StatInterval: interval, SpanExact: true},
				{Resource: "api2", Threshold: threshold * float64(time.Second/interval), StatInterval: interval, SpanExact: true},
				{Resource: "api2", Threshold: 1000, Behavior: GCRA, Burst: 10},
			}))
			stop := make(chan struct{})
			var spin sync.WaitGroup
			for range runtime.GOMAXPROCS(0) * 8 {
				spin.Add(1)
				go func() {
					defer spin.Done()
					x := 0
					for {
						select {
						case <-stop:
							return
						default:
						}
						for i := range 1000 {
							x += i
						}
					}
				}()
			}
			var mu sync.Mutex
			stamps := map[string][]stamp{}
			var bad atomic.Int64
			var wg sync.WaitGroup
			deadline := time.Now().Add(700 * time.Millisecond)
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 3))
					for time.Now().Before(deadline) {
						res := []string{"api", "api2"}[r.IntN(2)]
						n := 1 + r.IntN(3)
						var en Entry
						var err error
						switch r.IntN(4) {
						case 0:
							en, err = e.Entry(res, WithCount(n))
						case 1:
							ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r.Int64N(int64(10*time.Millisecond))))
							en, err = e.Wait(ctx, res, WithCount(n))
							cancel()
						case 2:
							en, err = e.Entry(res, WithCount(n), WithWait(time.Duration(r.Int64N(int64(25*time.Millisecond)))))
						case 3:
							en, err = e.Entry(res, WithWait(500*time.Millisecond))
							n = 1
						}
						if err == nil {
							mu.Lock()
							stamps[res] = append(stamps[res], stamp{en.Start(), int64(n)})
							mu.Unlock()
							en.Exit(nil)
						} else if !errors.Is(err, context.DeadlineExceeded) && !errors.As(err, new(*BlockError)) {
							bad.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			close(stop)
			spin.Wait()
			assert.Zero(t, bad.Load())
			for res, st := range stamps {
				t.Logf("%s: %d stamps", res, len(st))
				assert.LessOrEqual(t, mostInSpan(st, int64(interval)), int64(threshold), res)
				if res == "api2" {
					for _, l := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 100 * time.Millisecond} {
						assert.LessOrEqual(t, mostInSpan(st, int64(l)), 10+int64(l)/int64(time.Millisecond)+1, fmt.Sprintf("gcra span %v", l))
					}
				}
			}
		})
	}
}

// A span-exact rule (12 per 500 ms) with a Throttle rule on the same
// resource, so every request that queues is aligned; goroutines advance the
// fake clock. Every continuous 500 ms span of the engine's stamps holds 12.
func TestSpanExactHoldsWithAThrottleUnderHammer(t *testing.T) {
	const threshold = 12
	for _, tc := range []struct {
		name  string
		extra []Rule
		wait  bool
		batch bool
	}{
		{"throttle", []Rule{{Resource: "api", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms}}, false, false},
		{"throttle-batch", []Rule{{Resource: "api", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms}}, false, true},
		{"throttle-wait", []Rule{{Resource: "api", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms}}, true, false},
		{"gcra-wait", []Rule{{Resource: "api", Threshold: 30, Behavior: GCRA, Burst: 3}}, true, false},
		{"plain-wait", []Rule{{Resource: "api", Threshold: 24}}, true, false},
		{"plain", []Rule{{Resource: "api", Threshold: 24}}, false, false},
		{"plain-batch", []Rule{{Resource: "api", Threshold: 24}}, false, true},
	} {
		for _, g := range []int{1, 4, 32} {
			t.Run(fmt.Sprintf("%s/goroutines=%d", tc.name, g), func(t *testing.T) {
				e, clock, _ := waitEngine(t)
				load(t, e, append([]Rule{{Resource: "api", Threshold: 2 * threshold, SpanExact: true, StatInterval: 500 * ms}}, tc.extra...)...)
				var mu sync.Mutex
				var st []stamp
				var wg sync.WaitGroup
				for i := range g {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(i), 11))
						for range 6000 / g {
							clock.Advance(time.Duration(r.Int64N(int64(3 * ms))))
							var opts []EntryOption
							if tc.wait && r.IntN(2) == 0 {
								opts = append(opts, WithWait(time.Duration(r.Int64N(int64(time.Second)))))
							}
							n := 1
							if tc.batch {
								n = 1 + r.IntN(4)
								opts = append(opts, WithCount(n))
							}
							en, err := e.Entry("api", opts...)
							if err == nil {
								mu.Lock()
								st = append(st, stamp{en.Start(), int64(n)})
								mu.Unlock()
								en.Exit(nil)
							}
						}
					}()
				}
				wg.Wait()
				assert.LessOrEqual(t, mostInSpan(st, int64(500*ms)), int64(threshold))
			})
		}
	}
}

// Span-exact windows of 1, 2 and 10 buckets, alone and with a Throttle rule
// (align), plain entries, batches and waits cut short at every point of the
// wait, on a fake clock the waits move: every continuous span holds the
// threshold.
func TestSpanExactHoldsUnderWaitHammer(t *testing.T) {
	const threshold = 12
	for _, k := range []int{1, 2, 10} {
		for _, cut := range []float64{-1, 0, 0.5, 1, 1.5, 3} {
			t.Run(fmt.Sprintf("buckets=%d/cut=%v", k, cut), func(t *testing.T) {
				e, clock, s := waitEngine(t, WithSpanBuckets(k))
				var rmu sync.Mutex
				rng := rand.New(rand.NewPCG(uint64(k), 9))
				s.cancel = func() bool {
					rmu.Lock()
					defer rmu.Unlock()
					return cut >= 0 && rng.IntN(3) == 0
				}
				s.cutAt = cut
				load(t, e,
					Rule{Resource: "span", Threshold: 2 * threshold, SpanExact: true, StatInterval: 500 * ms},
					Rule{Resource: "combo", Threshold: 2 * threshold, SpanExact: true, StatInterval: 500 * ms},
					Rule{Resource: "combo", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms},
					Rule{Resource: "combo", Threshold: threshold * 2},
				)
				res := []string{"span", "combo"}
				var mu sync.Mutex
				stamps := map[string][]stamp{}
				var wg sync.WaitGroup
				for i := range 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(i), 11))
						for j := range 300 {
							name := res[j%2]
							clock.Advance(time.Duration(r.Int64N(int64(3 * ms))))
							n := 1 + r.IntN(4)
							var opts []EntryOption
							opts = append(opts, WithCount(n))
							if r.IntN(2) == 0 {
								opts = append(opts, WithWait(time.Duration(r.Int64N(int64(time.Second)))))
							}
							en, err := e.Entry(name, opts...)
							if err == nil {
								mu.Lock()
								stamps[name] = append(stamps[name], stamp{en.Start(), int64(n)})
								mu.Unlock()
								en.Exit(nil)
							} else if !errors.Is(err, context.Canceled) && !errors.As(err, new(*BlockError)) {
								t.Errorf("unexpected error: %v", err)
								return
							}
						}
					}()
				}
				wg.Wait()
				for name, st := range stamps {
					assert.LessOrEqual(t, mostInSpan(st, int64(500*ms)), int64(threshold), name)
				}
				// Nothing stranded.
				s.cancel = nil
				clock.Advance(5 * time.Second)
				got := 0
				for {
					en, err := e.Entry("span")
					if err != nil {
						break
					}
					en.Exit(nil)
					got++
				}
				assert.Equal(t, threshold, got)
			})
		}
	}
}

// A span-exact rule (12 per 500 ms, buckets of 50 ms) beside a plain rule
// (1 s, buckets of 250 ms); an Exit at 1.26 s makes the plain window's
// bucket of 1.25 s, then the clock steps back 90 ms (under the 100 ms the
// engine absorbs). A request at 1.17 s is stamped in the span bucket it is
// counted in, so every 500 ms span of the engine's stamps holds the
// threshold (the proof in the package doc assumes it).
func TestSpanExactStampsInTheBucketItCounts(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "api", Threshold: 24, StatInterval: 500 * ms, SpanExact: true},
		Rule{Resource: "api", Threshold: 1000})
	var st []stamp
	clock.Set(time.Second)
	en, err := e.Entry("api")
	require.NoError(t, err)
	st = append(st, stamp{en.Start(), 1})
	clock.Set(1260 * ms)
	en.Exit(nil) // makes the 1 s window's bucket of 1.25 s
	clock.Set(1170 * ms)
	st = append(st, greedy(t, e, clock, "api", 1170*ms, 1700*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(500*ms)), int64(12))
}

// A waiter admitted against a later bucket of a Reject or span-exact window
// counts as Pass and OccupiedPass there, as the doc says, both in the
// resource's statistics.
func TestSpanExactWaiterCountsOccupied(t *testing.T) {
	for _, span := range []bool{false, true} {
		e, clock, _ := waitEngine(t)
		load(t, e, Rule{Resource: "api", Threshold: 4, SpanExact: span})
		clock.Set(100 * ms)
		for range 4 {
			en, err := e.Entry("api")
			require.NoError(t, err)
			en.Exit(nil)
		}
		en, err := e.Entry("api", WithWait(2*time.Second))
		require.NoError(t, err, "span=%v", span)
		en.Exit(nil)
		snap, ok := e.Snapshot("api")
		require.True(t, ok)
		assert.Equal(t, 1.0, snap.OccupiedQPS, "span=%v: the waiter's occupied pass (stamp %d, now %d)", span, en.Start(), clock.Now())
	}
}
