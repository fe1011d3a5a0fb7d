package window

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

const ms = int64(time.Millisecond)

func newWindow(t testing.TB, n int, interval time.Duration, opts ...Option) *Window {
	t.Helper()
	w, err := NewWindow(n, interval, opts...)
	require.NoError(t, err)
	return w
}

func TestPadding(t *testing.T) {
	assert.Equal(t, uintptr(cpu.CacheLine), unsafe.Sizeof(stripe{}))
	var b bucket
	readMostlyEnd := unsafe.Offsetof(b.minRT) + unsafe.Sizeof(b.minRT)
	assert.LessOrEqual(t, readMostlyEnd, uintptr(cpu.CacheLine), "the header with min RT fits one line")
	assert.GreaterOrEqual(t, unsafe.Offsetof(b.granted)-readMostlyEnd, uintptr(cpu.CacheLine),
		"granted must not share a line with the read-mostly header")
	assert.GreaterOrEqual(t, unsafe.Offsetof(b.maxConc)-unsafe.Offsetof(b.granted), uintptr(cpu.CacheLine),
		"maxConc must not share a line with granted")
	assert.GreaterOrEqual(t, unsafe.Sizeof(b)-unsafe.Offsetof(b.maxConc), uintptr(cpu.CacheLine-8))
	assert.Less(t, unsafe.Offsetof(b.frozen)-unsafe.Offsetof(b.maxConc), uintptr(cpu.CacheLine),
		"a frozen read touches one line past the header")
}

func TestNewWindowErrors(t *testing.T) {
	_, err := NewWindow(3, time.Microsecond)
	assert.ErrorContains(t, err, "metric: leaparray: interval 1µs does not divide into 3 equal buckets")
	_, err = NewWindow(2, time.Second, WithStripes(0))
	assert.ErrorContains(t, err, "stripes must be >= 1, got 0")
}

func TestEventsAndReads(t *testing.T) {
	w := newWindow(t, 4, time.Second) // 250ms buckets
	r, ok := w.MinRT(0)
	assert.False(t, ok, "empty window has no min RT")
	assert.Zero(t, r)
	assert.Zero(t, w.AvgRT(0), "empty window: average RT is 0, not NaN")
	assert.Zero(t, w.Rate(0, Pass))

	w.Add(10*ms, Pass, 3)
	w.Add(260*ms, Pass, 2)
	w.Add(260*ms, Block, 4)
	w.Complete(270*ms, 2, 30*ms, false)
	w.Complete(600*ms, 1, 5*ms, true)
	w.updateConcurrency(600*ms, 7)
	w.updateConcurrency(610*ms, 3)
	w.Add(610*ms, OccupiedPass, 1)

	now := 700 * ms
	assert.Equal(t, int64(5), w.Sum(now, Pass))
	assert.Equal(t, int64(4), w.Sum(now, Block))
	assert.Equal(t, int64(3), w.Sum(now, Success))
	assert.Equal(t, int64(1), w.Sum(now, Exception))
	assert.Equal(t, 35*ms, w.Sum(now, RT))
	assert.Equal(t, int64(1), w.Sum(now, OccupiedPass))
	assert.InDelta(t, 5.0, w.Rate(now, Pass), 1e-9)
	assert.InDelta(t, float64(35*ms)/3, w.AvgRT(now), 1e-6)
	r, ok = w.MinRT(now)
	assert.True(t, ok)
	assert.Equal(t, 5*ms, r)
	assert.Equal(t, int64(7), w.MaxConcurrency(now))
	assert.InDelta(t, 8.0, w.MaxRate(now, Success), 1e-9, "2 successes in one 250ms bucket")
	assert.Equal(t, int64(2), w.previous(now, Success), "the 250ms bucket")
	assert.Equal(t, int64(0), w.previous(1100*ms, Success), "the 750ms bucket is empty")

	// 1s later the first bucket is stale (half-open), the rest remain.
	assert.Equal(t, int64(2), w.Sum(1000*ms, Pass))
	assert.Equal(t, int64(5), w.Sum(999*ms, Pass))
	assert.Equal(t, "exception", Exception.String())
	assert.Equal(t, "Event(9)", Event(9).String())
	assert.Len(t, Events(), int(numEvents))
}

