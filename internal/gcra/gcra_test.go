package gcra

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"go.uber.org/atomic"
)

const ms = int64(1e6)

// step is one Take at a plain instant and what it must return.
type step struct {
	now, n, maxWait int64
	ok              bool
	wait, tok       int64 // when ok
	retry, reset    int64 // when refused
}

// run takes every step in order on l and checks each result.
func run(t *testing.T, l *Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		wait, tok, ok, retry, reset := l.Take(s.now, s.n, s.maxWait)
		if ok != s.ok {
			t.Fatalf("step %d: Take(now %d, n %d, maxWait %d) ok = %v want %v", i, s.now, s.n, s.maxWait, ok, s.ok)
		}
		got := [4]int64{wait, tok, retry, reset}
		want := [4]int64{s.wait, s.tok, s.retry, s.reset}
		if got != want {
			t.Errorf("step %d: Take(now %d, n %d, maxWait %d) (wait, tok, retry, reset) = %v want %v", i, s.now, s.n, s.maxWait, got, want)
		}
	}
}

// TestBurstThenOneTokenPerInterval: a full bucket hands out burst tokens
// at once, then one per interval; a refusal says when the tokens would be
// there and when the bucket is full again.
func TestBurstThenOneTokenPerInterval(t *testing.T) {
	var c Cell
	l := New(&c, 10, 3) // 100 ms a token, 300 ms of tolerance
	run(t, &l, []step{
		{now: 1000 * ms, n: 1, ok: true, tok: 1100 * ms},
		{now: 1000 * ms, n: 1, ok: true, tok: 1200 * ms},
		{now: 1000 * ms, n: 1, ok: true, tok: 1300 * ms},
		{now: 1000 * ms, n: 1, retry: 100 * ms, reset: 300 * ms},
		{now: 1099 * ms, n: 1, retry: 1 * ms, reset: 201 * ms},
		{now: 1100 * ms, n: 1, ok: true, tok: 1400 * ms},
		{now: 1100 * ms, n: 1, retry: 100 * ms, reset: 300 * ms},
		{now: 2000 * ms, n: 3, ok: true, tok: 2300 * ms}, // refilled
	})
}

// TestWaitWithinMaxWait: an empty bucket admits a request that can wait
// for its tokens, tells it how long, and queues the next one behind it.
func TestWaitWithinMaxWait(t *testing.T) {
	var c Cell
	l := New(&c, 10, 1)
	run(t, &l, []step{
		{now: 1000 * ms, n: 1, ok: true, tok: 1100 * ms},
		{now: 1000 * ms, n: 1, maxWait: 99 * ms, retry: 100 * ms, reset: 100 * ms},
		{now: 1000 * ms, n: 1, maxWait: 100 * ms, ok: true, wait: 100 * ms, tok: 1200 * ms},
		{now: 1000 * ms, n: 1, maxWait: 150 * ms, retry: 200 * ms, reset: 200 * ms},
		{now: 1000 * ms, n: 1, maxWait: 250 * ms, ok: true, wait: 200 * ms, tok: 1300 * ms},
		{now: 1050 * ms, n: 1, maxWait: 250 * ms, ok: true, wait: 250 * ms, tok: 1400 * ms},
	})
}

// TestANewLimiterKeepsTheCell: a limiter made over a cell another
// limiter emptied (a reload that keeps the rule) starts from its arrival
// time, not from a full bucket.
func TestANewLimiterKeepsTheCell(t *testing.T) {
	var c Cell
	l := New(&c, 10, 3)
	run(t, &l, []step{{now: 1000 * ms, n: 3, ok: true, tok: 1300 * ms}})
	l = New(&c, 20, 3) // 50 ms a token, 150 ms of tolerance
	run(t, &l, []step{
		{now: 1000 * ms, n: 1, retry: 200 * ms, reset: 300 * ms},
		{now: 1200 * ms, n: 1, ok: true, tok: 1350 * ms},
	})
}

// TestMoreThanBurstNeverPasses: a batch larger than the bucket is refused
// whatever the wait, and told never (-1).
func TestMoreThanBurstNeverPasses(t *testing.T) {
	var c Cell
	l := New(&c, 10, 3)
	run(t, &l, []step{
		{now: 5000 * ms, n: 4, maxWait: 1 << 40, retry: -1, reset: -1},
		{now: 5000 * ms, n: 3, ok: true, tok: 5300 * ms},
	})
}

// TestOffRefusesEverything: a rate of 0 refuses even a full bucket's
// first token, and never tells a time.
func TestOffRefusesEverything(t *testing.T) {
	var c Cell
	l := New(&c, 0, 5)
	run(t, &l, []step{
		{now: 0, n: 1, retry: -1, reset: -1},
		{now: 1 << 50, n: 1, maxWait: 1 << 40, retry: -1, reset: -1},
	})
}

