package window

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

func TestLoadAndSealedAcrossTheRange(t *testing.T) {
	for _, v := range []int64{0, 1, 7, -1, -1000, sealBit/2 - 1, -(sealBit/2 - 1)} {
		var c atomic.Int64
		c.Store(v)
		assert.Equal(t, v, load(&c), "unsealed %d", v)
		assert.False(t, sealed(c.Load()), "unsealed %d", v)
		assert.Equal(t, v, c.Add(sealBit)-sealBit)
		assert.Equal(t, v, load(&c), "sealed %d", v)
		assert.True(t, sealed(c.Add(0)), "sealed %d", v)
	}
}

// TestFreezeAndSealStep walks buckets through their two changes: a bucket
// freezes when it stops being the newest (its counts move to one word per
// event, writes that reach it later read as sealed) and hands over its final
// counts when it leaves the ring. Cancels in either state land exactly once.
func TestFreezeAndSealStep(t *testing.T) {
	var got []Counts
	var starts []int64
	w := newWindow(t, 2, time.Second, WithStripes(4), WithHandover(func(start int64, c Counts) {
		starts = append(starts, start)
		got = append(got, c)
	}))
	w.AddOn(0, 0, Pass, 2)
	w.AddOn(3, 0, Block, 3)
	w.CompleteOn(1, 0, 4, 40, true)
	w.addRT(0, 1)
	w.Add(0, OccupiedPass, 1)
	w.updateConcurrency(0, 9)
	early, ok := w.Admit(0, 5, 100)
	require.True(t, ok)
	late, ok := w.AdmitOn(2, 0, 3, 100)
	require.True(t, ok)
	old := w.arr.Current(0)
	assert.False(t, old.Value.frozen.Load())
	assert.Equal(t, int64(10), w.Sum(0, Pass))

	// The next bucket freezes the first: same reads, from fz.
	w.Add(500*ms, Success, 1)
	require.True(t, old.Value.frozen.Load())
	assert.Empty(t, got, "nothing leaves the ring yet")
	for e, want := range map[Event]int64{Pass: 10, Block: 3, Success: 4, Exception: 4, RT: 41, OccupiedPass: 1} {
		assert.Equal(t, want, old.Value.get(e), "%v", e)
	}
	assert.Equal(t, int64(10), w.Sum(999*ms, Pass))
	// A writer that still held it finds the seal and its add is not counted
	// there (Window's writers make it again on the newest bucket).
	assert.True(t, sealed(old.Value.stripeOn(1).c[stripeSuccess].Add(1)))
	assert.Equal(t, int64(4), old.Value.get(Success))
	// A cancel takes its passes back from the frozen count.
	early.Cancel()
	assert.Equal(t, int64(5), old.Value.get(Pass))
	assert.Equal(t, int64(5), w.Sum(999*ms, Pass))
	assert.Empty(t, got)

	w.Add(1000*ms, Success, 1) // reuses slot 0: old retires
	require.Len(t, got, 1)
	assert.Equal(t, []int64{0}, starts)
	assert.Equal(t, Counts{Pass: 5, Block: 3, Success: 4, Exception: 4, RT: 41, Occupied: 1, MinRT: 1, MaxConcurrency: 9}, got[0])
	assert.Equal(t, int64(5), old.Value.get(Pass), "reads of a retired bucket mask the seal")

	// Cancelling an admission whose bucket was handed over corrects the
	// hand-over, once.
	late.Cancel()
	require.Len(t, got, 2)
	assert.Equal(t, Counts{Pass: -3, MinRT: -1}, got[1])
	assert.Equal(t, int64(0), starts[1])

	// The next rotation reuses the retired bucket, reset, for its start.
	w.Add(1500*ms, Block, 1)
	require.Same(t, old, w.arr.Current(1500*ms), "the retired bucket is reset for the new start")
	assert.Equal(t, 1500*ms, old.Start())
	for e, want := range map[Event]int64{Pass: 0, Block: 1, Success: 0, Exception: 0, RT: 0, OccupiedPass: 0} {
		assert.Equal(t, want, old.Value.get(e), "%v: the new generation starts empty", e)
	}
}

