package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRegressSpanExactWaitHammer: span-exact windows of 1, 2 and 10 buckets,
// alone and with a Throttle rule (align), plain entries, batches and waits
// cut short at every point of the wait, on a fake clock the waits move.
func TestRegressSpanExactWaitHammer(t *testing.T) {
	const threshold = 12
	for _, k := range []int{1, 2, 10} {
		for _, cut := range []float64{-1, 0, 0.5, 1, 1.5, 3} {
			t.Run(fmt.Sprintf("buckets=%d/cut=%v", k, cut), func(t *testing.T) {
				e, clock, s := waitEngine(t, WithSpanBuckets(k))
				var rmu sync.Mutex
				rng := rand.New(rand.NewPCG(uint64(k), 9))
				s.cancel = func() bool {
					rmu.Lock()
					defer rmu.Unlock()
					return cut >= 0 && rng.IntN(3) == 0
				}
				s.cutAt = cut
				load(t, e,
					Rule{Resource: "span", Threshold: 2 * threshold, SpanExact: true, StatInterval: 500 * ms},
					Rule{Resource: "combo", Threshold: 2 * threshold, SpanExact: true, StatInterval: 500 * ms},
					Rule{Resource: "combo", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms},
					Rule{Resource: "combo", Threshold: threshold * 2},
				)
				res := []string{"span", "combo"}
				var mu sync.Mutex
				stamps := map[string][]stamp{}
				var wg sync.WaitGroup
				for i := range 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(i), 11))
						for j := range 300 {
							name := res[j%2]
							clock.Advance(time.Duration(r.Int64N(int64(3 * ms))))
							n := 1 + r.IntN(4)
							var opts []EntryOption
							opts = append(opts, WithCount(n))
							if r.IntN(2) == 0 {
								opts = append(opts, WithWait(time.Duration(r.Int64N(int64(time.Second)))))
							}
							en, err := e.Entry(name, opts...)
							if err == nil {
								mu.Lock()
								stamps[name] = append(stamps[name], stamp{en.Start(), int64(n)})
								mu.Unlock()
								en.Exit(nil)
							} else if !errors.Is(err, context.Canceled) && !errors.As(err, new(*BlockError)) {
								t.Errorf("unexpected error: %v", err)
								return
							}
						}
					}()
				}
				wg.Wait()
				for name, st := range stamps {
					assert.LessOrEqual(t, mostInSpan(st, int64(500*ms)), int64(threshold), name)
				}
				// Nothing stranded.
				s.cancel = nil
				clock.Advance(5 * time.Second)
				got := 0
				for {
					en, err := e.Entry("span")
					if err != nil {
						break
					}
					en.Exit(nil)
					got++
				}
				assert.Equal(t, threshold, got)
			})
		}
	}
}
