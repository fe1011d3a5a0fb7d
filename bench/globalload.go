package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global"
	"github.com/leapflow/leapflow/global/redistest"
	"github.com/leapflow/leapflow/internal/trace"
)

// globalLoad is how the global layer does under load a user would give
// it: below the limit, under random arrivals, far from Redis and on a
// saturated CPU.
type globalLoad struct {
	partial []loadRow
	oracle  []loadRow
	latency []latencyRow
	busy    []busyRow
}

// loadRow is one trace replayed on instances sharing one global rule.
type loadRow struct {
	pattern   string
	threshold int64
	instances int
	sent      int64
	admitted  int64
	oracle    int64 // what the oracle admits on the same sending times
	fullest   int64 // the fullest server window
	calls     int64
	fallbacks int64
}

// latencyRow is Entry latency with Redis rtt away.
type latencyRow struct {
	rtt                 time.Duration
	sent, admitted      int64
	p50, p99, p999, max time.Duration
	late, fallbacks     int64
}

// busyRow is a hammer of more goroutines than cores on a healthy Redis.
type busyRow struct {
	goroutines int
	seconds    float64
	admitted   int64
	fullest    int64
	fallbacks  int64
	late       int64
}

// fleet is instances (engines with their own clients and Sources) sharing
// one global rule.
type fleet struct {
	res     []*flow.Resource
	engs    []*flow.Engine
	srcs    []*global.Source
	clients []*redis.Client
	audit   *global.Audit
}

func newFleet(client func() *redis.Client, n int, threshold int64, fallback flow.Fallback) *fleet {
	f := &fleet{audit: global.NewAudit()}
	key := fmt.Sprintf("load-%d", time.Now().UnixNano())
	for range n {
		c := client()
		src, err := global.New(c, global.WithOnAdmit(f.audit.Record))
		if err != nil {
			panic(err)
		}
		eng, err := flow.New(flow.WithTokenSource(src))
		if err != nil {
			panic(err)
		}
		if err := eng.LoadRules([]flow.Rule{{ID: key, Resource: "api", Threshold: float64(threshold), Global: true, Fallback: fallback}}); err != nil {
			panic(err)
		}
		r, err := eng.Resource("api")
		if err != nil {
			panic(err)
		}
		f.res, f.engs, f.srcs, f.clients = append(f.res, r), append(f.engs, eng), append(f.srcs, src), append(f.clients, c)
	}
	return f
}

// admit makes one request at instance i.
func (f *fleet) admit(i int) bool {
	en, err := f.res[i].Entry()
	if err != nil {
		return false
	}
	en.Exit(nil)
	return true
}

func (f *fleet) close() {
	for i := range f.srcs {
		_ = f.srcs[i].Close()
		_ = f.clients[i].Close()
	}
}

// stats sums the instances' calls, late refusals and fallbacks.
func (f *fleet) stats() (calls, late, fallbacks int64) {
	for i, s := range f.srcs {
		st := s.Stats()
		calls, late = calls+st.Calls, late+st.Late
		snap, _ := f.engs[i].Snapshot("api")
		fallbacks += snap.Fallbacks
	}
	return calls, late, fallbacks
}

// replay runs tr on a fleet of n instances.
func replay(srv *redistest.Server, pattern string, threshold int64, n int, tr []trace.Arrival) loadRow {
	f := newFleet(srv.Client, n, threshold, flow.FallbackClosed)
	defer f.close()
	outs := trace.Replay(tr, n, f.admit)
	row := loadRow{pattern: pattern, threshold: threshold, instances: n, sent: int64(len(outs)), admitted: trace.Admitted(outs),
		oracle: trace.Oracle(outs, threshold, time.Second, 10), fullest: f.audit.Fullest(time.Second)}
	row.calls, _, row.fallbacks = f.stats()
	return row
}

