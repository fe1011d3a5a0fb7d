package ring

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

type counter struct{ n atomic.Int64 }

func newArray(t testing.TB, n int, interval time.Duration) *LeapArray[counter] {
	t.Helper()
	a, err := New[counter](n, interval, Hooks[counter]{})
	require.NoError(t, err)
	return a
}

func TestNewRejectsBadShapes(t *testing.T) {
	for _, tc := range []struct {
		n        int
		interval time.Duration
		want     string
	}{
		{0, time.Second, "sampleCount must be > 0, got 0"},
		{-2, time.Second, "sampleCount must be > 0, got -2"},
		{2, 0, "interval must be > 0, got 0s"},
		{2, -time.Second, "interval must be > 0, got -1s"},
		{3, 1000, "interval 1µs does not divide into 3 equal buckets"},
	} {
		_, err := New[counter](tc.n, tc.interval, Hooks[counter]{})
		require.Error(t, err, "n=%d interval=%v", tc.n, tc.interval)
		assert.Contains(t, err.Error(), tc.want)
	}
	a, err := New[counter](3, 3*time.Second, Hooks[counter]{})
	require.NoError(t, err)
	assert.Equal(t, int64(time.Second), a.BucketLen())
}

func TestIndexAndStartMapping(t *testing.T) {
	a := newArray(t, 4, 2*time.Second) // 500ms buckets
	ms := int64(time.Millisecond)
	for i, st := range []struct {
		now       int64
		wantIdx   int
		wantStart int64
	}{
		{0, 0, 0},
		{499 * ms, 0, 0},
		{500 * ms, 1, 500 * ms},
		{1999 * ms, 3, 1500 * ms},
		{2000 * ms, 0, 2000 * ms},
		{2750 * ms, 1, 2500 * ms},
		{10_001 * ms, 0, 10_000 * ms},
	} {
		assert.Equal(t, st.wantIdx, a.indexOf(st.now), "step %d: IndexOf(%d)", i, st.now)
		assert.Equal(t, st.wantStart, a.startOf(st.now), "step %d: StartOf(%d)", i, st.now)
		w := a.Current(st.now)
		assert.Equal(t, st.wantStart, w.Start(), "step %d: Current(%d).Start()", i, st.now)
		assert.Same(t, w, a.slots[st.wantIdx].Load(), "step %d: bucket not in slot %d", i, st.wantIdx)
	}
}

// validCount returns how many buckets ForEach visits at now and their starts.
func visit(a *LeapArray[counter], now int64) []int64 {
	var starts []int64
	forEach(a, now, func(w *WindowWrap[counter]) bool {
		starts = append(starts, w.Start())
		return true
	})
	return starts
}

func TestDeprecationIsHalfOpen(t *testing.T) {
	const interval = int64(time.Second)
	for i, st := range []struct {
		now   int64
		valid bool
	}{
		{interval - 1, true},
		{interval, false},
		{interval + 1, false},
	} {
		a := newArray(t, 2, time.Second)
		w := a.Current(0)
		assert.Equal(t, st.valid, valid(w, st.now, interval), "step %d: Valid at %d", i, st.now)
		// A pure read at now must agree and must not create anything.
		got := visit(a, st.now)
		if st.valid {
			assert.Equal(t, []int64{0}, got, "step %d", i)
		} else {
			assert.Empty(t, got, "step %d", i)
		}
		assert.Equal(t, int64(emptyStart), a.slots[1].Load().Start(), "step %d: a read created a bucket", i)
	}
}

func TestJumpsForward(t *testing.T) {
	const interval = int64(time.Second)
	for _, jump := range []float64{0.5, 1, 1.5, 10} {
		a := newArray(t, 4, time.Second)
		for now := int64(0); now < interval; now += interval / 4 {
			a.Current(now).Value.n.Add(1)
		}
		before := visit(a, interval-1)
		require.Len(t, before, 4)
		next := interval - 1 + int64(jump*float64(interval))
		w := a.Current(next)
		assert.Equal(t, next-next%(interval/4), w.Start(), "jump %v", jump)
		assert.Zero(t, w.Value.n.Load(), "jump %v: the new bucket starts empty", jump)
		var total int64
		forEach(a, next, func(w *WindowWrap[counter]) bool { total += w.Value.n.Load(); return true })
		// Buckets older than one interval are gone; the rest survive.
		want := int64(0)
		for s := int64(0); s < interval; s += interval / 4 {
			if next-s < interval {
				want++
			}
		}
		assert.Equal(t, want, total, "jump %v: sum after jump", jump)
	}
}

