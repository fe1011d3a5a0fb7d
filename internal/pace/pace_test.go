package pace

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/atomic"
)

const ms = int64(time.Millisecond)

// step is one Reserve at a plain instant and what it must return.
type step struct {
	now, n, maxQueue int64
	ok               bool
	wait             int64 // refused: the wait it would have had
	slot             int64 // when ok
}

// run reserves every step in order on one pacer at rate and checks each
// result.
func run(t *testing.T, p *Pacer, rate float64, steps []step) {
	t.Helper()
	for i, s := range steps {
		h, wait, ok := p.Reserve(s.now, s.n, rate, s.maxQueue)
		if ok != s.ok || wait != s.wait || h.Slot != s.slot {
			t.Errorf("step %d: Reserve(now %d, n %d, rate %v, maxQueue %d) (ok, wait, slot) = (%v, %d, %d) want (%v, %d, %d)",
				i, s.now, s.n, rate, s.maxQueue, ok, wait, h.Slot, s.ok, s.wait, s.slot)
		}
	}
}

// TestSlotsSpacedOneOverRateApart: an idle pacer starts at now; the
// requests behind it wait n/rate each, up to the queue; a timeline whose
// head has passed restarts at now.
func TestSlotsSpacedOneOverRateApart(t *testing.T) {
	p := New()
	q := int64(500 * ms)
	run(t, p, 10, []step{ // 100 ms a request
		{now: 1000 * ms, n: 1, maxQueue: q, ok: true, slot: 1000 * ms},
		{now: 1000 * ms, n: 1, maxQueue: q, ok: true, wait: 100 * ms, slot: 1100 * ms},
		{now: 1000 * ms, n: 2, maxQueue: q, ok: true, wait: 300 * ms, slot: 1300 * ms},
		{now: 1000 * ms, n: 2, maxQueue: q, ok: true, wait: 500 * ms, slot: 1500 * ms},
		{now: 1000 * ms, n: 1, maxQueue: q, wait: 600 * ms}, // beyond the queue
		{now: 1000 * ms, n: 1, maxQueue: 600 * ms, ok: true, wait: 600 * ms, slot: 1600 * ms},
		{now: 1650 * ms, n: 1, maxQueue: 0, wait: 50 * ms},
		{now: 1700 * ms, n: 1, maxQueue: 0, ok: true, slot: 1700 * ms},
		// A request's cost is the gap before its slot: after an idle
		// spell a batch starts at once, and the next waits its own cost.
		{now: 5000 * ms, n: 3, maxQueue: 0, ok: true, slot: 5000 * ms},
		{now: 5000 * ms, n: 1, maxQueue: q, ok: true, wait: 100 * ms, slot: 5100 * ms},
	})
}

// TestCostRoundsUpSoTheRateIsNeverExceeded: a cost that is not a whole
// number of nanoseconds is rounded up.
func TestCostRoundsUpSoTheRateIsNeverExceeded(t *testing.T) {
	p := New()
	run(t, p, 3, []step{ // 333333333.3 ns a request
		{now: 0, n: 1, ok: true, slot: 0},
		{now: 0, n: 1, maxQueue: math.MaxInt64, ok: true, wait: 333333334, slot: 333333334},
	})
	h, _, _ := p.Reserve(2e9, 2, 3, 0)
	if h.Cost != 666666667 {
		t.Fatalf("Reserve(n 2, rate 3): Cost = %d want 666666667", h.Cost)
	}
}

// TestNoRateOrACostBeyondAnyQueueIsNeverAdmitted: rate 0 (or less), or a
// cost past maxCost, is refused with -1, whatever the queue.
func TestNoRateOrACostBeyondAnyQueueIsNeverAdmitted(t *testing.T) {
	for _, c := range []struct {
		n    int64
		rate float64
	}{{1, 0}, {1, -1}, {1, 1e-12}, {1 << 40, 1e-3}} {
		var head atomic.Int64
		head.Store(idle)
		h, wait, ok := Reserve(&head, math.MaxInt64, 0, c.n, c.rate)
		if ok || wait != -1 || h != (Held{}) {
			t.Errorf("Reserve(n %d, rate %v) = (%v, %d, %v) want ({0 0}, -1, false)", c.n, c.rate, h, wait, ok)
		}
	}
	// Just under the cap: admitted on an idle timeline, with no overflow.
	var head atomic.Int64
	head.Store(idle)
	rate := float64(time.Second) / float64(maxCost)
	if _, wait, ok := Reserve(&head, 0, 0, 1, rate); !ok || wait != 0 {
		t.Fatalf("Reserve of a cost of maxCost on an idle timeline = (%d, %v) want (0, true)", wait, ok)
	}
}

