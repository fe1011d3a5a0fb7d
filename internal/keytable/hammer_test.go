package keytable

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestHammerNeverAdmitsOverTheLimitInAnyWindow: goroutines on few keys
// (no eviction) and on more keys than a small table holds (evictions while
// counting; as many keys as the table remembers when evicted), on a clock
// they move on as they go: no key holds more than its limit in any window
// of Buckets buckets, counted where Admit says. The third case's table
// has sets enough for keys to move to their other set as others arrive
// (see relocate).
func TestHammerNeverAdmitsOverTheLimitInAnyWindow(t *testing.T) {
	for _, c := range []struct{ keys, maxKeys, step int }{{4, 16, 20}, {40, 8, 4}, {300, 256, 1}} {
		t.Run(fmt.Sprintf("keys=%d/maxKeys=%d", c.keys, c.maxKeys), func(t *testing.T) {
			const goroutines, limit = 8, 3
			ops := 3000
			if testing.Short() {
				ops = 500
			}
			var clock atomic.Int64
			tbl := New(Config{Kind: Window, MaxKeys: c.maxKeys, Window: testBucket * Buckets, Now: clock.Load})
			var mu sync.Mutex
			admitted := make([]map[int64]int64, c.keys) // by key, by bucket
			for k := range admitted {
				admitted[k] = map[int64]int64{}
			}
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					for range ops {
						now := clock.Add(rng.Int64N(int64(c.step)))
						k := rng.IntN(c.keys)
						for {
							b, _, ok, dead := admitKey(tbl, fmt.Sprint("key-", k), now, 1, limit)
							if dead {
								continue // evicted as it counted: look again
							}
							if ok {
								mu.Lock()
								admitted[k][b]++
								mu.Unlock()
							}
							break
						}
					}
				})
			}
			wg.Wait()
			total := int64(0)
			for k, per := range admitted {
				for b := range per {
					var n int64
					for j := range int64(Buckets) {
						n += per[b+j]
					}
					assert.LessOrEqual(t, n, int64(limit), "key %d in buckets %d..%d", k, b, b+Buckets-1)
					total += per[b]
				}
			}
			assert.Positive(t, total)
			assert.LessOrEqual(t, tbl.Len(), int64(tbl.Capacity()))
		})
	}
}

// TestHammerNeverHoldsOverTheLimitInFlight: goroutines acquire and
// release on few keys and on many keys through a small table (keys
// evicted while in flight): no key ever has more than its limit in flight,
// and none stays pinned once all released.
func TestHammerNeverHoldsOverTheLimitInFlight(t *testing.T) {
	for _, c := range []struct{ keys, maxKeys int }{{4, 16}, {64, 4}} {
		t.Run(fmt.Sprintf("keys=%d/maxKeys=%d", c.keys, c.maxKeys), func(t *testing.T) {
			const goroutines, limit = 8, 2
			ops := 3000
			if testing.Short() {
				ops = 500
			}
			tbl := newConcTable(c.maxKeys)
			inFlight := make([]atomic.Int64, c.keys)
			var worst atomic.Int64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 2))
					for range ops {
						k := rng.IntN(c.keys)
						var st *State
						var stL Life
						ok, dead := false, true
						for dead {
							st, stL = tbl.Get(fmt.Sprint("key-", k))
							_, ok, dead = tbl.Acquire(st, stL, 1, limit)
						}
						if !ok {
							continue
						}
						if n := inFlight[k].Add(1); n > worst.Load() {
							worst.Store(n)
						}
						inFlight[k].Add(-1)
						tbl.Release(st, 1)
					}
				})
			}
			wg.Wait()
			assert.LessOrEqual(t, worst.Load(), int64(limit))
			assert.Empty(t, tbl.Pinned())
			tbl.Each(func(st *State) { assert.Zero(t, st.InFlight()) })
		})
	}
}