func TestRacingFirstTouchCreatesOneBucket(t *testing.T) {
	for round := 0; round < 50; round++ {
		var made atomic.Int64
		a, err := New(2, time.Second, Hooks[counter]{Init: func(int64, *counter) { made.Inc() }})
		require.NoError(t, err)
		const g = 32
		got := make([]*WindowWrap[counter], g)
		var start, done sync.WaitGroup
		start.Add(1)
		for i := range g {
			done.Add(1)
			go func() {
				defer done.Done()
				start.Wait()
				got[i] = a.Current(int64(time.Millisecond))
			}()
		}
		start.Done()
		done.Wait()
		require.Equal(t, int64(1), made.Load(), "round %d: buckets made", round)
		for i := range got {
			require.Same(t, got[0], got[i])
		}
	}
}

func TestRollbackClampsToNewestBucket(t *testing.T) {
	const interval = int64(time.Second)
	bl := interval / 4
	for _, tc := range []struct {
		name string
		back int64
	}{
		{"within a bucket", bl / 2},
		{"under one interval", interval / 2},
		{"over one interval", 3 * interval},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := newArray(t, 4, time.Second)
			top := 10*interval + bl + bl/2 + 1 // inside bucket 10.25s
			newest := a.Current(top)
			newest.Value.n.Add(5)
			past := top - tc.back
			w := a.Current(past)
			assert.Same(t, newest, w, "a write behind the newest bucket lands in it")
			w.Value.n.Add(1)
			// Reads at the past time see the window that ends at the newest
			// bucket: nothing dropped, nothing reopened.
			var total int64
			forEach(a, past, func(w *WindowWrap[counter]) bool { total += w.Value.n.Load(); return true })
			assert.Equal(t, int64(6), total)
			assert.Equal(t, max(past, newest.Start()), a.Clamp(past))
			// Time moving on from the newest bucket works as usual.
			assert.Equal(t, newest.Start()+bl, a.Current(newest.Start()+bl).Start())
		})
	}
}

func TestReadsNeverResurrect(t *testing.T) {
	a := newArray(t, 2, time.Second)
	a.Current(0).Value.n.Add(7)
	const later = int64(5 * time.Second)
	assert.Empty(t, visit(a, later))
	assert.Nil(t, a.Previous(later))
	// The stale bucket is still in its slot: reads left it alone, and the
	// first write replaces it with an empty one.
	assert.Equal(t, int64(7), a.slots[0].Load().Value.n.Load())
	w := a.Current(later)
	assert.Zero(t, w.Value.n.Load())
	assert.True(t, a.retiredFrom(a.slots[0].Load()) == false)
}

func TestPrevious(t *testing.T) {
	a := newArray(t, 4, time.Second)
	bl := a.BucketLen()
	assert.Nil(t, a.Previous(0), "nothing before the origin")
	p := a.Current(bl)
	p.Value.n.Add(3)
	assert.Same(t, p, a.Previous(2*bl+1))
	assert.Nil(t, a.Previous(3*bl), "a gap of one bucket: previous is empty")
}

func TestRetiredAndNewest(t *testing.T) {
	a := newArray(t, 2, time.Second)
	bl := a.BucketLen()
	w0 := a.Current(0)
	assert.False(t, a.retiredFrom(w0))
	assert.True(t, a.Newest(w0))
	w1 := a.Current(bl)
	assert.False(t, a.retiredFrom(w0), "w0 is older but still in its slot")
	assert.False(t, a.Newest(w0))
	assert.True(t, a.Newest(w1))
	a.Current(2 * bl)
	assert.True(t, a.retiredFrom(w0))
}

// TestNewestNotYetInItsSlotIsNotRetired builds the instant inside a rotation
// where the new bucket is already newest (Current hands it out) but its slot
// still holds the bucket it replaces.
func TestNewestNotYetInItsSlotIsNotRetired(t *testing.T) {
	a := newArray(t, 2, time.Second)
	bl := a.BucketLen()
	old := a.Current(0)
	a.Current(bl)
	next := &WindowWrap[counter]{slot: 0}
	next.start.Store(2 * bl)
	a.newest.Store(next) // rotate's first store; the slot store has not landed
	require.Same(t, next, a.Current(2*bl), "Current hands out the new bucket")
	assert.False(t, a.retiredFrom(next), "a bucket about to enter its slot is not retired")
	assert.False(t, a.retiredFrom(old), "nor is the one it is about to replace")
	a.slots[0].Store(next)
	assert.False(t, a.retiredFrom(next))
	assert.True(t, a.retiredFrom(old))
}