func TestView(t *testing.T) {
	w := newWindow(t, 10, 10*time.Second) // 1s buckets
	for _, bad := range []time.Duration{0, -time.Second, 1500 * time.Millisecond, 3 * time.Second, 20 * time.Second} {
		_, err := w.View(bad)
		assert.ErrorContains(t, err, "view interval "+bad.String(), "View(%v)", bad)
	}
	v, err := w.View(2 * time.Second)
	require.NoError(t, err)
	sec := int64(time.Second)
	for s := int64(0); s < 10; s++ {
		w.Add(s*sec, Pass, s+1)
	}
	now := 9*sec + 1
	assert.Equal(t, int64(55), w.Sum(now, Pass))
	assert.Equal(t, int64(19), v.Sum(now, Pass), "last two 1s buckets")
	assert.InDelta(t, 9.5, v.Rate(now, Pass), 1e-9)
	assert.Equal(t, 2*time.Second, v.Interval())
}

func TestAddHammerSumsExactly(t *testing.T) {
	for _, stripes := range []int{1, 4, 16} {
		w := newWindow(t, 2, time.Second, WithStripes(stripes))
		const g, m = 16, 5000
		var wg sync.WaitGroup
		for range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range m {
					w.Add(0, Success, 1)
					w.Add(0, Pass, 1)
				}
			}()
		}
		wg.Wait()
		assert.Equal(t, int64(g*m), w.Sum(0, Success), "stripes=%d", stripes)
		assert.Equal(t, int64(g*m), w.Sum(0, Pass), "stripes=%d", stripes)
	}
}

func TestMinRTAndMaxConcurrencyExactUnderContention(t *testing.T) {
	w := newWindow(t, 2, time.Second)
	const g, m = 16, 2000
	lows := make([]int64, g)
	highs := make([]int64, g)
	var wg sync.WaitGroup
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			lows[i], highs[i] = 1<<62, 0
			for range m {
				rt := 1 + rng.Int64N(1_000_000)
				c := rng.Int64N(1_000_000)
				lows[i] = min(lows[i], rt)
				highs[i] = max(highs[i], c)
				w.addRT(0, rt)
				w.updateConcurrency(0, c)
			}
		}()
	}
	wg.Wait()
	got, ok := w.MinRT(0)
	require.True(t, ok)
	assert.Equal(t, slices.Min(lows), got)
	assert.Equal(t, slices.Max(highs), w.MaxConcurrency(0))
}

func TestZeroRTIsRecorded(t *testing.T) {
	w := newWindow(t, 1, time.Second)
	w.addRT(0, 0)
	got, ok := w.MinRT(0)
	assert.True(t, ok)
	assert.Zero(t, got)
}

func TestReserveBatches(t *testing.T) {
	w := newWindow(t, 2, time.Second)
	assert.False(t, w.Reserve(0, 11, 10), "a batch above the threshold is always blocked")
	assert.False(t, w.Reserve(0, 0, 10))
	assert.False(t, w.Reserve(0, 1, 0), "threshold 0 blocks everything")
	assert.True(t, w.Reserve(0, 7, 10))
	assert.Equal(t, int64(7), w.Sum(0, Pass), "pass moves by the batch size")
	assert.False(t, w.Reserve(0, 4, 10))
	assert.True(t, w.Reserve(0, 3, 10))
	assert.False(t, w.Reserve(0, 1, 10))
	assert.Equal(t, int64(10), w.Sum(0, Pass), "refusals write nothing")
	// The first bucket leaves the window at 1s.
	assert.True(t, w.Reserve(int64(time.Second), 10, 10))
}

func TestReserveAfterRollbackKeepsLimiting(t *testing.T) {
	w := newWindow(t, 4, time.Second)
	top := 20 * int64(time.Second)
	require.True(t, w.Reserve(top, 10, 10))
	for _, back := range []int64{1, 200 * ms, 900 * ms, 5 * int64(time.Second)} {
		assert.False(t, w.Reserve(top-back, 1, 10), "rollback by %v reopened the gate", time.Duration(back))
	}
	assert.True(t, w.Reserve(top+int64(time.Second), 1, 10), "limiting resumes when time moves on")
}