// loadSection measures the global layer under load.
func loadSection(srv *redistest.Server, cfg config, tick func(string)) globalLoad {
	var out globalLoad
	d := cfg.accDuration
	rng := rand.New(rand.NewPCG(1, 2))
	const t = 1000
	partial := []struct {
		n     int
		share float64
	}{{1, 0.5}, {1, 0.9}, {4, 0.5}, {4, 0.9}}
	if cfg.quick {
		partial = partial[3:]
	}
	for _, p := range partial {
		tick(fmt.Sprintf("global partial load %.0f%% x%d", 100*p.share, p.n))
		out.partial = append(out.partial, replay(srv, fmt.Sprintf("even, %.0f%% of T", 100*p.share), t, p.n, trace.Even(p.share*t, d, p.n)))
	}
	type oracleCase struct {
		pattern   string
		threshold int64
		n         int
		make      func(rate float64, n int) []trace.Arrival
	}
	poisson := func(rate float64, n int) []trace.Arrival { return trace.Poisson(rng, rate, d, n) }
	bursty := func(rate float64, n int) []trace.Arrival {
		return trace.Bursty(rng, 5*rate, d/20, d/6, d, n)
	}
	oneHot := func(rate float64, n int) []trace.Arrival { return trace.OneHot(rng, rate, d, n, 0.9) }
	var cases []oracleCase
	for _, n := range []int{1, 4, 16} {
		cases = append(cases, oracleCase{"poisson", t, n, poisson}, oracleCase{"bursty", t, n, bursty}, oracleCase{"one hot", t, n, oneHot})
	}
	for _, n := range []int{1, 4, 16} {
		cases = append(cases, oracleCase{"poisson", 10, n, poisson}, oracleCase{"poisson", 100_000, n, poisson})
	}
	if cfg.quick {
		cases = cases[3:6]
	}
	for _, c := range cases {
		tick(fmt.Sprintf("global %s T=%d x%d", c.pattern, c.threshold, c.n))
		out.oracle = append(out.oracle, replay(srv, c.pattern, c.threshold, c.n, c.make(1.5*float64(c.threshold), c.n)))
	}
	for _, rtt := range []time.Duration{time.Millisecond, 20 * time.Millisecond} {
		tick(fmt.Sprintf("global latency at %v", rtt))
		out.latency = append(out.latency, latency(srv, rtt, d, rng))
	}
	busyGs, busyD := []int{64, 256}, 4*d
	if cfg.quick {
		busyGs, busyD = []int{256}, 2*d
	}
	for _, g := range busyGs {
		tick(fmt.Sprintf("global busy CPU g=%d", g))
		out.busy = append(out.busy, busy(srv, g, busyD))
	}
	return out
}

// latency replays Poisson arrivals at half of 1000/s on 4 instances whose
// Redis is rtt away (through a delaying proxy) and times every Entry.
func latency(srv *redistest.Server, rtt, d time.Duration, rng *rand.Rand) latencyRow {
	px, err := redistest.NewProxy(srv.Addr(), rtt)
	if err != nil {
		panic(err)
	}
	defer px.Close()
	const n = 4
	f := newFleet(px.Client, n, 1000, flow.FallbackClosed)
	defer f.close()
	times := make([][]time.Duration, n)
	outs := trace.Replay(trace.Poisson(rng, 500, d, n), n, func(i int) bool {
		t0 := time.Now()
		ok := f.admit(i)
		times[i] = append(times[i], time.Since(t0))
		return ok
	})
	all := slices.Concat(times...)
	slices.Sort(all)
	at := func(q float64) time.Duration { return all[min(len(all)-1, int(q*float64(len(all))))] }
	row := latencyRow{rtt: rtt, sent: int64(len(outs)), admitted: trace.Admitted(outs), p50: at(0.5), p99: at(0.99), p999: at(0.999), max: all[len(all)-1]}
	_, row.late, row.fallbacks = f.stats()
	return row
}

// busy hammers one global rule of 1000/s with FallbackOpen from g
// goroutines in a tight loop for d.
func busy(srv *redistest.Server, g int, d time.Duration) busyRow {
	f := newFleet(srv.Client, 1, 1000, flow.FallbackOpen)
	defer f.close()
	var mu sync.Mutex
	var admitted int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine int64
			for time.Now().Before(end) {
				if f.admit(0) {
					mine++
				}
			}
			mu.Lock()
			admitted += mine
			mu.Unlock()
		}()
	}
	wg.Wait()
	row := busyRow{goroutines: g, seconds: d.Seconds(), admitted: admitted, fullest: f.audit.Fullest(time.Second)}
	_, row.late, row.fallbacks = f.stats()
	return row
}
