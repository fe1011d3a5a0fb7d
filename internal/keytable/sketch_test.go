package keytable

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
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

func TestSketchNeverEstimatesBelowWhatAKeyHad(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newSketch(512, Window)
	type key struct {
		h uint64
		c carry
	}
	var keys []key
	for range 5000 { // ten times the cells of a row: cells are shared
		k := key{rng.Uint64() | 1, carryOfCounts(100+rng.Int64N(3), rng.Uint32N(9), rng.Uint32N(9), rng.Uint32N(9), rng.Uint32N(9))}
		s.addCarry(k.h, k.c)
		keys = append(keys, k)
	}
	for _, k := range keys {
		est, _ := s.carryOf(k.h, k.c.head)
		assert.GreaterOrEqual(t, est.head, k.c.head)
		// Every bucket of the key's still in the estimate's window.
		for x := est.head - Buckets + 1; x <= k.c.head; x++ {
			assert.GreaterOrEqual(t, est.at(x), k.c.at(x), "key %x, bucket %d", k.h, x)
		}
	}
}

func TestSketchCountsLeaveWithTheirBuckets(t *testing.T) {
	s := newSketch(1, Window)
	const h = 0x1234_5678_9abc_def1
	s.addCarry(h, carryOfCounts(10, 1, 2, 3, 4)) // buckets 7..10
	est, ok := s.carryOf(h, 12)
	assert.True(t, ok)
	assert.Equal(t, int64(12), est.head)
	for x, want := range map[int64]uint32{8: 0, 9: 3, 10: 4, 11: 0, 12: 0} {
		assert.Equal(t, want, est.at(x), "bucket %d", x)
	}
	est, ok = s.carryOf(h, 14)
	assert.False(t, ok, "every bucket left the window: %+v", est)
	assert.Equal(t, int64(14), est.head)
	// A carry read on a clock ahead of ours: its newest bucket.
	est, _ = s.carryOf(h, 5)
	assert.Equal(t, int64(10), est.head)
}

func TestSketchOfAnUnknownKeyCarriesNothing(t *testing.T) {
	s := newSketch(1, Window)
	est, ok := s.carryOf(7, 3)
	assert.False(t, ok)
	assert.Equal(t, carry{head: 3}, est)
	p := newSketch(1, Pace)
	assert.Zero(t, p.head(7))
}

func TestSketchKeepsTheLatestTimelineHead(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s := newSketch(512, Pace)
	heads := map[uint64]int64{}
	for range 5000 {
		h, at := rng.Uint64()|1, rng.Int64N(1e9)
		s.addHead(h, at)
		s.addHead(h, at/2) // an older head changes nothing
		heads[h] = at
	}
	for h, at := range heads {
		assert.GreaterOrEqual(t, s.head(h), at, "key %x", h)
	}
}
