package metric

import (
	"fmt"
	"testing"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/hammer"
)

// BenchmarkAdd compares a striped Add with an unstriped one and with the
// physical floors: one shared atomic add, and one add on a per-P padded line.
func BenchmarkAdd(b *testing.B) {
	now := int64(time.Second) + 1
	for _, tc := range []struct {
		name    string
		stripes int
	}{{"striped", cpu.Stripes()}, {"unstriped", 1}} {
		w := newWindow(b, 2, time.Second, WithStripes(tc.stripes))
		w.Add(now, Success, 1)
		b.Run("impl="+tc.name, func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
				for range n {
					w.Add(now, Success, 1)
				}
			})
		})
	}
	var shared atomic.Int64
	b.Run("impl=floor-shared-atomic", func(b *testing.B) {
		hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
			for range n {
				shared.Inc()
			}
		})
	})
	stripes := make([]paddedCounter, cpu.MaxStripes)
	b.Run("impl=floor-striped-atomic", func(b *testing.B) {
		hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
			for range n {
				stripes[cpu.Pin()&(cpu.MaxStripes-1)].v.Inc()
			}
		})
	})
}

// BenchmarkComplete is Exit's write: Success, RT and min RT in one visit.
func BenchmarkComplete(b *testing.B) {
	w := newWindow(b, 2, time.Second)
	hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
		for range n {
			w.Complete(1, 1, 1000, false)
		}
	})
}

// BenchmarkSum reads Pass over a 1 s window, single-threaded.
func BenchmarkSum(b *testing.B) {
	for _, n := range []int{2, 5, 10} {
		sumBench(b, n, cpu.Stripes(), "")
	}
	// The layout of a 16-core machine, whatever this one has.
	sumBench(b, 10, 16, "/stripes=16")
}

func sumBench(b *testing.B, n, stripes int, suffix string) {
	{
		w := newWindow(b, n, time.Second, WithStripes(stripes))
		bl := int64(time.Second) / int64(n)
		for i := range int64(n) {
			w.Add(i*bl, Pass, 1)
			w.Add(i*bl, Success, 1)
		}
		now := int64(time.Second) - 1
		for _, e := range []Event{Pass, Success} {
			b.Run(fmt.Sprintf("buckets=%d/event=%v%s", n, e, suffix), func(b *testing.B) {
				b.ReportAllocs()
				var sink int64
				for b.Loop() {
					sink += w.Sum(now, e)
				}
				if sink == 0 {
					b.Fatal("no sum")
				}
			})
		}
	}
}

// BenchmarkReserve measures admission on the pass path (threshold never
// reached) and the block path (window full).
func BenchmarkReserve(b *testing.B) {
	now := int64(time.Second) + 1
	pass := newWindow(b, 2, time.Second)
	b.Run("path=pass", func(b *testing.B) {
		hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
			for range n {
				pass.Reserve(now, 1, 1<<62)
			}
		})
	})
	block := newWindow(b, 2, time.Second)
	block.Reserve(now, 10, 10)
	b.Run("path=block", func(b *testing.B) {
		hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
			for range n {
				block.Reserve(now, 1, 10)
			}
		})
	})
}

// paddedCounter is a counter alone on its cache line, the striped floor.
type paddedCounter struct {
	v atomic.Int64
	_ [cpu.CacheLine - 8]byte
}

func newWindow(tb testing.TB, n int, interval time.Duration, opts ...Option) *Window {
	tb.Helper()
	w, err := NewWindow(n, interval, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return w
}
