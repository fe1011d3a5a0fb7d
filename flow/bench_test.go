package flow

import (
	"testing"
	"time"

	"github.com/leapflow/leapflow/internal/hammer"
	"github.com/leapflow/leapflow/stat"
)

func benchEngine(b *testing.B, clock stat.Clock) *Engine {
	e, err := New(WithClock(clock))
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]Rule{
		{Resource: "pass", Threshold: 1e12},
		{Resource: "block", Threshold: 10},
	}); err != nil {
		b.Fatal(err)
	}
	return e
}

func clocks(b *testing.B) map[string]stat.Clock {
	coarse := stat.NewCoarse(time.Millisecond)
	b.Cleanup(coarse.Stop)
	return map[string]stat.Clock{"monotonic": stat.NewMonotonic(), "coarse": coarse}
}

// BenchmarkEntryExit is the pass path: Entry, then Exit, under a QPS rule
// that never blocks.
func BenchmarkEntryExit(b *testing.B) {
	for name, clock := range clocks(b) {
		e := benchEngine(b, clock)
		b.Run("clock="+name, func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
				for range n {
					en, err := e.Entry("pass")
					if err != nil {
						panic(err)
					}
					en.Exit(nil)
				}
			})
		})
	}
}

// BenchmarkEntryBlocked is the block path: a full window.
func BenchmarkEntryBlocked(b *testing.B) {
	for name, clock := range clocks(b) {
		e := benchEngine(b, clock)
		for range 10 {
			_, _ = e.Entry("block")
		}
		b.Run("clock="+name, func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
				for range n {
					// The real clock frees 10 slots a second; take them.
					if en, err := e.Entry("block"); err == nil {
						en.Exit(nil)
					}
				}
			})
		})
	}
}

// BenchmarkClock is the cost of one clock read.
func BenchmarkClock(b *testing.B) {
	for name, clock := range clocks(b) {
		b.Run("clock="+name, func(b *testing.B) {
			var sink int64
			for b.Loop() {
				sink += clock.Now()
			}
			_ = sink
		})
	}
}

// BenchmarkResourceEntryExit is the pass path through a Resource handle.
func BenchmarkResourceEntryExit(b *testing.B) {
	for name, clock := range clocks(b) {
		e := benchEngine(b, clock)
		r, err := e.Resource("pass")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("clock="+name, func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
				for range n {
					en, err := r.Entry()
					if err != nil {
						panic(err)
					}
					en.Exit(nil)
				}
			})
		})
	}
}
