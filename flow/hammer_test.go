package flow

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat/stattest"
)

func goroutineCounts() []int {
	if testing.Short() {
		return []int{1, 8, 100}
	}
	return []int{1, 2, 8, 64, 1000}
}

// TestRejectNeverExceedsUnderHammer runs phases of G goroutines at a fixed
// instant each, the clock stepping a third of a bucket between phases, and
// checks every window of buckets against the threshold.
func TestRejectNeverExceedsUnderHammer(t *testing.T) {
	const threshold = 40
	for _, g := range goroutineCounts() {
		t.Run(fmt.Sprintf("goroutines=%d", g), func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock)
			load(t, e, Rule{Resource: "api", Threshold: threshold})
			bl := time.Second / 4
			perBucket := map[time.Duration]int64{}
			tries := max(1, 400/g)
			for phase := range 40 {
				now := time.Duration(phase) * bl / 3
				clock.Set(now)
				var admitted atomic.Int64
				var wg sync.WaitGroup
				for range g {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for k := range tries {
							n := 1 + k%3
							if en, err := e.Entry("api", WithCount(n)); err == nil {
								admitted.Add(int64(n))
								en.Exit(nil)
							}
						}
					}()
				}
				wg.Wait()
				perBucket[now-now%bl] += admitted.Load()
			}
			for end := range perBucket {
				var sum int64
				for s, c := range perBucket {
					if s <= end && end-s < time.Second {
						sum += c
					}
				}
				assert.LessOrEqual(t, sum, int64(threshold), "window ending at bucket %v", end)
			}
		})
	}
}

func TestConcurrencyNeverExceedsAndEveryExitReleases(t *testing.T) {
	const limit = 7
	for _, g := range goroutineCounts() {
		t.Run(fmt.Sprintf("goroutines=%d", g), func(t *testing.T) {
			e, _ := newEngine(t, stattest.NewClock(0))
			load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: limit})
			var inside, worst, admitted atomic.Int64
			// wrong[i] is the first error of goroutine i that is not a
			// block, checked on the test goroutine once they end.
			wrong := make([]error, g)
			var wg sync.WaitGroup
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := range max(5, 2000/g) {
						en, err := e.Entry("api")
						if err != nil {
							if !errors.Is(err, ErrBlocked) && wrong[i] == nil {
								wrong[i] = err
							}
							continue
						}
						admitted.Inc()
						raiseTo(&worst, inside.Inc())
						runtime.Gosched() // hold the admission while others try
						inside.Dec()
						// Every way out: success, failure, twice.
						switch (i + k) % 3 {
						case 0:
							en.Exit(nil)
						case 1:
							en.Exit(errors.New("failed"))
						default:
							en.Exit(nil)
							en.Exit(nil)
						}
					}
				}()
			}
			wg.Wait()
			require.NoError(t, errors.Join(wrong...), "Entry fails only with ErrBlocked")
			assert.LessOrEqual(t, worst.Load(), int64(limit))
			assert.Positive(t, admitted.Load())
			n := e.registry.Lookup("api")
			assert.Zero(t, n.Concurrency(), "every slot released")
			assert.Zero(t, n.Inflight())
		})
	}
}

// TestReloadUnderLoad swaps between two rule sets while requests run; no
// window may exceed the larger threshold and concurrency never exceeds the
// larger limit.
func TestReloadUnderLoad(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	setA := []Rule{{Resource: "api", Threshold: 20}, {Resource: "api", Metric: Concurrency, Threshold: 3}}
	setB := []Rule{{Resource: "api", Threshold: 30}, {Resource: "api", Metric: Concurrency, Threshold: 5}}
	load(t, e, setA...)
	stop := make(chan struct{})
	var reloads sync.WaitGroup
	var reloadErr error // the first LoadRules error, read after reloads.Wait
	var swaps int
	reloads.Add(1)
	go func() {
		defer reloads.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			rules := setA
			if i%2 == 1 {
				rules = setB
			}
			if err := e.LoadRules(rules); err != nil {
				reloadErr = err
				return
			}
			swaps++
		}
	}()
	var inside, worst, admitted atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 300 {
				en, err := e.Entry("api")
				if err != nil {
					continue
				}
				admitted.Inc()
				raiseTo(&worst, inside.Inc())
				runtime.Gosched() // hold the admission while others try
				inside.Dec()
				en.Exit(nil)
			}
		}()
	}
	wg.Wait()
	close(stop)
	reloads.Wait()
	require.NoError(t, reloadErr)
	t.Logf("%d rule swaps during the load", swaps)
	assert.LessOrEqual(t, admitted.Load(), int64(30), "one instant: one window")
	assert.LessOrEqual(t, worst.Load(), int64(5))
	assert.Zero(t, e.registry.Lookup("api").Concurrency())
}

func TestHotPathsAllocateNothing(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "pass", Threshold: 1e12},
		Rule{Resource: "block", Threshold: 0},
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 1e9},
	)
	for name, fn := range map[string]func(){
		"pass": func() {
			en, err := e.Entry("pass")
			if err != nil {
				panic(err)
			}
			en.Exit(nil)
		},
		"pass-batch": func() {
			en, _ := e.Entry("pass", WithCount(3), WithWait(500*time.Millisecond))
			en.Exit(nil)
		},
		"block": func() {
			if _, err := e.Entry("block"); err == nil {
				panic("passed")
			}
		},
		"concurrency": func() {
			en, _ := e.Entry("conc")
			en.Exit(nil)
		},
		"no-rule": func() {
			en, _ := e.Entry("free")
			en.Exit(nil)
		},
	} {
		fn()
		assert.Zero(t, testing.AllocsPerRun(1000, fn), name)
	}
}

// raiseTo raises m to v if v is larger.
func raiseTo(m *atomic.Int64, v int64) {
	for {
		cur := m.Load()
		if v <= cur || m.CompareAndSwap(cur, v) {
			return
		}
	}
}
