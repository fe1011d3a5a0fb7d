package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat"
)

// TestRegressSpanExactRealClockBusy: span-exact + plain rule, plain entries,
// WithWait entries (some cut short by their context), batches, on the real
// clock with the CPU oversubscribed; every continuous span of the stamps
// holds the threshold.
func TestRegressSpanExactRealClockBusy(t *testing.T) {
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
							en, err = e.Entry(res, WithPriority())
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
