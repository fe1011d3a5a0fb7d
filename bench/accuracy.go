package main

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/leapflow/leapflow/bench/baseline"
	"github.com/leapflow/leapflow/flow"
)

// accLimiter is one contender of the accuracy runs. Its allow is called
// with the time the caller read (for limiters that take time as an
// argument; the others read the clock themselves, the seeds' baselines
// under their lock) and returns whether it admitted and the instant, on
// the limiter's own clock, to record the admission at.
type accLimiter struct {
	name string
	// ownBuckets, if set, is the limiter's bucket count: its own windows
	// are ownBuckets buckets of W/ownBuckets, aligned to the origin.
	ownBuckets int
	// make builds a fresh limiter reading clock (nanoseconds); wait is how
	// a blocking limiter sleeps on that clock.
	make func(threshold int64, w time.Duration, clock func() int64, sleep func(time.Duration)) func(now int64) (bool, int64)
}

// leapflowBuckets is the bucket count of leapflow's default window.
const leapflowBuckets = 4 // flow's default sample count (WithSampleCount)

// funcClock adapts a func to stat.Clock.
type funcClock func() int64

func (f funcClock) Now() int64 { return f() }

// uberClock adapts the accuracy clock to go.uber.org/ratelimit's Clock.
// The limiter reads a zero time as "never called", so its clock is offset.
type uberClock struct {
	now   func() int64
	sleep func(time.Duration)
}

const uberOffset = int64(1) << 50

func (c uberClock) Now() time.Time        { return time.Unix(0, c.now()+uberOffset) }
func (c uberClock) Sleep(d time.Duration) { c.sleep(d) }

var accLimiters = []accLimiter{
	{
		name: "leapflow", ownBuckets: leapflowBuckets,
		make: leapflowWith(func(t int64, w time.Duration) flow.Rule {
			return flow.Rule{Resource: "r", Threshold: float64(t) * float64(time.Second) / float64(w), StatInterval: w}
		}),
	},
	{
		// The same rule, span-exact: every continuous W within T.
		name: "leapflow-span-exact", ownBuckets: leapflowBuckets,
		make: leapflowWith(func(t int64, w time.Duration) flow.Rule {
			return flow.Rule{Resource: "r", Threshold: float64(t) * float64(time.Second) / float64(w), StatInterval: w, SpanExact: true}
		}),
	},
	{
		// GCRA as x/time/rate is set up here: a burst of the threshold,
		// refilled at threshold per W.
		name: "leapflow-gcra",
		make: leapflowWith(func(t int64, w time.Duration) flow.Rule {
			return flow.Rule{Resource: "r", Threshold: float64(t) * float64(time.Second) / float64(w), Behavior: flow.GCRA, Burst: int(t)}
		}),
	},
	{
		name: "fixed-window", ownBuckets: 1,
		make: func(t int64, w time.Duration, clock func() int64, _ func(time.Duration)) func(int64) (bool, int64) {
			l := baseline.NewFixedWindow(t, w, clock)
			return func(int64) (bool, int64) { return l.AllowTimed() }
		},
	},
	{
		name: "sliding-window", ownBuckets: 10,
		make: func(t int64, w time.Duration, clock func() int64, _ func(time.Duration)) func(int64) (bool, int64) {
			l := baseline.NewSlidingWindow(t, w, 10, clock)
			return func(int64) (bool, int64) { return l.AllowTimed() }
		},
	},
	{
		name: "sliding-log",
		make: func(t int64, w time.Duration, clock func() int64, _ func(time.Duration)) func(int64) (bool, int64) {
			l := baseline.NewSlidingLog(int(t), w, clock)
			return func(int64) (bool, int64) { return l.AllowTimed() }
		},
	},
	{
		name: "x/time/rate",
		make: func(t int64, w time.Duration, _ func() int64, _ func(time.Duration)) func(int64) (bool, int64) {
			l := rate.NewLimiter(rate.Limit(float64(t)*float64(time.Second)/float64(w)), int(t))
			return func(now int64) (bool, int64) { return l.AllowN(time.Unix(0, now), 1), now }
		},
	},
	{
		name: "uber/ratelimit",
		make: func(t int64, w time.Duration, clock func() int64, sleep func(time.Duration)) func(int64) (bool, int64) {
			l := ratelimit.New(int(t), ratelimit.Per(w), ratelimit.WithClock(uberClock{clock, sleep}))
			return func(int64) (bool, int64) { return true, l.Take().UnixNano() - uberOffset }
		},
	},
}

// leapflowWith makes an accLimiter's make for an engine holding the rule
// that rule returns.
func leapflowWith(rule func(t int64, w time.Duration) flow.Rule) func(int64, time.Duration, func() int64, func(time.Duration)) func(int64) (bool, int64) {
	return func(t int64, w time.Duration, clock func() int64, _ func(time.Duration)) func(int64) (bool, int64) {
		eng, err := flow.New(flow.WithClock(funcClock(clock)))
		if err != nil {
			panic(err)
		}
		if err := eng.LoadRules([]flow.Rule{rule(t, w)}); err != nil {
			panic(err)
		}
		return func(int64) (bool, int64) {
			en, err := eng.Entry("r")
			if err != nil {
				return false, 0
			}
			en.Exit(nil)
			return true, en.Start()
		}
	}
}