func TestReserveAndBorrowInteract(t *testing.T) {
	w := newWindow(t, 2, time.Second)
	bl := 500 * ms
	require.True(t, w.Reserve(bl, 8, 10))
	wait, ok := w.Borrow(bl+100*ms, 2, 10, time.Second)
	require.True(t, ok)
	assert.Equal(t, 400*time.Millisecond, wait)
	assert.Equal(t, int64(2), w.Borrowed())
	assert.False(t, w.Reserve(bl+200*ms, 1, 10), "borrowed admissions count against the current window")
	assert.Equal(t, int64(8), w.Sum(bl+200*ms, Pass))
	assert.True(t, w.Reserve(2*bl, 1, 11), "11: the folded 2 plus the 8 leave one")
	assert.Equal(t, int64(2), w.Sum(2*bl, OccupiedPass))
	assert.Equal(t, int64(11), w.Sum(2*bl, Pass))
	assert.Zero(t, w.Borrowed())
}

// bucketLog records the passes of every bucket a window had, by start:
// what each handed over when it retired (corrections included), and at
// the end what the buckets still in the ring hold. Buckets are reused, so
// the log keeps counts, not buckets.
type bucketLog struct {
	mu     sync.Mutex
	passes map[int64]int64
}

func (l *bucketLog) handover(start int64, c Counts) {
	l.mu.Lock()
	l.passes[start] += c.Pass
	l.mu.Unlock()
}

// live adds the buckets still in w's ring; call it once, after the run.
func (l *bucketLog) live(w *Window) {
	for b := range w.arr.Buckets(math.MinInt64, math.MaxInt64) {
		l.passes[b.Start()] += b.Value.get(Pass)
	}
}

// total returns every pass logged.
func (l *bucketLog) total() int64 {
	var n int64
	for _, v := range l.passes {
		n += v
	}
	return n
}

// maxWindow returns the largest Pass total over every window of n buckets.
func (l *bucketLog) maxWindow(interval, bucketLen int64) (worst int64, at int64) {
	starts := make([]int64, 0, len(l.passes))
	for s := range l.passes {
		starts = append(starts, s)
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	for _, end := range starts {
		var sum int64
		for _, s := range starts {
			if s <= end && end-s < interval {
				sum += l.passes[s]
			}
		}
		if sum > worst {
			worst, at = sum, end
		}
	}
	return worst, at
}

// Admission never lets a window hold more than its threshold, at any
// concurrency, from any mix of stripes, with borrows, as leases spread
// over stripes and go back to the bucket.
func TestReserveNeverExceedsThreshold(t *testing.T) {
	gs := []int{1, 2, 8, 64, 1000}
	if testing.Short() {
		gs = []int{1, 8, 100}
	}
	type shape struct {
		threshold int64
		stripes   int
		ticks     int64 // how many bl/7 steps the run spans
	}
	// Small thresholds admit one token at a time; large ones lease many to
	// each stripe, and the run is squeezed into fewer windows so that
	// demand still exceeds the threshold.
	shapes := []shape{{50, cpu.Stripes(), 300}, {5000, 16, 50}}
	for _, g := range gs {
		for i, borrow := range []bool{false, true, false, true} {
			sh := shapes[i/2]
			threshold := sh.threshold
			log := &bucketLog{passes: map[int64]int64{}}
			w, err := NewWindow(4, 40*time.Millisecond, WithStripes(sh.stripes), WithHandover(log.handover))
			require.NoError(t, err)
			bl := w.arr.BucketLen()
			var clock atomic.Int64
			var admitted atomic.Int64
			// Time is driven by the requests themselves, so the run is
			// bounded whatever the scheduler does: ~300 ticks of bl/7.
			ops := 2100 / g * 7
			if ops < 20 {
				ops = 20
			}
			tick := bl / 7 * sh.ticks / int64(g*ops)
			var wg sync.WaitGroup
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(i), 1))
					for k := range ops {
						n := 1 + rng.Int64N(3)
						now := clock.Add(tick)
						if borrow && k%5 == 0 {
							if _, ok := w.Borrow(now, n, threshold, time.Duration(2*bl)); ok {
								admitted.Add(n)
							}
							continue
						}
						// Half on the caller's P's stripe, half on any
						// stripe: a goroutine that moved from one P to
						// another, leaving a lease behind.
						ok := false
						if k%2 == 0 {
							ok = w.Reserve(now, n, threshold)
						} else {
							_, ok = w.AdmitOn(rng.IntN(sh.stripes), now, n, threshold)
						}
						if ok {
							admitted.Add(n)
						}
					}
				}()
			}
			wg.Wait()
			// Make the buckets borrowed from current, one at a time, so
			// every borrow folds at its own start.
			end := clock.Load()
			for k := int64(1); k <= 4; k++ {
				w.Add(end+k*bl, Pass, 0)
			}
			require.Zero(t, w.Borrowed())
			log.live(w)
			worst, at := log.maxWindow(w.arr.Interval(), bl)
			t.Logf("goroutines=%d threshold=%d borrow=%v: fullest window %d, admitted %d", g, threshold, borrow, worst, admitted.Load())
			assert.LessOrEqual(t, worst, threshold, "goroutines=%d threshold=%d borrow=%v: window ending at bucket %d", g, threshold, borrow, at)
			assert.Equal(t, admitted.Load(), log.total(), "goroutines=%d threshold=%d borrow=%v: every admission counted once", g, threshold, borrow)
		}
	}
}

