// Package overloadsim simulates a service of fixed capacity under load,
// in simulated time, with flow's rules in front of it or none: the bench's
// overload section and the overload example run it. The service has
// Workers workers and an unbounded queue; a request takes Service, give or
// take Jitter; the CPU usage its system rules read is the share of the
// workers busy over the last 100 ms. Arrivals are Poisson: first Warm at
// half the capacity, then Run at Load times it.
package overloadsim

import (
	"container/heap"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// Config is one simulation.
type Config struct {
	Workers int
	Service time.Duration
	// Jitter spreads each service time uniformly over Service x (1 ±
	// Jitter).
	Jitter float64
	// Load is the arrival rate over the capacity during Run.
	Load      float64
	Warm, Run time.Duration
	// Skip is the start of Run left out of the results (the rules
	// finding their level).
	Skip time.Duration
	Seed uint64
	// Rules are loaded on the resource "inbound", which every request
	// enters; none: every request queues.
	Rules []flow.Rule
}

// Result is what the measured part of Run saw.
type Result struct {
	// Capacity and Goodput are requests per second: what the workers can
	// complete, and what they completed.
	Capacity, Goodput float64
	// P50 and P99 are the latencies (arrival to completion) of the
	// requests that arrived in the measured span and were admitted; one
	// still queued at the end counts its wait so far.
	P50, P99 time.Duration
	// Arrived and Shed count the requests that arrived in the measured
	// span, and those refused.
	Arrived, Shed int64
	// MaxQueue is the longest the queue grew.
	MaxQueue int
}

// meter is the simulated CPU reading.
type meter struct{ bits atomic.Uint64 }

func (m *meter) CPUUsage() float64 { return math.Float64frombits(m.bits.Load()) }

// request is one admitted request.
type request struct {
	arrived int64
	en      flow.Entry
}

// completions is a min-heap of the busy workers' completion times.
type completions []completion

type completion struct {
	at  int64
	req request
}

func (c completions) Len() int           { return len(c) }
func (c completions) Less(i, j int) bool { return c[i].at < c[j].at }
func (c completions) Swap(i, j int)      { c[i], c[j] = c[j], c[i] }
func (c *completions) Push(x any)        { *c = append(*c, x.(completion)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// sample is the simulated meter's period.
const sample = int64(100 * time.Millisecond)

// Simulate runs cfg.
func Simulate(cfg Config) (Result, error) {
	rng := rand.New(rand.NewPCG(cfg.Seed, 1))
	service := float64(cfg.Service)
	capacity := float64(cfg.Workers) * float64(time.Second) / service
	start := int64(time.Hour) // engine time well past 0
	clock := stattest.NewClock(time.Duration(start))
	m := &meter{}
	var eng *flow.Engine
	if len(cfg.Rules) > 0 {
		var err error
		if eng, err = flow.New(flow.WithClock(clock), flow.WithCPU(m)); err != nil {
			return Result{}, err
		}
		if err := eng.LoadRules(cfg.Rules); err != nil {
			return Result{}, err
		}
	}
	warmEnd := start + int64(cfg.Warm)
	measureFrom := warmEnd + int64(cfg.Skip)
	end := warmEnd + int64(cfg.Run)
	nextArrival := func(now int64) int64 {
		rate := capacity / 2
		if now >= warmEnd {
			rate = capacity * cfg.Load
		}
		return now + int64(rng.ExpFloat64()/rate*float64(time.Second))
	}
	serviceTime := func() int64 {
		return int64(service * (1 + cfg.Jitter*(2*rng.Float64()-1)))
	}
	var (
		busy      completions
		queue     []request
		res       = Result{Capacity: capacity}
		latencies []int64
		done      int64
		// busyNs integrates busy workers over the current sample.
		busyNs     int64
		lastChange = start
		nextSample = start + sample
	)
	account := func(now int64) {
		busyNs += int64(len(busy)) * (now - lastChange)
		lastChange = now
	}
	begin := func(now int64, r request) {
		heap.Push(&busy, completion{at: now + serviceTime(), req: r})
	}
	arrival := nextArrival(start)
	for {
		now := min(arrival, nextSample)
		if len(busy) > 0 {
			now = min(now, busy[0].at)
		}
		if now >= end {
			break
		}
		clock.Set(time.Duration(now))
		account(now)
		switch {
		case len(busy) > 0 && busy[0].at == now:
			c := heap.Pop(&busy).(completion)
			c.req.en.Exit(nil)
			if c.req.arrived >= measureFrom {
				latencies = append(latencies, now-c.req.arrived)
			}
			if now >= measureFrom {
				done++
			}
			if len(queue) > 0 {
				begin(now, queue[0])
				queue = queue[1:]
			}
		case now == nextSample:
			m.bits.Store(math.Float64bits(float64(busyNs) / float64(int64(cfg.Workers)*sample)))
			busyNs, nextSample = 0, now+sample
		default: // an arrival
			arrival = nextArrival(now)
			measured := now >= measureFrom
			if measured {
				res.Arrived++
			}
			r := request{arrived: now}
			if eng != nil {
				en, err := eng.Entry("inbound")
				if err != nil {
					if measured {
						res.Shed++
					}
					continue
				}
				r.en = en
			}
			if len(busy) < cfg.Workers {
				begin(now, r)
			} else {
				queue = append(queue, r)
				res.MaxQueue = max(res.MaxQueue, len(queue))
			}
		}
	}
	for _, r := range queue { // still waiting: their wait so far
		if r.arrived >= measureFrom {
			latencies = append(latencies, end-r.arrived)
		}
	}
	for _, c := range busy {
		if c.req.arrived >= measureFrom {
			latencies = append(latencies, end-c.req.arrived)
		}
	}
	res.Goodput = float64(done) * float64(time.Second) / float64(end-measureFrom)
	slices.Sort(latencies)
	if n := len(latencies); n > 0 {
		res.P50 = time.Duration(latencies[n/2])
		res.P99 = time.Duration(latencies[min(n-1, n*99/100)])
	}
	return res, nil
}