// TestHandOverIsExactUnderRotation hammers a window whose buckets retire
// while writers use them, with every kind of write, and checks that what was
// handed over plus what is still in the ring equals what was written: no
// count lost, none counted twice.
func TestHandOverIsExactUnderRotation(t *testing.T) {
	for _, samples := range []int{1, 2} {
		var handed [numEvents]atomic.Int64
		w := newWindow(t, samples, time.Millisecond, WithHandover(func(_ int64, c Counts) {
			handed[Pass].Add(c.Pass)
			handed[Success].Add(c.Success)
			handed[Block].Add(c.Block)
			handed[RT].Add(c.RT)
			handed[Exception].Add(c.Exception)
		}))
		var clock atomic.Int64
		var admitted atomic.Int64
		const g, m = 8, 4000
		var wg sync.WaitGroup
		for i := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range m {
					now := clock.Add(20 * int64(time.Microsecond))
					w.Add(now, Block, 1)
					w.Add(now, Pass, 1)
					w.Complete(now, 1, 3, k%2 == 0)
					if r, ok := w.Admit(now, 1, math.MaxInt32); ok {
						if (i+k)%3 == 0 {
							r.Cancel()
						} else {
							admitted.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		ring := func(e Event) int64 { return w.SumRange(math.MinInt64, math.MaxInt64, e) }
		total := int64(g * m)
		assert.Equal(t, total, handed[Block].Load()+ring(Block), "samples=%d block", samples)
		assert.Equal(t, total, handed[Success].Load()+ring(Success), "samples=%d success", samples)
		assert.Equal(t, 3*total, handed[RT].Load()+ring(RT), "samples=%d rt", samples)
		assert.Equal(t, total/2, handed[Exception].Load()+ring(Exception), "samples=%d exception", samples)
		assert.Equal(t, total+admitted.Load(), handed[Pass].Load()+ring(Pass), "samples=%d pass", samples)
	}
}

// TestCachedSumUnderRacingCancels runs readers that fill the head's cache of
// frozen passes while writers admit, cancel late (often after their bucket
// froze) and move time on. Once they stop, the whole-window Sum, cached or
// not, must equal a walk over the buckets.
func TestCachedSumUnderRacingCancels(t *testing.T) {
	for _, samples := range []int{2, 4, 10} {
		w := newWindow(t, samples, 10*time.Millisecond)
		var clock atomic.Int64
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
						_ = w.Sum(clock.Load(), Pass)
					}
				}
			}()
		}
		var writers sync.WaitGroup
		left := make([][]Reservation, 4)
		for i := range 4 {
			writers.Add(1)
			go func() {
				defer writers.Done()
				var held []Reservation
				defer func() { left[i] = held }()
				for k := range 3000 {
					now := clock.Add(int64(time.Millisecond) / 40)
					if r, ok := w.Admit(now, 1, math.MaxInt32); ok {
						held = append(held, r)
					}
					// Cancel (or keep) the admission made 8 steps ago: a
					// bucket or two back, frozen but in the window.
					if len(held) > 8 {
						if k%2 == 0 {
							held[0].Cancel()
						}
						held = held[1:]
					}
				}
			}()
		}
		writers.Wait()
		close(stop)
		wg.Wait()
		// Then in steps: a new head, its cache filled, and the admissions
		// still held cancelled, from frozen buckets of its window.
		now := clock.Load() + w.arr.BucketLen()
		_, ok := w.Admit(now, 1, math.MaxInt32)
		require.True(t, ok)
		_ = w.Sum(now, Pass)
		require.GreaterOrEqual(t, w.arr.Head().Value.rest.Load(), int64(0), "cached")
		for _, held := range left {
			for _, r := range held {
				r.Cancel()
			}
		}
		var walk int64
		for b := range w.arr.Within(now, w.arr.Interval()) {
			walk += b.Value.passes()
		}
		assert.Equal(t, walk, w.Sum(now, Pass), "samples=%d", samples)
		assert.Equal(t, walk, w.Sum(now, Pass), "samples=%d, again (cached)", samples)
	}
}