// TestPrecisionBound drives a greedy client that asks at every millisecond
// and checks the documented bound on the admissions: any span shorter than
// W - W/n holds at most the threshold, and a span of W can hold up to 2x
// (exactly 2x for the fixed window, n = 1).
func TestPrecisionBound(t *testing.T) {
	const threshold = 100
	const W = 1000 // ms
	for _, n := range []int{1, 2, 4, 10} {
		w := newWindow(t, n, time.Second)
		var admits []int64 // admission count per ms
		// Quiet for most of the first window, then a burst at 0.9 W, as in
		// the fixed-window example; then greedy traffic at every ms.
		for tms := int64(0); tms < 5*W; tms++ {
			var a int64
			if tms >= 900 {
				for w.Reserve(tms*ms, 1, threshold) {
					a++
				}
			}
			admits = append(admits, a)
		}
		spanMax := func(L int) int64 {
			var best, run int64
			for i := range admits {
				run += admits[i]
				if i >= L {
					run -= admits[i-L]
				}
				best = max(best, run)
			}
			return best
		}
		short := W - W/n - 1
		if short > 0 {
			assert.LessOrEqual(t, spanMax(short), int64(threshold), "n=%d: span %dms", n, short)
		}
		full := spanMax(W)
		assert.LessOrEqual(t, full, int64(2*threshold), "n=%d: span W", n)
		if n == 1 {
			assert.Equal(t, int64(2*threshold), full, "the fixed window shows the full double burst")
		}
		t.Logf("n=%d: max in %dms = %d, max in %dms = %d", n, short, spanMax(max(short, 1)), W, full)
	}
}

func TestHotPathsAllocateNothing(t *testing.T) {
	w := newWindow(t, 10, time.Second)
	now := int64(123) * ms
	w.Add(now, Pass, 1) // make the bucket
	for name, fn := range map[string]func(){
		"Add":        func() { w.Add(now, Success, 1) },
		"Complete":   func() { w.Complete(now, 1, 5, false) },
		"Sum":        func() { _ = w.Sum(now, Pass) },
		"SumStriped": func() { _ = w.Sum(now, Success) },
		"Reserve":    func() { _ = w.Reserve(now, 1, 1<<40) },
		"Blocked":    func() { _ = w.Reserve(now, 2, 1) },
		"Rate":       func() { _ = w.Rate(now, Success) },
	} {
		assert.Zero(t, testing.AllocsPerRun(1000, fn), name)
	}
}

