package flow

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// Reservations that are only ever cancelled (each within a few ms of its
// reserved instant) leave passes in the resource's statistics under
// concurrency: a QPS window plus a GCRA rule (the align path).
func TestRegressCancelledReservationsCountAsPasses(t *testing.T) {
	sets := map[string][]Rule{
		"qps+gcra": {{Resource: "r", Threshold: 20}, {Resource: "r", Threshold: 10, Behavior: GCRA, Burst: 3}},
	}
	for name, rules := range sets {
		t.Run(name, func(t *testing.T) {
			bad := 0
			for round := range 10 {
				e, clock, _ := waitEngine(t)
				load(t, e, rules...)
				var wg sync.WaitGroup
				var mu sync.Mutex
				var maxGap int64
				for i := range 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(i), uint64(round)))
						for range 50 {
							clock.Advance(time.Duration(rng.Int64N(int64(5 * ms))))
							r, err := e.Reserve("r", WithWait(time.Duration(rng.Int64N(int64(3*time.Second)))))
							if err != nil {
								if !errors.As(err, new(*BlockError)) {
									t.Errorf("reserve: %v", err)
								}
								continue
							}
							t0 := clock.Now()
							d := r.Delay()
							r.Cancel()
							if gap := clock.Now() - t0 - int64(d); gap > 0 {
								mu.Lock()
								maxGap = max(maxGap, gap)
								mu.Unlock()
							}
						}
					}()
				}
				wg.Wait()
				clock.Advance(20 * time.Second)
				snap, _ := e.Snapshot("r")
				if snap.MinutePass != 0 || snap.Inflight != 0 {
					bad++
					t.Logf("round %d: nothing entered, yet MinutePass %d Inflight %d; most the clock passed a reservation's instant before its Cancel: %v", round, snap.MinutePass, snap.Inflight, time.Duration(maxGap))
				}
			}
			if bad > 0 {
				t.Errorf("%s: %d of 10 rounds count cancelled reservations as passes", name, bad)
			}
		})
	}
	_ = fmt.Sprint
}
