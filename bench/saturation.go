package main

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
)

// saturationResult is one run of the saturated-CPU case: busy goroutines
// outnumbering cores hammer one rule while another goroutine sleeps on a
// timer in a loop, as in every service.
type saturationResult struct {
	clock      string
	goroutines int
	duration   time.Duration // as run, from before the first busy goroutine started: the load can stretch it past what was asked
	startup    time.Duration // of which starting the goroutines took
	threshold  int64
	admitted   int64
	maxLag     time.Duration // the engine clock behind the monotonic clock, at worst
}

// saturation runs the case with the default clock and with the monotonic
// clock (the reference: it cannot fall behind).
func saturation(cfg config) []saturationResult {
	g, d := 1024, 3500*time.Millisecond
	if cfg.quick {
		g, d = 256, 500*time.Millisecond
	}
	return []saturationResult{
		saturate("default (coarse)", stat.DefaultClock(), g, d, cfg.threshold),
		saturate("monotonic", stat.NewMonotonic(), g, d, cfg.threshold),
	}
}

func saturate(name string, clock stat.Clock, g int, d time.Duration, threshold int64) saturationResult {
	eng, err := flow.New(flow.WithClock(clock))
	if err != nil {
		panic(err)
	}
	if err := eng.LoadRules([]flow.Rule{{Resource: "saturated", Threshold: float64(threshold)}}); err != nil {
		panic(err)
	}
	res, err := eng.Resource("saturated")
	if err != nil {
		panic(err)
	}
	var admitted atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	// The run, its admissions and the clock's lag start before the first
	// busy goroutine does: starting 1024 of them is part of the load.
	origin, start := clock.Now(), time.Now()
	for range g {
		wg.Go(func() {
			for !stop.Load() {
				if en, err := res.Entry(); err == nil {
					admitted.Add(1)
					en.Exit(nil)
				}
			}
		})
	}
	wg.Go(func() {
		for !stop.Load() {
			time.Sleep(5 * time.Millisecond)
		}
	})
	startup := time.Since(start)
	var maxLag time.Duration
	for time.Since(start) < d {
		time.Sleep(10 * time.Millisecond)
		lag := time.Since(start) - time.Duration(clock.Now()-origin)
		maxLag = max(maxLag, lag)
	}
	stop.Store(true)
	n, ran := admitted.Load(), time.Since(start)
	wg.Wait()
	return saturationResult{clock: name, goroutines: g, duration: ran, startup: startup, threshold: threshold, admitted: n, maxLag: maxLag}
}