// Times far below 0 (a clock built on an unset time.Time reads about
// -9.2e18) count at 0 instead of reaching the ring's placeholder.
func TestFarNegativeTimes(t *testing.T) {
	w, err := NewWindow(4, time.Second)
	require.NoError(t, err)
	for _, now := range []int64{math.MinInt64, math.MinInt64 / 2, -5e18, -1} {
		assert.NotPanics(t, func() {
			w.Add(now, Block, 1)
			w.Complete(now, 1, 5, false)
			_, ok := w.Admit(now, 1, 100)
			assert.True(t, ok)
			w.addRT(now, 1)
			w.updateConcurrency(now, 1)
		}, "now %d", now)
	}
	assert.Equal(t, int64(4), w.Sum(0, Pass))
	assert.Equal(t, int64(4), w.Sum(math.MinInt64, Block))
	// Each as the first write of a fresh window too, whose head is the
	// placeholder (no stripes).
	for _, now := range []int64{math.MinInt64, math.MinInt64 / 2, -5e18} {
		for name, op := range map[string]func(w *Window){
			"Admit":    func(w *Window) { _, ok := w.Admit(now, 1, 100); assert.True(t, ok) },
			"Add":      func(w *Window) { w.Add(now, Pass, 1) },
			"Complete": func(w *Window) { w.Complete(now, 1, 5, false) },
		} {
			w, err := NewWindow(4, time.Second)
			require.NoError(t, err)
			assert.NotPanics(t, func() { op(w) }, "%s at %d on a fresh window", name, now)
		}
	}
}

// Passes taken back in a later bucket than they were added in (a caller
// of metric.Window.Add may) can leave the rest of a window below zero:
// admission still decides, against a base of no passes.
func TestWindowBelowZeroStillAdmits(t *testing.T) {
	w := newWindow(t, 2, time.Second, WithStripes(1))
	w.Add(0, Pass, 5)
	w.Add(500*ms, Pass, -5)
	done := make(chan int64, 1)
	go func() {
		var admitted int64
		for admitted <= 10 && w.Reserve(1000*ms, 1, 10) {
			admitted++
		}
		done <- admitted
	}()
	select {
	case admitted := <-done:
		assert.Equal(t, int64(10), admitted)
	case <-time.After(5 * time.Second):
		t.Fatal("admission at 1000 ms did not return")
	}
}

func TestRoomIn(t *testing.T) {
	w, err := NewWindow(4, time.Second)
	require.NoError(t, err)
	const ms = int64(time.Millisecond)
	// 3 at 0, 2 at 250 ms, 1 at 600 ms: 6 in the window.
	for _, c := range []struct{ at, n int64 }{{0, 3}, {250 * ms, 2}, {600 * ms, 1}} {
		_, ok := w.Admit(c.at, c.n, 100)
		require.True(t, ok)
	}
	now := 700 * ms
	// Buckets start at 0, 250 and 500 ms and leave the window at 1, 1.25
	// and 1.5 s.
	for _, tc := range []struct {
		n, threshold int64
		wait         time.Duration
	}{
		{1, 10, 0},                     // room now
		{1, 6, 300 * time.Millisecond}, // the 3 of the first bucket leave
		{4, 6, 550 * time.Millisecond}, // and the 2 of the second
		{1, 3, 550 * time.Millisecond},
		{1, 1, 800 * time.Millisecond}, // all of them
	} {
		wait, reset, ok := w.RoomIn(now, tc.n, tc.threshold)
		require.True(t, ok)
		assert.Equal(t, tc.wait, wait, "n %d, threshold %d", tc.n, tc.threshold)
		assert.Equal(t, 800*time.Millisecond, reset)
	}
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _, _ = w.RoomIn(now, 1, 6) }))
	_, _, ok := w.RoomIn(now, 11, 10)
	assert.False(t, ok, "larger than the threshold: never")
}

