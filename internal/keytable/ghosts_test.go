package keytable

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// carryOfCounts is a carry whose newest bucket is head, counts[i] in
// bucket head-len(counts)+1+i.
func carryOfCounts(head int64, counts ...uint32) carry {
	c := carry{head: head}
	for i, n := range counts {
		c.counts[slotOf(head-int64(len(counts))+1+int64(i))] = n
	}
	return c
}

// Each key gets back exactly what it left, once; a key that left nothing
// gets nothing, however many others did (within what the ghosts hold).
func TestGhostsGiveEachKeyItsOwnCountsOnly(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	g := newGhosts(1024)
	const now = 100
	want := map[uint64]carry{}
	for range 4 * 1024 {
		h := rng.Uint64() | 1
		c := carryOfCounts(now-rng.Int64N(2), rng.Uint32N(9)+1, rng.Uint32N(9), rng.Uint32N(9), rng.Uint32N(9))
		require.False(t, g.put(Window, h, ghostOf(c), now, 0), "4 x 1024 live ghosts fit a table of 1024")
		want[h] = c
	}
	for h, c := range want {
		x, ok := g.take(h)
		require.True(t, ok)
		assert.Equal(t, c, x.carryAt(c.head), "key %x", h)
		_, ok = g.take(h)
		assert.False(t, ok, "taken once")
	}
	for range 10_000 {
		_, ok := g.take(rng.Uint64() | 1)
		assert.False(t, ok)
	}
}

// A ghost's counts leave with their buckets: read a window later, only
// those still in it are there.
func TestGhostCountsLeaveWithTheirBuckets(t *testing.T) {
	x := ghostOf(carryOfCounts(10, 1, 2, 3, 4)) // buckets 7..10
	est := x.carryAt(12)
	assert.Equal(t, int64(12), est.head)
	for b, want := range map[int64]uint32{8: 0, 9: 3, 10: 4, 11: 0, 12: 0} {
		assert.Equal(t, want, est.at(b), "bucket %d", b)
	}
	assert.Equal(t, carry{head: 14}, x.carryAt(14), "every bucket left")
	assert.Equal(t, int64(10), x.carryAt(5).head, "read on a clock behind: its own newest bucket")
	y := ghostOf(carryOfCounts(1<<33+10, 1, 2))
	assert.Equal(t, carryOfCounts(1<<33+11, 1, 2, 0), y.carryAt(1<<33+11), "indexes past 32 bits")
}

// 4 x MaxKeys live ghosts fit, at any MaxKeys: none is forgotten.
func TestFourTimesMaxKeysGhostsFit(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	trials := map[int]int{64: 100, 1024: 100, 100_000: 1}
	if testing.Short() {
		trials = map[int]int{1024: 10, 100_000: 1}
	}
	for maxKeys, n := range trials {
		forgot := 0
		for range n {
			g := newGhosts(maxKeys)
			for range 4 * maxKeys {
				if g.put(Window, rng.Uint64()|1, ghostOf(carryOfCounts(10, 1)), 10, 0) {
					forgot++
				}
			}
		}
		assert.Zero(t, forgot, "MaxKeys %d, %d trials", maxKeys, n)
	}
}

// When both of a key's buckets are full of live ghosts, the one whose key
// gains least is forgotten, the smallest count, the incoming one included;
// a ghost whose window is over is free, and a dead one displaces nothing.
func TestGhostsForgetTheKeyThatGainsLeast(t *testing.T) {
	g := &ghosts{buckets: make([]ghostBucket, 1)} // one bucket: every key's
	const now = 50
	for i := range ghostWays {
		require.False(t, g.put(Window, uint64(i+1), ghostOf(carryOfCounts(now, uint32(10+i))), now, 0))
	}
	assert.True(t, g.put(Window, 99, ghostOf(carryOfCounts(now, 30)), now, 0), "full of live ghosts: one forgotten")
	_, ok := g.take(1)
	assert.False(t, ok, "the key of count 10 went")
	_, ok = g.take(99)
	assert.True(t, ok)
	require.False(t, g.put(Window, 1, ghostOf(carryOfCounts(now, 10)), now, 0), "its slot was free again")
	assert.True(t, g.put(Window, 98, ghostOf(carryOfCounts(now, 5)), now, 0), "the incoming ghost gains least: it goes")
	_, ok = g.take(98)
	assert.False(t, ok)
	assert.False(t, g.put(Window, 97, ghostOf(carryOfCounts(now-Buckets, 50)), now, 0), "a ghost whose window is over is not kept, and forgets nothing")
	_, ok = g.take(97)
	assert.False(t, ok)
	for i := range ghostWays {
		_, ok := g.take(uint64(i + 1))
		assert.True(t, ok, "key %d", i+1)
	}

	// Ghosts whose window ended leave their slots free.
	for i := range ghostWays {
		require.False(t, g.put(Window, uint64(i+1), ghostOf(carryOfCounts(now-Buckets+1, 10)), now, 0))
	}
	assert.False(t, g.put(Window, 99, ghostOf(carryOfCounts(now+1, 1)), now+1, 0), "a window over: free, none forgotten")
	_, ok = g.take(99)
	assert.True(t, ok)
}

