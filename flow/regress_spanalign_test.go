package flow

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestRegressSpanExactWithThrottleHammer: a span-exact rule (12 per 500 ms)
// with a Throttle rule on the same resource, so every request that queues
// is aligned; goroutines advance the fake clock; no request is cut short
// and none asks to wait (only the Throttle's own MaxQueueing). Every
// continuous 500 ms span of the engine's stamps must hold 12.
func TestRegressSpanExactWithThrottleHammer(t *testing.T) {
	const threshold = 12
	for _, tc := range []struct {
		name  string
		extra []Rule
		wait  bool
		batch bool
	}{
		{"throttle", []Rule{{Resource: "api", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms}}, false, false},
		{"throttle-batch", []Rule{{Resource: "api", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms}}, false, true},
		{"throttle-wait", []Rule{{Resource: "api", Threshold: 30, Behavior: Throttle, MaxQueueing: 50 * ms}}, true, false},
		{"gcra-wait", []Rule{{Resource: "api", Threshold: 30, Behavior: GCRA, Burst: 3}}, true, false},
		{"plain-wait", []Rule{{Resource: "api", Threshold: 24}}, true, false},
		{"plain", []Rule{{Resource: "api", Threshold: 24}}, false, false},
		{"plain-batch", []Rule{{Resource: "api", Threshold: 24}}, false, true},
	} {
		for _, g := range []int{1, 4, 32} {
			t.Run(fmt.Sprintf("%s/goroutines=%d", tc.name, g), func(t *testing.T) {
				e, clock, _ := waitEngine(t)
				load(t, e, append([]Rule{{Resource: "api", Threshold: 2 * threshold, SpanExact: true, StatInterval: 500 * ms}}, tc.extra...)...)
				var mu sync.Mutex
				var st []stamp
				var wg sync.WaitGroup
				for i := range g {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rand.New(rand.NewPCG(uint64(i), 11))
						for range 6000 / g {
							clock.Advance(time.Duration(r.Int64N(int64(3 * ms))))
							var opts []EntryOption
							if tc.wait && r.IntN(2) == 0 {
								opts = append(opts, WithWait(time.Duration(r.Int64N(int64(time.Second)))))
							}
							n := 1
							if tc.batch {
								n = 1 + r.IntN(4)
								opts = append(opts, WithCount(n))
							}
							en, err := e.Entry("api", opts...)
							if err == nil {
								mu.Lock()
								st = append(st, stamp{en.Start(), int64(n)})
								mu.Unlock()
								en.Exit(nil)
							}
						}
					}()
				}
				wg.Wait()
				assert.LessOrEqual(t, mostInSpan(st, int64(500*ms)), int64(threshold))
			})
		}
	}
}
