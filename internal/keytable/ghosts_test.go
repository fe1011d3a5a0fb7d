package keytable

import (
	"fmt"
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
		require.False(t, g.put(Window, h, ghostOf(c), now), "4 x 1024 live ghosts fit a table of 1024")
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

// When both of a key's buckets are full of live ghosts, the one whose key
// gains least goes, and is counted: the smallest count.
func TestGhostsForgetTheKeyThatGainsLeast(t *testing.T) {
	g := &ghosts{slots: make([]ghost, ghostWays), buckets: 1} // one bucket: every key's
	const now = 50
	for i := range ghostWays {
		g.put(Window, uint64(i+1), ghostOf(carryOfCounts(now, uint32(10+i))), now)
	}
	assert.True(t, g.put(Window, 99, ghostOf(carryOfCounts(now, 30)), now), "full of live ghosts: one forgotten")
	_, ok := g.take(1)
	assert.False(t, ok, "the key of count 10 went")
	for i := 1; i < ghostWays; i++ {
		_, ok := g.take(uint64(i + 1))
		assert.True(t, ok)
	}
	// A ghost whose window is over is free: no forgetting.
	g.put(Window, 7, ghostOf(carryOfCounts(now-Buckets, 5)), now)
	assert.False(t, g.put(Window, 8, ghostOf(carryOfCounts(now, 5)), now))
}

// A key evicted from a table that then moves to one of another MaxKeys
// (Migrate) finds its counts in the new table.
func TestMigrateMovesWhatEvictedKeysHad(t *testing.T) {
	var now int64
	old := newWindowTable(4, &now)
	for k := range 12 {
		st := old.Get(fmt.Sprint("k", k))
		_, _, ok, _ := old.Admit(st, now, 3, 3)
		require.True(t, ok)
	}
	next := newWindowTable(64, &now)
	next.Migrate(old)
	for k := range 12 {
		_, _, ok, _ := next.Admit(next.Get(fmt.Sprint("k", k)), now, 1, 3)
		assert.False(t, ok, "key %d: its 3 of 3 kept", k)
	}
}
