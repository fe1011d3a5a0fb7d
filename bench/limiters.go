package main

import (
	"fmt"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/leapflow/leapflow/bench/baseline"
	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// op is one operation of a throughput run: goroutine g's i-th call.
type op func(g, i int)

// impl is one contender of the throughput table.
type impl struct {
	name string
	note string
	// setup builds the limiters for n resources and returns the operation
	// and a cleanup.
	setup func(n int) (op, func())
}

// hugeLimit never blocks within a run.
const hugeLimit = 1e12

// logLimit caps the sliding log: it keeps every admission of the last
// window, so with no cap its memory grows with the rate.
const logLimit = 1 << 20

func names(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("res-%d", i)
	}
	return s
}

// pick spreads goroutines over resources without shared state.
func pick(g, i, n int) int {
	if n == 1 {
		return 0
	}
	return (g*7919 + i) % n
}

func leapflowEngine(n int, clock stat.Clock, threshold float64) (*flow.Engine, []string) {
	eng, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(n+1))
	if err != nil {
		panic(err)
	}
	res := names(n)
	rules := make([]flow.Rule, n)
	for i, r := range res {
		rules[i] = flow.Rule{Resource: r, Threshold: threshold}
	}
	if err := eng.LoadRules(rules); err != nil {
		panic(err)
	}
	return eng, res
}

func leapflowPass(clock func() (stat.Clock, func()), byName bool) func(n int) (op, func()) {
	return func(n int) (op, func()) {
		c, stop := clock()
		eng, res := leapflowEngine(n, c, hugeLimit)
		if byName {
			return func(g, i int) {
				en, err := eng.Entry(res[pick(g, i, n)])
				if err != nil {
					panic(err)
				}
				en.Exit(nil)
			}, stop
		}
		hs := handles(eng, res)
		return func(g, i int) {
			en, err := hs[pick(g, i, n)].Entry()
			if err != nil {
				panic(err)
			}
			en.Exit(nil)
		}, stop
	}
}

// handles returns a flow.Resource per name: what a service keeps for its
// hot resources, as x/time/rate users keep a *rate.Limiter.
func handles(eng *flow.Engine, res []string) []*flow.Resource {
	hs := make([]*flow.Resource, len(res))
	for i, r := range res {
		h, err := eng.Resource(r)
		if err != nil {
			panic(err)
		}
		hs[i] = h
	}
	return hs
}

func defaultClock() (stat.Clock, func()) { return stat.DefaultClock(), func() {} }

func monotonic() (stat.Clock, func()) { return stat.NewMonotonic(), func() {} }

func windows(n int) []*metric.Window {
	ws := make([]*metric.Window, n)
	for i := range ws {
		w, err := metric.NewWindow(leapflowBuckets, time.Second)
		if err != nil {
			panic(err)
		}
		ws[i] = w
	}
	return ws
}

var impls = []impl{
	{
		name:  "leapflow",
		note:  "Entry+Exit through a flow.Resource handle, pass path, QPS rule, full statistics, default clock (shared 1 ms coarse clock)",
		setup: leapflowPass(defaultClock, false),
	},
	{
		name:  "leapflow-by-name",
		note:  "as leapflow, through Engine.Entry(name): one map lookup more",
		setup: leapflowPass(defaultClock, true),
	},
	{
		name:  "leapflow-monotonic",
		note:  "as leapflow, with stat.NewMonotonic (nanosecond RTs: a clock read per Entry and per Exit)",
		setup: leapflowPass(monotonic, false),
	},
	{
		name: "leapflow-block",
		note: "Entry on the block path (full window), handle, default clock",
		setup: func(n int) (op, func()) {
			eng, res := leapflowEngine(n, stat.DefaultClock(), 1)
			hs := handles(eng, res)
			for _, h := range hs {
				_, _ = h.Entry()
			}
			return func(g, i int) {
				if en, err := hs[pick(g, i, n)].Entry(); err == nil {
					en.Exit(nil) // a slot freed by the clock moving on
				}
			}, func() {}
		},
	},
	{
		name: "metric-add",
		note: "metric.Window.Add of Success, time from the default clock",
		setup: func(n int) (op, func()) {
			ws := windows(n)
			c := stat.DefaultClock()
			return func(g, i int) { ws[pick(g, i, n)].Add(c.Now(), metric.Success, 1) }, func() {}
		},
	},
	{
		name: "metric-sum",
		note: "metric.Window.Sum of Pass over 4 buckets, default clock",
		setup: func(n int) (op, func()) {
			ws := windows(n)
			c := stat.DefaultClock()
			for _, w := range ws {
				w.Add(c.Now(), metric.Pass, 1)
			}
			return func(g, i int) { _ = ws[pick(g, i, n)].Sum(c.Now(), metric.Pass) }, func() {}
		},
	},
	{
		name: "x/time/rate",
		note: "Limiter.Allow (token bucket, mutex)",
		setup: func(n int) (op, func()) {
			ls := make([]*rate.Limiter, n)
			for i := range ls {
				ls[i] = rate.NewLimiter(rate.Limit(hugeLimit), 1<<30)
			}
			return func(g, i int) { _ = ls[pick(g, i, n)].Allow() }, func() {}
		},
	},
	{
		name: "uber/ratelimit",
		note: "Take (blocking only: no non-blocking call); at 1e9/s it never waits",
		setup: func(n int) (op, func()) {
			ls := make([]ratelimit.Limiter, n)
			for i := range ls {
				ls[i] = ratelimit.New(1e9)
			}
			return func(g, i int) { _ = ls[pick(g, i, n)].Take() }, func() {}
		},
	},
	{
		name: "fixed-window",
		note: "seed: fixed-window counter, mutex",
		setup: func(n int) (op, func()) {
			c := baseline.RealClock()
			ls := make([]*baseline.FixedWindow, n)
			for i := range ls {
				ls[i] = baseline.NewFixedWindow(hugeLimit, time.Second, c)
			}
			return func(g, i int) { _ = ls[pick(g, i, n)].Allow() }, func() {}
		},
	},
	{
		name: "sliding-log",
		note: fmt.Sprintf("seed: linked-list sliding log, mutex; limit %d/s so the log stays bounded", logLimit),
		setup: func(n int) (op, func()) {
			c := baseline.RealClock()
			ls := make([]*baseline.SlidingLog, n)
			for i := range ls {
				ls[i] = baseline.NewSlidingLog(logLimit, time.Second, c)
			}
			return func(g, i int) { _ = ls[pick(g, i, n)].Allow() }, func() {}
		},
	},
	{
		name: "sliding-window",
		note: "seed: mutex ring of 10 slots with a rolling total",
		setup: func(n int) (op, func()) {
			c := baseline.RealClock()
			ls := make([]*baseline.SlidingWindow, n)
			for i := range ls {
				ls[i] = baseline.NewSlidingWindow(hugeLimit, time.Second, 10, c)
			}
			return func(g, i int) { _ = ls[pick(g, i, n)].Allow() }, func() {}
		},
	},
}
