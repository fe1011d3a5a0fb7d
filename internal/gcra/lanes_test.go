package gcra

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// laneBurst is a burst whose lanes lease runs of at least a few tokens on
// this machine (an eighth of the burst is shared by cpu.Stripes lanes).
func laneBurst() int64 { return int64(8*cpu.Stripes()) * 24 }

// requireLanes fails the test unless l leases runs of at least four
// tokens: a test of lanes that never used them would pass vacuously.
func requireLanes(t *testing.T, l *Limiter) {
	t.Helper()
	if l.run < 4*l.interval {
		t.Fatalf("lanes lease %d ns (%d-ns tokens): too short to test", l.run, l.interval)
	}
}

// TestLanesTakeWhatTheCellTakes: requests one at a time on one P, through
// its lane, get exactly what the cell alone gives (which is x/time/rate's:
// TestGCRAMatchesXTimeRate in flow), refused or admitted, waits, tokens
// and retry times, across gives, a clock that steps back, and rate
// changes; Left agrees too.
func TestLanesTakeWhatTheCellTakes(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 11))
		burst := laneBurst()
		rate := []float64{1e6, 4e6, 2.5e5}[seed%3]
		var laned, plain Cell
		l, want := New(&laned, rate, burst), New(&plain, rate, burst)
		requireLanes(t, &l)
		p := rng.IntN(64)
		now := int64(1e9)
		for i := range 3000 {
			switch r := rng.IntN(100); {
			case r < 3:
				now -= rng.Int64N(5000) // a clock read earlier
			case r < 4:
				now += rng.Int64N(int64(1e9)) // idle
			default:
				now += rng.Int64N(2 * l.interval)
			}
			n := 1 + rng.Int64N(3)
			if rng.IntN(20) == 0 {
				n = 1 + rng.Int64N(burst+2)
			}
			var maxWait int64
			if rng.IntN(10) == 0 {
				maxWait = rng.Int64N(burst * l.interval)
			}
			if rng.IntN(500) == 0 {
				next := rate * (0.5 + rng.Float64())
				laned.Rescale(now, rate/next)
				plain.Rescale(now, rate/next)
				rate = next
				l, want = New(&laned, rate, burst), New(&plain, rate, burst)
			}
			w1, tok1, ok1, r1, s1 := l.TakeOn(p, now, n, maxWait)
			w2, tok2, ok2, r2, s2 := want.Take(now, n, maxWait)
			if got, exp := [5]int64{w1, tok1, b2i(ok1), r1, s1}, [5]int64{w2, tok2, b2i(ok2), r2, s2}; got != exp {
				t.Fatalf("seed %d step %d: TakeOn(p %d, now %d, n %d, maxWait %d) (wait, tok, ok, retry, reset) = %v, the cell alone %v",
					seed, i, p, now, n, maxWait, got, exp)
			}
			if ok1 && rng.IntN(8) == 0 {
				if g1, g2 := l.GiveOn(p, n, tok1), want.Give(n, tok2); g1 != g2 {
					t.Fatalf("seed %d step %d: GiveOn = %v, the cell alone %v", seed, i, g1, g2)
				}
			}
			lt1, lr1 := l.Left(now)
			lt2, lr2 := want.Left(now)
			if lt1 != lt2 || lr1 != lr2 {
				t.Fatalf("seed %d step %d: Left = (%d, %d), the cell alone (%d, %d)", seed, i, lt1, lr1, lt2, lr2)
			}
		}
	}
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// taken is an admission: at the caller's now, of n tokens.
type taken struct{ at, n int64 }

// worstSpan returns the most ns of tokens any span of admissions holds
// beyond its length: for admissions i..j in time order, the sum of their
// tokens x interval minus (t_j - t_i). The bound is burst x interval.
func worstSpan(ts []taken, interval int64) int64 {
	slices.SortFunc(ts, func(a, b taken) int { return int(a.at - b.at) })
	var sum, worst int64
	minBefore := int64(0) // min over i <= j of (tokens before i) x interval - t_i
	for k, x := range ts {
		if v := sum - x.at; k == 0 || v < minBefore {
			minBefore = v
		}
		sum += x.n * interval
		worst = max(worst, sum-x.at-minBefore)
	}
	return worst
}

