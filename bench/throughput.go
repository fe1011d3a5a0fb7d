package main

import (
	"runtime"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// result is one cell of the throughput table.
type result struct {
	impl       string
	resources  int
	goroutines int
	nsPerOp    float64 // wall time over operations: for the whole machine
	allocs     float64 // per operation
	ops        int64
}

// mops returns millions of operations per second.
func (r result) mops() float64 {
	if r.nsPerOp == 0 {
		return 0
	}
	return 1e3 / r.nsPerOp
}

// measure runs o from g goroutines for d and returns the cost per
// operation for the whole machine.
func measure(o op, g int, d time.Duration) (nsPerOp, allocs float64, ops int64) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var stop atomic.Bool
	var total atomic.Int64
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for id := range g {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			i := 0
			for ; ; i++ {
				// Check the flag every 64 calls: one shared load, rarely.
				if i&63 == 0 && stop.Load() {
					break
				}
				o(id, i)
			}
			total.Add(int64(i))
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	time.Sleep(d)
	stop.Store(true)
	done.Wait()
	elapsed := time.Since(t0)
	runtime.ReadMemStats(&after)
	ops = total.Load()
	if ops == 0 {
		return 0, 0, 0
	}
	return float64(elapsed) / float64(ops), float64(after.Mallocs-before.Mallocs) / float64(ops), ops
}