// TestATokenCostsAtLeastOneNanosecond: rates past 1e9/s round to whole
// nanoseconds, never to a free token.
func TestATokenCostsAtLeastOneNanosecond(t *testing.T) {
	for _, rate := range []float64{1e9, 2e9, 1e12, 1e15} {
		var c Cell
		l := New(&c, rate, 1)
		run(t, &l, []step{
			{now: 7, n: 1, ok: true, tok: 8},
			{now: 7, n: 1, retry: 1, reset: 1},
		})
	}
	var c Cell
	l := New(&c, 3, 1) // 333333333.3 ns: rounded
	run(t, &l, []step{{now: 0, n: 1, ok: true, tok: 333333333}})
}

// TestTimeGoingBackwardsHandsOutNoMore: a now behind the arrival time
// only pushes the next token further away.
func TestTimeGoingBackwardsHandsOutNoMore(t *testing.T) {
	var c Cell
	l := New(&c, 10, 2)
	run(t, &l, []step{
		{now: 1000 * ms, n: 2, ok: true, tok: 1200 * ms},
		{now: 900 * ms, n: 1, retry: 200 * ms, reset: 300 * ms},
		{now: 1000 * ms, n: 1, retry: 100 * ms, reset: 200 * ms},
	})
}

// TestGiveOnlyWhileLatest: tokens given back return to the bucket while
// no later request took any; after one did, they stay spent, so no slot
// is handed out twice.
func TestGiveOnlyWhileLatest(t *testing.T) {
	var c Cell
	l := New(&c, 10, 2)
	const now = 1000 * ms
	_, a, ok, _, _ := l.Take(now, 1, 0)
	if !ok {
		t.Fatal("a full bucket refused its first token")
	}
	l.Give(1, a)
	if _, again, _, _, _ := l.Take(now, 1, 0); again != a {
		t.Fatalf("Take after Give: tok = %d want %d (the token given back)", again, a)
	}
	_, b, ok, _, _ := l.Take(now, 1, 0)
	if !ok {
		t.Fatal("the second token of a burst of 2 was refused")
	}
	l.Give(1, a) // b took after a: a stays spent
	if _, _, ok, retry, _ := l.Take(now, 1, 0); ok || retry != 100*ms {
		t.Fatalf("Take after a stale Give: ok = %v, retry = %d want false, %d", ok, retry, 100*ms)
	}
	l.Give(1, b) // b is the latest: back
	if _, again, ok, _, _ := l.Take(now, 1, 0); !ok || again != b {
		t.Fatalf("Take after Give of the latest: (tok, ok) = (%d, %v) want (%d, true)", again, ok, b)
	}
}

// TestHammerNeverHandsOutMoreThanBurstPlusRate: goroutines on a shared
// running clock; every span of the admission times holds at most
// burst + rate x span.
func TestHammerNeverHandsOutMoreThanBurstPlusRate(t *testing.T) {
	const burst, interval = 5, int64(1000) // 1e6 tokens a second
	var c Cell
	l := New(&c, 1e6, burst)
	var clock atomic.Int64
	goroutines, ops := 16, 4000
	if testing.Short() {
		goroutines, ops = 4, 1000
	}
	var mu sync.Mutex
	var times []int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			var mine []int64
			for range ops {
				now := clock.Add(rng.Int64N(interval / 8))
				if _, _, ok, _, _ := l.Take(now, 1, 0); ok {
					mine = append(mine, now)
				}
			}
			mu.Lock()
			times = append(times, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(times) == 0 {
		t.Fatal("nothing admitted")
	}
	slices.Sort(times)
	// For admissions i <= j: (j - i + 1) x interval - (t_j - t_i) <= burst x interval.
	minU, worst := int64(0), int64(0)
	for k, at := range times {
		u := int64(k)*interval - at
		if k == 0 || u < minU {
			minU = u
		}
		worst = max(worst, u-minU+interval)
	}
	if worst > burst*interval {
		t.Fatalf("%d admissions in %d ns: a span held %d ns of tokens, more than burst x interval = %d", len(times), clock.Load(), worst, burst*interval)
	}
	if limit := burst + clock.Load()/interval; int64(len(times)) > limit {
		t.Fatalf("%d admissions, more than burst + elapsed x rate = %d", len(times), limit)
	}
}

// TestTakeAndGiveAllocateNothing: the hot path is allocation-free.
func TestTakeAndGiveAllocateNothing(t *testing.T) {
	var c Cell
	l := New(&c, 1e6, 10)
	now := int64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += 500
		_, tok, ok, _, _ := l.Take(now, 1, 0)
		if ok && now%1000 == 0 {
			l.Give(1, tok)
		}
	})
	if allocs != 0 {
		t.Fatalf("Take and Give: %v allocations per run want 0", allocs)
	}
}

// BenchmarkTake is the take path, half admitted and half refused.
func BenchmarkTake(b *testing.B) {
	var c Cell
	l := New(&c, 1e6, 10) // 1000 ns a token
	now := int64(0)
	b.ReportAllocs()
	for b.Loop() {
		now += 500
		l.Take(now, 1, 0)
	}
}