// A window admits its whole threshold whichever stripes the requests come
// from: tokens leased to one stripe and left unused there (its goroutine
// moved to another P) go back to the bucket when a request on another
// stripe finds no room, and a stripe then admits nothing past the
// threshold.
func TestAdmitsTheWholeThresholdAcrossStripes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, stripes := range []int{2, 4, 64} {
		for _, threshold := range []int64{100, 1000, 100_000} {
			for trial := range 20 {
				w := newWindow(t, 1, time.Second, WithStripes(stripes))
				now := 5 * int64(time.Second)
				var admitted int64
				p := rng.IntN(stripes)
				for admitted < threshold {
					if rng.IntN(8) == 0 {
						p = rng.IntN(stripes) // the goroutine moved
					}
					n := min(1+rng.Int64N(3), threshold-admitted)
					if _, ok := w.AdmitOn(p, now, n, threshold); !ok {
						t.Fatalf("%d stripes, threshold %d, trial %d: %d refused on stripe %d after %d admitted", stripes, threshold, trial, n, p, admitted)
					}
					admitted += n
				}
				for q := range stripes {
					if _, ok := w.AdmitOn(q, now, 1, threshold); ok {
						t.Fatalf("%d stripes, threshold %d: stripe %d admitted past the threshold", stripes, threshold, q)
					}
				}
				assert.Equal(t, threshold, w.Sum(now, Pass))
			}
		}
	}
}

// Passes a bucket counts without admission stop at MaxCount on a stripe
// (the rest is dropped) and never carry into the word's generation: every
// add returns, and the frozen and handed-over counts stay in range.
func TestPassesBeyondMaxCountSaturate(t *testing.T) {
	var handed Counts
	w := newWindow(t, 2, time.Second, WithStripes(2), WithHandover(func(_ int64, c Counts) { handed.Add(c) }))
	w.AddOn(0, 0, Pass, MaxCount)
	w.AddOn(0, 0, Pass, MaxCount)
	w.AddOn(1, 0, Pass, 1<<52)
	w.AddOn(1, 0, Pass, math.MaxInt64)
	assert.Equal(t, int64(2*MaxCount), w.Sum(0, Pass), "each stripe holds MaxCount")
	w.AddOn(1, 0, Pass, -MaxCount)
	w.AddOn(1, 0, Pass, math.MinInt64)
	assert.Equal(t, int64(0), w.Sum(0, Pass), "and no less than -MaxCount")
	w.AddOn(1, 0, Pass, 2*MaxCount)
	assert.Equal(t, int64(2*MaxCount), w.Sum(0, Pass))
	w.Add(500*ms, Block, 1)  // freezes the bucket at 0
	w.Add(1000*ms, Block, 1) // retires it
	assert.Equal(t, int64(MaxCount), handed.Pass, "the frozen sum stops at MaxCount")
	w.AddOn(0, 1000*ms, Pass, 7)
	assert.Equal(t, int64(7), w.Sum(1000*ms, Pass), "later buckets count as before")
}

// A threshold up to MaxCount admits in full (flow's largest window, a
// trillion a second over an hour, is below it), and one above admits
// MaxCount.
func TestThresholdsUpToMaxCountAdmitInFull(t *testing.T) {
	const hour = 1e12 * 3600
	require.Less(t, int64(hour), int64(MaxCount))
	for _, c := range []struct{ threshold, admits int64 }{{hour, hour}, {MaxCount, MaxCount}, {math.MaxInt64, MaxCount}} {
		w := newWindow(t, 2, time.Hour, WithStripes(2))
		_, ok := w.AdmitOn(0, 0, c.admits-1, c.threshold)
		require.True(t, ok, "threshold %d", c.threshold)
		_, ok = w.AdmitOn(1, 0, 1, c.threshold)
		require.True(t, ok, "threshold %d", c.threshold)
		_, ok = w.AdmitOn(0, 0, 1, c.threshold)
		assert.False(t, ok, "threshold %d: full", c.threshold)
		assert.Equal(t, c.admits, w.Sum(0, Pass))
	}
}

// An admission keeps the stripe it counted on beside its count, for every
// stripe a window may have: its cancel gives the count back there.
func TestCancelReturnsToTheAdmissionsStripe(t *testing.T) {
	w := newWindow(t, 2, time.Second, WithStripes(64))
	for p := range 64 {
		r, ok := w.AdmitOn(p, 0, int64(p+1), 1<<40)
		require.True(t, ok)
		assert.Same(t, w.arr.Head().Value.stripeOn(p), r.stripe(), "stripe %d", p)
		assert.Equal(t, int64(p+1), r.count())
		used := &r.stripe().c[stripeUsed]
		before := loadT(used)
		r.Cancel()
		assert.Equal(t, before-int64(p+1), loadT(used), "stripe %d", p)
	}
	assert.Zero(t, w.Sum(0, Pass))
}
