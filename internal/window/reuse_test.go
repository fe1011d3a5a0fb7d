package window

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/ring"
)

// Steady traffic rotates a window's buckets without allocating: each
// rotation resets the bucket the previous one retired.
func TestSteadyRotationAllocatesNothing(t *testing.T) {
	for _, sc := range []int{1, 2, 10} {
		var handed Counts
		w := newWindow(t, sc, time.Second, WithStripes(4), WithHandover(func(_ int64, c Counts) { handed.Add(c) }))
		bl := w.BucketLen()
		now := int64(0)
		step := func() {
			now += bl
			w.Reserve(now, 1, 1000)
			w.Add(now, Block, 1)
			w.Complete(now, 1, 5, false)
			w.Settle(now)
		}
		for range 3 * sc {
			step() // fill the ring and its spare
		}
		assert.Zero(t, testing.AllocsPerRun(50, step), "sampleCount %d: a rotation allocates nothing", sc)
		assert.Positive(t, handed.Pass, "buckets retired and handed over")
	}
}

// A caller that loaded a bucket before it was reused cannot write into the
// new generation: its tagged writes fail and its corrections follow the
// hand-over of the bucket it loaded, whose start it kept.
func TestStaleWritesAfterReuseMissTheNewGeneration(t *testing.T) {
	type handed struct {
		start int64
		c     Counts
	}
	var got []handed
	w := newWindow(t, 2, time.Second, WithStripes(2), WithHandover(func(start int64, c Counts) {
		got = append(got, handed{start, c})
	}))
	r, ok := w.AdmitOn(0, 0, 3, 100)
	require.True(t, ok)
	x := w.arr.Head()
	startX, gX := x.Start(), x.Value.gen.Load()
	s0 := x.Value.stripeOn(0)

	w.Add(500*ms, Block, 1)  // x freezes
	w.Add(1000*ms, Block, 1) // x retires: the spare
	w.Add(1500*ms, Block, 1) // x is reused for 1500 ms
	require.Same(t, x, w.arr.Head())
	require.Equal(t, 1500*ms, x.Start())
	gY := x.Value.gen.Load()
	require.NotEqual(t, gX, gY)
	got = got[:0]

	// A late direct pass, lease and base of the old generation fail.
	assert.False(t, addIn(&s0.c[stripeDirect], gX, 1))
	seen, retry := w.lease(x, s0, startX, gX, 1, 100)
	assert.True(t, retry, "the lease sends its caller to the newest bucket")
	assert.Zero(t, seen)
	assert.False(t, x.Value.base.CompareAndSwap(baseUnknown(startX), 42), "a base of the old start cannot be stored")
	// A late taking back and a late cancel correct the old hand-over.
	w.takeBack(x, &s0.c[stripeUsed], startX, gX, 2)
	r.Cancel()
	assert.Equal(t, []handed{{0, Counts{Pass: -2, MinRT: -1}}, {0, Counts{Pass: -3, MinRT: -1}}}, got)

	// The new generation is untouched: empty, and admits its threshold.
	for _, e := range []Event{Pass, OccupiedPass, Success} {
		assert.Zero(t, x.Value.get(e), "%v", e)
	}
	assert.Zero(t, x.Value.committed())
	var admitted int64
	for w.Reserve(1500*ms, 1, 100) {
		admitted++
	}
	assert.Equal(t, int64(100), admitted)
}

// Generation tags wrap without ever reaching the seal bit, and a word of
// one generation never reads as another's.
func TestGenerationTagsWrap(t *testing.T) {
	g := int64(countBias)
	for range tagMask + 2 {
		next := nextGen(g)
		require.Zero(t, next&sealBit)
		require.Equal(t, int64(0), countOf(next))
		require.False(t, inGen(next, g))
		require.False(t, inGen(next|sealBit, next))
		require.True(t, sealedIn(next|sealBit, next))
		g = next
	}
	assert.Equal(t, int64(countBias), g&^(tagMask<<countBits), "back to tag 0 after a whole cycle")
	assert.Equal(t, int64(-5), countOf(g-5), "counts below zero stay in their generation")
	assert.True(t, inGen(g-5, g))
}