// A Window ghost read far ahead of now (its 32-bit index wrapped, or the
// clock stepped back by hours) is stale: its key starts afresh rather than
// shut out until the clock catches up.
func TestAStaleGhostIsFree(t *testing.T) {
	x := ghostOf(carryOfCounts(1<<32+5, 9))
	assert.Equal(t, int64(math.MinInt64), ends(Window, &x, 5+1<<31, 0), "2^31 buckets ahead")
	assert.Equal(t, int64(1<<32+5+Buckets), ends(Window, &x, 1<<32+6, 0))
}

// A Pace ghost matters for its rule's slowest slot after its timeline
// head, not a fixed second.
func TestAPaceGhostLivesForItsSlowestSlot(t *testing.T) {
	var x ghost
	x.setTimeline(1e9)
	const slow = 5e9 // a rate of 0.2/s
	assert.Equal(t, int64(6e9), ends(Pace, &x, 3e9, slow))
	g := &ghosts{buckets: make([]ghostBucket, 1)}
	for i := range ghostWays {
		require.False(t, g.put(Pace, uint64(i+1), x, 3e9, slow))
	}
	assert.True(t, g.put(Pace, 99, x, 3e9, slow), "all live at 3 s: one forgotten")
}

// A key evicted from a table that then moves to one of another MaxKeys
// (Migrate) finds its counts in the new table.
func TestMigrateMovesWhatEvictedKeysHad(t *testing.T) {
	var now int64
	old := newWindowTable(4, &now)
	for k := range 12 {
		st, stL := old.Get(fmt.Sprint("k", k))
		_, _, ok, _ := old.Admit(st, stL, now, 3, 3)
		require.True(t, ok)
	}
	next := newWindowTable(64, &now)
	next.Migrate(old)
	for k := range 12 {
		_, _, ok, _ := admitKey(next, fmt.Sprint("k", k), now, 1, 3)
		assert.False(t, ok, "key %d: its 3 of 3 kept", k)
	}
}

// The ghosts start at an eighth of their most and double only when a
// ghost that matters would be forgotten: a table that evicts a few keys
// costs a few slots, one flooded gets them all, and none is forgotten on
// the way.
func TestGhostsGrowOnlyWhenTheyWouldForget(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	g := newGhosts(1024)
	start := len(g.buckets)
	assert.Equal(t, max(g.most/8, 4), start)
	for range 100 {
		require.False(t, g.put(Window, rng.Uint64()|1, ghostOf(carryOfCounts(10, 1)), 10, 0))
	}
	assert.Equal(t, start, len(g.buckets), "100 ghosts fit the first buckets")
	for range 4*1024 - 100 {
		require.False(t, g.put(Window, rng.Uint64()|1, ghostOf(carryOfCounts(10, 1)), 10, 0))
	}
	assert.Greater(t, len(g.buckets), start)
	assert.LessOrEqual(t, len(g.buckets), g.most)
	// Ghosts that no longer matter are not carried when they grow.
	old := newGhosts(1024)
	for range len(old.buckets) * ghostWays {
		old.put(Window, rng.Uint64()|1, ghostOf(carryOfCounts(0, 1)), 0, 0)
	}
	n := 0
	old.each(func(uint64, *ghost) bool { n++; return false })
	require.Positive(t, n)
	require.True(t, old.double(Window, 100, 0))
	n = 0
	old.each(func(uint64, *ghost) bool { n++; return false })
	assert.Zero(t, n, "windows long over")
}