// TestSumCacheFillSteps walks the cache of the frozen rest through the
// interleavings a race can produce, one step at a time.
func TestSumCacheFillSteps(t *testing.T) {
	w := newWindow(t, 4, time.Second) // 250 ms buckets
	for i := range int64(5) {
		w.Add(i*250*ms, Pass, i+1) // buckets 0..4 hold 1..5
	}
	head := w.arr.Head()
	require.Equal(t, 1000*ms, head.Start())

	// The rest of head's window is buckets 1..3, whatever time the filler
	// had: one behind head (a rotation raced it) must not count bucket 0.
	rest, final := w.restOf(head, head.Start())
	assert.Equal(t, int64(2+3+4), rest)
	assert.True(t, final)

	// A fill whose claim a clear took away, and another fill then claimed,
	// cannot store its stale total over the new fill.
	a, ok := w.beginFill(head)
	require.True(t, ok)
	_, ok = w.beginFill(head)
	assert.False(t, ok, "one fill at a time")
	head.Value.rest.Store(sumUnknown) // a late take-back clears the cache
	b, ok := w.beginFill(head)
	require.True(t, ok)
	assert.NotEqual(t, a, b)
	w.endFill(head, a, 999, true)
	assert.Equal(t, b, head.Value.rest.Load(), "the stale fill did not store")
	w.endFill(head, b, rest, true)
	assert.Equal(t, rest, head.Value.rest.Load())
	assert.Equal(t, int64(2+3+4+5), w.Sum(1100*ms, Pass), "served from the cache")

	// A fill that saw a bucket not yet frozen stores nothing.
	head.Value.rest.Store(sumUnknown)
	c, ok := w.beginFill(head)
	require.True(t, ok)
	w.endFill(head, c, rest, false)
	assert.Equal(t, int64(sumUnknown), head.Value.rest.Load())
}

// Cancel gives an admission back once: it clears the Reservation.
func TestCancelClearsTheReservation(t *testing.T) {
	w, err := NewWindow(4, time.Second)
	require.NoError(t, err)
	r, ok := w.Admit(0, 3, 3)
	require.True(t, ok)
	r.Cancel()
	r.Cancel()
	_, ok = w.Admit(0, 3, 3)
	assert.True(t, ok, "the 3 came back")
	_, ok = w.Admit(0, 1, 3)
	assert.False(t, ok, "once, not twice")
}

// TestCancelledAdmissionsGoBackToTheBucket: an admission cancelled (a
// later rule refused its request) can be taken again from any stripe, so a
// window of a small threshold admits its threshold whichever stripes its
// requests land on (left in its stripe's lease, it was lost to the
// others); and under the race detector, cancels racing admissions on the
// same stripes never let the window admit past its threshold.
func TestCancelledAdmissionsGoBackToTheBucket(t *testing.T) {
	w := newWindow(t, 4, time.Second, WithStripes(4))
	r, ok := w.AdmitOn(0, 0, 1, 3)
	require.True(t, ok)
	r.Cancel()
	for p := 1; p <= 3; p++ {
		_, ok := w.AdmitOn(p, 0, 1, 3)
		require.True(t, ok, "stripe %d: the cancelled admission is the bucket's again", p)
	}
	_, ok = w.AdmitOn(0, 0, 1, 3)
	assert.False(t, ok, "and the threshold holds")

	for round := range 50 {
		const threshold = 40
		w := newWindow(t, 4, time.Second, WithStripes(4))
		var kept atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range 400 {
					r, ok := w.AdmitOn(g+k, 0, 1, threshold)
					if !ok {
						continue
					}
					if k%3 == 0 {
						r.Cancel()
						continue
					}
					kept.Inc()
				}
			}()
		}
		wg.Wait()
		require.LessOrEqual(t, kept.Load(), int64(threshold), "round %d", round)
		assert.Equal(t, kept.Load(), w.Sum(0, Pass), "round %d: passes are the admissions kept", round)
	}
}