// Admissions held across rotations and cancelled late, on a window whose
// buckets are reused many times over, each land exactly once (in the
// bucket's counts, or as a correction of its hand-over), and no window
// holds more than the threshold.
func TestLateCancelsAcrossReuseLandOnce(t *testing.T) {
	const threshold = 40
	for _, g := range []int{1, 4, 32} {
		log := &bucketLog{passes: map[int64]int64{}}
		w, err := NewWindow(4, 40*time.Millisecond, WithStripes(4), WithHandover(log.handover))
		require.NoError(t, err)
		bl := w.BucketLen()
		var clock, net atomic.Int64
		var wg sync.WaitGroup
		for i := range g {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), 3))
				var held []Reservation
				for range 4000 / g {
					now := clock.Add(bl / 9)
					r, ok := w.AdmitOn(rng.IntN(4), now, 1+rng.Int64N(2), threshold)
					if ok {
						net.Add(r.count())
						held = append(held, r)
					}
					// Cancel one held a while: its bucket has often
					// frozen, retired or been reused since.
					if len(held) > 12 || (len(held) > 0 && rng.IntN(4) == 0) {
						k := rng.IntN(len(held))
						net.Add(-held[k].count())
						held[k].Cancel()
						held = append(held[:k], held[k+1:]...)
					}
				}
			}()
		}
		wg.Wait()
		log.live(w)
		assert.Equal(t, net.Load(), log.total(), "goroutines=%d: every admission and cancel counted once", g)
		worst, at := log.maxWindow(w.arr.Interval(), bl)
		assert.LessOrEqual(t, worst, int64(threshold), "goroutines=%d: window ending at %d", g, at)
	}
}

// midReuse returns an option that runs fn inside the rotation that reuses
// the bucket *b for start: after its reset, before it is published (what a
// caller that loaded the bucket in its earlier life may do then).
func midReuse(b **ring.WindowWrap[bucket], start int64, fn func()) (Option, *bool) {
	ran := new(bool)
	return func(c *config) {
		c.onNew = func(s int64, v *bucket) {
			if *b != nil && v == &(*b).Value && s == start {
				*ran = true
				fn()
			}
		}
	}, ran
}

// A lease by a caller that loaded a bucket in its earlier life, resumed
// while the bucket is reset for its next, cannot set the next life's base:
// summed before that life is the newest, it would miss what the bucket
// before it still admits, and the window would hold more than its
// threshold.
func TestStaleLeaseCannotSetTheNextLifesBase(t *testing.T) {
	const threshold = 10
	for _, stale := range []bool{false, true} {
		var w *Window
		var a *ring.WindowWrap[bucket]
		var startA, gA int64
		hook, ran := midReuse(&a, 1500*ms, func() {
			if stale {
				w.lease(a, a.Value.stripeOn(0), startA, gA, 1, threshold)
			}
			// A request whose clock read 1499 ms admits in the bucket
			// still the newest.
			_, ok := w.AdmitOn(0, 1499*ms, threshold, threshold)
			assert.True(t, ok, "the newest bucket admits its threshold")
		})
		w = newWindow(t, 2, time.Second, WithStripes(1), hook)
		w.Add(0, Block, 1)
		a = w.arr.Head()
		startA, gA = a.Start(), a.Value.gen.Load()
		w.Add(500*ms, Block, 1)  // a freezes
		w.Add(1000*ms, Block, 1) // a retires: the spare
		var admitted int64
		for admitted <= threshold && w.Reserve(1500*ms, 1, threshold) {
			admitted++ // a is reused for 1500 ms on the first
		}
		require.True(t, *ran, "a was reused for 1500 ms")
		assert.Zero(t, admitted, "stale lease %v: the window at 1500 ms is full", stale)
		assert.Equal(t, int64(threshold), w.Sum(1500*ms, Pass), "stale lease %v", stale)
	}
}

// A Sum by a caller that loaded the head in its earlier life, resumed
// while the bucket is reset for its next, cannot cache its total as the
// next life's: the sums of that life would miss the rest of its window.
func TestStaleFillCannotCacheTheNextLifesRest(t *testing.T) {
	var w *Window
	var a *ring.WindowWrap[bucket]
	var startA int64
	hook, ran := midReuse(&a, 1500*ms, func() { w.fillSum(a, startA) })
	w = newWindow(t, 2, time.Second, WithStripes(1), hook)
	w.Add(0, Block, 1)
	a = w.arr.Head()
	startA = a.Start()
	w.Add(500*ms, Block, 1)
	require.True(t, w.Reserve(1000*ms, 10, 100))
	w.Add(1500*ms, Block, 1) // a is reused for 1500 ms
	require.True(t, *ran)
	assert.Equal(t, int64(10), w.Sum(1500*ms, Pass), "the passes at 1000 ms are in the window")
	require.True(t, w.Reserve(1600*ms, 1, 100))
	assert.Equal(t, int64(11), w.Sum(1600*ms, Pass))
}
