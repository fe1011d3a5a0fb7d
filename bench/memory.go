package main

import (
	"runtime"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/leapflow/leapflow/bench/baseline"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// memCase builds n limiters and returns them, to be kept alive while the
// heap is measured.
type memCase struct {
	name string
	note string
	make func(n int) any
}

var memCases = []memCase{
	{"leapflow", "a resource with a QPS rule, after one Entry+Exit (one bucket made)", func(n int) any {
		eng, res := leapflowEngine(n, stat.NewMonotonic(), 100)
		for _, r := range res {
			en, _ := eng.Entry(r)
			en.Exit(nil)
		}
		return eng
	}},
	{"leapflow-idle", "a resource with a QPS rule, never touched", func(n int) any {
		eng, _ := leapflowEngine(n, stat.NewMonotonic(), 100)
		return eng
	}},
	{"metric-window", "a 1 s window of 4 buckets, one bucket made", func(n int) any {
		ws := windows(n)
		for _, w := range ws {
			w.Add(0, metric.Pass, 1)
		}
		return ws
	}},
	{"x/time/rate", "one Limiter", func(n int) any {
		ls := make([]*rate.Limiter, n)
		for i := range ls {
			ls[i] = rate.NewLimiter(100, 100)
		}
		return ls
	}},
	{"uber/ratelimit", "one Limiter", func(n int) any {
		ls := make([]ratelimit.Limiter, n)
		for i := range ls {
			ls[i] = ratelimit.New(100)
		}
		return ls
	}},
	{"fixed-window", "one counter", func(n int) any {
		ls := make([]*baseline.FixedWindow, n)
		for i := range ls {
			ls[i] = baseline.NewFixedWindow(100, time.Second, nil)
		}
		return ls
	}},
	{"sliding-window", "10 slots", func(n int) any {
		ls := make([]*baseline.SlidingWindow, n)
		for i := range ls {
			ls[i] = baseline.NewSlidingWindow(100, time.Second, 10, nil)
		}
		return ls
	}},
	{"sliding-log", "empty log (each admission adds about 56 bytes)", func(n int) any {
		ls := make([]*baseline.SlidingLog, n)
		for i := range ls {
			ls[i] = baseline.NewSlidingLog(100, time.Second, nil)
		}
		return ls
	}},
}

// memResult is bytes per limiter.
type memResult struct {
	name  string
	note  string
	bytes float64
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func measureMemory(c memCase, n int) memResult {
	before := heap()
	keep := c.make(n)
	after := heap()
	runtime.KeepAlive(keep)
	return memResult{name: c.name, note: c.note, bytes: float64(int64(after)-int64(before)) / float64(n)}
}