// TestGiveBackOnlyWhileLatest: an abandoned slot goes back while it is
// the head; once a request queued behind it, it stays spent, so no slot
// is handed out twice. The zero Held gives back nothing.
func TestGiveBackOnlyWhileLatest(t *testing.T) {
	p := New()
	q := int64(time.Second)
	p.Reserve(1000*ms, 1, 10, q)
	a, _, _ := p.Reserve(1000*ms, 1, 10, q) // slot 1100
	p.GiveBack(a)
	if b, wait, _ := p.Reserve(1000*ms, 1, 10, q); b.Slot != a.Slot || wait != 100*ms {
		t.Fatalf("after GiveBack: (slot, wait) = (%d, %d) want (%d, %d): the slot given back", b.Slot, wait, a.Slot, 100*ms)
	}
	c, _, _ := p.Reserve(1000*ms, 1, 10, q) // slot 1200, behind a's
	p.GiveBack(a)
	if d, _, _ := p.Reserve(1000*ms, 1, 10, q); d.Slot != c.Slot+100*ms {
		t.Fatalf("after a stale GiveBack: slot = %d want %d", d.Slot, c.Slot+100*ms)
	}
	p.GiveBack(Held{})
	if d, _, _ := p.Reserve(1000*ms, 1, 10, q); d.Slot != c.Slot+200*ms {
		t.Fatalf("after GiveBack of nothing: slot = %d want %d", d.Slot, c.Slot+200*ms)
	}
}

// TestHammerNeverGivesTwoSlotsWithinACost: goroutines on a shared
// running clock reserve and sometimes give back; the slots kept are at
// least a cost apart, each at or after its request's now and within the
// queue.
func TestHammerNeverGivesTwoSlotsWithinACost(t *testing.T) {
	const cost, queue = int64(1000), int64(20000) // 1e6 a second
	p := New()
	var clock atomic.Int64
	goroutines, ops := 16, 4000
	if testing.Short() {
		goroutines, ops = 4, 1000
	}
	var mu sync.Mutex
	var slots []int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 2))
			var mine []int64
			for range ops {
				now := clock.Add(rng.Int64N(cost / 4))
				h, wait, ok := p.Reserve(now, 1, 1e6, queue)
				if !ok {
					continue
				}
				if h.Slot < now || h.Slot-now != wait || wait > queue {
					t.Errorf("Reserve at %d: slot %d, wait %d (queue %d)", now, h.Slot, wait, queue)
				}
				if rng.IntN(4) == 0 {
					p.GiveBack(h)
					continue
				}
				mine = append(mine, h.Slot)
			}
			mu.Lock()
			slots = append(slots, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(slots) == 0 {
		t.Fatal("nothing admitted")
	}
	slices.Sort(slots)
	for i := 1; i < len(slots); i++ {
		if d := slots[i] - slots[i-1]; d < cost {
			t.Fatalf("slots %d and %d are %d ns apart, less than a cost (%d)", slots[i-1], slots[i], d, cost)
		}
	}
}

// TestReserveAndGiveBackAllocateNothing: the hot path is allocation-free.
func TestReserveAndGiveBackAllocateNothing(t *testing.T) {
	p := New()
	maxQueue := int64(time.Millisecond)
	now := int64(0)
	allocs := testing.AllocsPerRun(1000, func() {
		now += 500
		h, _, _ := p.Reserve(now, 1, 1e6, maxQueue)
		if now%1500 == 0 {
			p.GiveBack(h)
		}
	})
	if allocs != 0 {
		t.Fatalf("Reserve and GiveBack: %v allocations per run want 0", allocs)
	}
}

// BenchmarkReserve is the reserve path, requests twice as fast as the
// rate: half queue, until the queue is full and they are refused.
func BenchmarkReserve(b *testing.B) {
	p := New()
	maxQueue := int64(time.Millisecond)
	now := int64(0)
	b.ReportAllocs()
	for b.Loop() {
		now += 500
		p.Reserve(now, 1, 1e6, maxQueue)
	}
}