// TestRotationRaceNeitherLeaksNorErases flips time across bucket boundaries
// while writers run. A writer counts its add as landed only if the bucket was
// not retired after it (and redoes it otherwise). Every bucket still in the
// ring at the end must hold exactly the adds that landed in it: more would be
// a leak from an older window, fewer an erasure by a rotation.
func TestRotationRaceNeitherLeaksNorErases(t *testing.T) {
	a := newArray(t, 2, 2*time.Millisecond)
	var clock atomic.Int64
	const writers, adds = 8, 20000
	landed := make([]map[int64]int64, writers)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				clock.Add(a.BucketLen() / 3)
			}
		}
	}()
	for g := range writers {
		wg.Add(1)
		landed[g] = map[int64]int64{}
		go func() {
			defer wg.Done()
			for range adds {
				for {
					w := a.Current(clock.Load())
					w.Value.n.Add(1)
					if !a.retiredFrom(w) {
						landed[g][w.Start()]++
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	var total int64
	for _, m := range landed {
		for _, n := range m {
			total += n
		}
	}
	require.Equal(t, int64(writers*adds), total)
	for i := range a.slots {
		w := a.slots[i].Load()
		if w.Start() == emptyStart {
			continue
		}
		var want int64
		for _, m := range landed {
			want += m[w.Start()]
		}
		assert.Equal(t, want, w.Value.n.Load(), "bucket %d", w.Start())
	}
}

func TestReadsAllocateNothing(t *testing.T) {
	a := newArray(t, 10, time.Second)
	for now := int64(0); now < int64(time.Second); now += a.BucketLen() {
		a.Current(now).Value.n.Inc()
	}
	now := int64(time.Second) - 1
	var sum int64
	allocs := testing.AllocsPerRun(100, func() {
		forEach(a, now, func(w *WindowWrap[counter]) bool { sum += w.Value.n.Load(); return true })
		a.Current(now).Value.n.Inc()
		_ = a.Previous(now)
	})
	assert.Zero(t, allocs)
}

// TestSupersedeOncePerBucketBeforeRetire walks time forward in steps and
// jumps: every bucket made is superseded exactly once, when the next one is
// made, and always before it retires.
func TestSupersedeOncePerBucketBeforeRetire(t *testing.T) {
	for _, n := range []int{1, 2, 4} {
		bl := int64(time.Second) / int64(n)
		var events []string
		superseded := map[*WindowWrap[counter]]int{}
		a, err := New(n, time.Second, Hooks[counter]{
			Supersede: func(prev *WindowWrap[counter]) {
				superseded[prev]++
				events = append(events, fmt.Sprintf("s%d", prev.Start()/bl))
			},
			Retire: func(old *WindowWrap[counter]) {
				assert.Equal(t, 1, superseded[old], "n=%d: retired before superseded", n)
				events = append(events, fmt.Sprintf("r%d", old.Start()/bl))
			},
		})
		require.NoError(t, err)
		var made []*WindowWrap[counter]
		for _, step := range []int64{0, 1, 2, 3, 7, 8, 20} {
			w := a.Current(step * bl)
			if len(made) == 0 || made[len(made)-1] != w {
				made = append(made, w)
			}
			a.Current(step * bl) // no new bucket: no event
		}
		for i, w := range made {
			want := 1
			if i == len(made)-1 {
				want = 0 // still newest
			}
			assert.Equal(t, want, superseded[w], "n=%d bucket %d", n, w.Start()/bl)
		}
		assert.Equal(t, len(made)-1, len(superseded), "n=%d: %v", n, events)
	}
}

// forEach calls fn with every bucket valid at now over the whole ring.
func forEach[T any](a *LeapArray[T], now int64, fn func(w *WindowWrap[T]) bool) {
	for w := range a.Within(a.Clamp(now), a.Interval()) {
		if !fn(w) {
			return
		}
	}
}

// TestRetireStaleRetiresOnce: RetireStale retires every bucket a window
// and a bucket old, except the newest, once; range readers skip it, and
// the rotation that later reuses its slot does not retire it again.
func TestRetireStaleRetiresOnce(t *testing.T) {
	var retired []int64
	a, err := New(4, time.Second, Hooks[int64]{Retire: func(old *WindowWrap[int64]) { retired = append(retired, old.Start()) }})
	require.NoError(t, err)
	ms := int64(time.Millisecond)
	a.Current(0)
	a.Current(250 * ms)
	a.Current(500 * ms)
	a.RetireStale(1700 * ms)
	assert.Equal(t, []int64{0, 250 * ms}, retired, "start + 1 s + 250 ms <= now, and not the newest (500 ms)")
	a.RetireStale(1700 * ms)
	assert.Len(t, retired, 2, "once")
	var left []int64
	for w := range a.Buckets(0, 2000*ms) {
		left = append(left, w.Start())
	}
	assert.Equal(t, []int64{500 * ms}, left, "range readers skip what was retired")
	a.Current(1000 * ms) // reuses the slot of 0
	a.Current(1250 * ms) // and of 250 ms
	assert.Len(t, retired, 2, "a settled bucket is not retired again by its replacement")
	a.Current(1500 * ms) // reuses the slot of 500 ms: a normal retirement
	assert.Equal(t, []int64{0, 250 * ms, 500 * ms}, retired)
}
