package ring

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An array that reuses buckets holds its slots plus one spare, whatever
// the time does (steps of one bucket, jumps over the whole ring), resets
// each bucket before it is published again, retires each once, and makes
// no bucket once the ring and the spare are filled.
func TestReuseKeepsSlotsPlusOneSpare(t *testing.T) {
	const n = 3
	retired := map[int64]int{}
	var resets int
	a, err := New[counter](n, 3*time.Second, Hooks[counter]{
		Retire: func(old *WindowWrap[counter]) { retired[old.Start()]++ },
	})
	require.NoError(t, err)
	a.Reuse(func(start int64, v *counter) {
		resets++
		v.n.Store(0)
	})
	seen := map[*WindowWrap[counter]]bool{}
	bl := a.BucketLen()
	now := int64(0)
	for i := range 200 {
		step := bl
		if i%17 == 0 {
			step = 5 * bl // a jump over the whole ring
		}
		now += step
		w := a.Current(now)
		seen[w] = true
		require.Equal(t, now, w.Start())
		require.Zero(t, w.Value.n.Load(), "step %d: a reused bucket starts empty", i)
		w.Value.n.Add(1)
	}
	assert.Len(t, seen, n+1, "the slots and one spare")
	assert.Positive(t, resets)
	for start, k := range retired {
		assert.Equal(t, 1, k, "bucket at %d retired once", start)
	}
	allocs := testing.AllocsPerRun(100, func() {
		now += bl
		a.Current(now).Value.n.Add(1)
	})
	assert.Zero(t, allocs, "a rotation allocates nothing")
}

// A caller that still holds a bucket the array reused sees its start
// change: the reused bucket is not the one it loaded.
func TestReusedBucketChangesStart(t *testing.T) {
	a := newArray(t, 2, time.Second)
	a.Reuse(func(int64, *counter) {})
	bl := a.BucketLen()
	held := a.Current(0)
	a.Current(bl)
	a.Current(2 * bl) // held retires: the spare
	assert.Equal(t, int64(0), held.Start(), "a retired bucket keeps its start until reused")
	a.Current(3 * bl) // the spare is reused
	require.Same(t, held, a.Current(3*bl))
	assert.Equal(t, 3*bl, held.Start())
	assert.True(t, a.Newest(held))
}