// TestLanesKeepEverySpanWithinTheBound: requests on many Ps, in any
// order, with clocks read at different moments, gives and rate changes:
// every span of admissions holds at most burst + rate x span (checked
// by brute force over every pair too, on a short run).
func TestLanesKeepEverySpanWithinTheBound(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 12))
		burst := laneBurst()
		var c Cell
		l := New(&c, 1e6, burst)
		requireLanes(t, &l)
		var ts []taken
		toks := map[int64]int{} // tok -> index into ts, for gives
		now := int64(1e9)
		steps := 4000
		if seed == 0 {
			steps = 600 // brute force below
		}
		for range steps {
			now += rng.Int64N(l.interval)
			at := now - rng.Int64N(3*l.interval) // read a little earlier
			p, n := rng.IntN(8), 1+rng.Int64N(4)
			if _, tok, ok, _, _ := l.TakeOn(p, at, n, 0); ok {
				toks[tok] = len(ts)
				ts = append(ts, taken{at, n})
				if rng.IntN(6) == 0 && l.GiveOn(p, n, tok) {
					ts[len(ts)-1].n = 0
				}
			}
		}
		if len(ts) < steps/4 {
			t.Fatalf("seed %d: %d of %d admitted: the test does not reach the bound", seed, len(ts), steps)
		}
		if w := worstSpan(slices.Clone(ts), l.interval); w > l.tolerance {
			t.Fatalf("seed %d: a span held %d ns of tokens beyond its length, more than burst x interval = %d", seed, w, l.tolerance)
		}
		if seed == 0 {
			for i := range ts {
				for j := range ts {
					if ts[i].at > ts[j].at {
						continue
					}
					var sum int64
					for _, x := range ts {
						if x.at >= ts[i].at && x.at <= ts[j].at {
							sum += x.n
						}
					}
					if sum*l.interval > l.tolerance+ts[j].at-ts[i].at {
						t.Fatalf("span [%d, %d] holds %d tokens, more than burst %d + rate x span", ts[i].at, ts[j].at, sum, burst)
					}
				}
			}
		}
	}
}

// hammerLanes runs take on each of goroutines goroutines at once and
// checks the admissions they report against l's bound: every span of
// them holds at most burst + rate x span.
func hammerLanes(t *testing.T, l *Limiter, goroutines int, take func(g int) []taken) {
	t.Helper()
	var mu sync.Mutex
	var ts []taken
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			mine := take(g)
			mu.Lock()
			ts = append(ts, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(ts) == 0 {
		t.Fatal("nothing admitted")
	}
	if w := worstSpan(ts, l.interval); w > l.tolerance {
		t.Fatalf("%d admissions: a span held %d ns of tokens beyond its length, more than burst x interval = %d", len(ts), w, l.tolerance)
	}
}

// TestLanesUnderAHammer: goroutines on their own lanes and a running
// shared clock (run with -race): every span holds at most burst + rate x
// span, and the lanes took most requests.
func TestLanesUnderAHammer(t *testing.T) {
	burst := laneBurst()
	var c Cell
	l := New(&c, 1e6, burst)
	requireLanes(t, &l)
	var clock atomic.Int64
	clock.Store(1e9)
	hammerLanes(t, &l, 8, func(g int) []taken {
		rng := rand.New(rand.NewPCG(uint64(g), 13))
		var mine []taken
		for range 3000 {
			now := clock.Add(rng.Int64N(l.interval / 4))
			n := 1 + rng.Int64N(2)
			if _, tok, ok, _, _ := l.TakeOn(g, now, n, 0); ok {
				if rng.IntN(10) == 0 && l.GiveOn(g, n, tok) {
					continue
				}
				mine = append(mine, taken{now, n})
			}
		}
		return mine
	})
	var leased int
	for i := range c.lanes.Load().l {
		if c.lanes.Load().l[i].end.Load() != 0 {
			leased++
		}
	}
	if leased < 2 {
		t.Fatalf("%d lanes leased a run: the hammer did not spread", leased)
	}
}

// TestTakeOnAllocatesNothing: after the cell's lanes are made (once), the
// lane path allocates nothing.
func TestTakeOnAllocatesNothing(t *testing.T) {
	var c Cell
	l := New(&c, 1e6, laneBurst())
	requireLanes(t, &l)
	now := int64(0)
	p := 0
	allocs := testing.AllocsPerRun(1000, func() {
		now += 500
		p++
		_, tok, ok, _, _ := l.TakeOn(p, now, 1, 0)
		if ok && now%1000 == 0 {
			l.GiveOn(p, 1, tok)
		}
	})
	if allocs != 0 {
		t.Fatalf("TakeOn and GiveOn: %v allocations per run want 0", allocs)
	}
}