// accuracy is what one run admitted, read off the admission instants.
type accuracy struct {
	limiter   string
	scenario  string
	threshold int64
	total     int64
	maxOwn    int64   // -1: the limiter has no windows of its own
	maxHalf   int64   // any continuous W/2
	maxShort  int64   // any continuous W - W/n (n = leapflow's buckets)
	maxFull   int64   // any continuous W
	perW      float64 // admitted per W over the run; 0: not a rate (boundary)
}

func (a accuracy) over() int64 { return max(0, max(a.maxOwn, a.maxFull)-a.threshold) }

// maxSpan returns the most instants in any half-open span of length l.
func maxSpan(ts []int64, l int64) int64 {
	best, lo := 0, 0
	for hi := range ts {
		for ts[hi]-ts[lo] >= l {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return int64(best)
}

// maxOwn returns the most instants in any window of n buckets of w/n, the
// buckets aligned to the origin.
func maxOwn(ts []int64, w int64, n int) int64 {
	bl := w / int64(n)
	counts := map[int64]int64{}
	for _, t := range ts {
		counts[t/bl]++
	}
	var best int64
	for b := range counts {
		var sum int64
		for k := b - int64(n) + 1; k <= b; k++ {
			sum += counts[k]
		}
		best = max(best, sum)
	}
	return best
}

func summarize(l accLimiter, scenario string, threshold int64, w time.Duration, ts []int64) accuracy {
	slices.Sort(ts)
	a := accuracy{limiter: l.name, scenario: scenario, threshold: threshold, total: int64(len(ts)), maxOwn: -1}
	W := int64(w)
	a.maxHalf = maxSpan(ts, W/2)
	a.maxShort = maxSpan(ts, W-W/leapflowBuckets)
	a.maxFull = maxSpan(ts, W)
	if l.ownBuckets > 0 {
		a.maxOwn = maxOwn(ts, W, l.ownBuckets)
	}
	return a
}

// hammerAccuracy runs g goroutines against a fresh limiter on the real
// clock for d and records every admission.
func hammerAccuracy(l accLimiter, threshold int64, w time.Duration, g int, d time.Duration) accuracy {
	a := summarize(l, "hammer", threshold, w, hammerRun(l, threshold, w, g, d))
	a.perW = float64(a.total) * float64(w) / float64(d)
	return a
}

// hammerRun is the hammer: the admission instants, unsorted.
func hammerRun(l accLimiter, threshold int64, w time.Duration, g int, d time.Duration) []int64 {
	origin := time.Now()
	clock := func() int64 { return int64(time.Since(origin)) }
	allow := l.make(threshold, w, clock, time.Sleep)
	per := make([][]int64, g)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if ok, at := allow(clock()); ok && at < int64(d) {
					per[i] = append(per[i], at)
				}
			}
		}()
	}
	wg.Wait()
	var ts []int64
	for _, p := range per {
		ts = append(ts, p...)
	}
	slices.Sort(ts)
	return ts
}

// fakeClock is the synthetic time of the deterministic scenarios; sleeping
// moves it.
type fakeClock struct{ now int64 }

func (c *fakeClock) read() int64           { return c.now }
func (c *fakeClock) sleep(d time.Duration) { c.now += int64(d) }
func (c *fakeClock) set(t int64)           { c.now = max(c.now, t) }
func (c *fakeClock) at(frac float64, w time.Duration) int64 {
	return int64(frac * float64(w))
}

// boundary is the seeds' example: T requests at 0.9 W, T more at 1.0 W
// (starting one window in, so every limiter is past its first window).
func boundary(l accLimiter, threshold int64, w time.Duration) accuracy {
	c := &fakeClock{now: int64(w)}
	allow := l.make(threshold, w, c.read, c.sleep)
	var ts []int64
	for _, frac := range []float64{1.9, 2.0} {
		c.set(c.at(frac, w))
		for range threshold {
			if ok, at := allow(c.read()); ok {
				ts = append(ts, at)
			}
		}
	}
	return summarize(l, "boundary", threshold, w, ts)
}

// greedy asks every millisecond for 3 W, as many times as the limiter
// admits (a blocking limiter: as many as fit in that millisecond).
func greedy(l accLimiter, threshold int64, w time.Duration) accuracy {
	c := &fakeClock{}
	allow := l.make(threshold, w, c.read, c.sleep)
	var ts []int64
	end := int64(3 * w)
	for tick := int64(0); tick < end; tick += int64(time.Millisecond) {
		c.set(tick)
		for range 2*threshold + 1 {
			ok, at := allow(c.read())
			if !ok || at >= tick+int64(time.Millisecond) {
				if ok {
					ts = append(ts, at)
				}
				break
			}
			ts = append(ts, at)
		}
	}
	a := summarize(l, "greedy", threshold, w, ts)
	a.perW = steadyRate(l, threshold, w)
	return a
}
