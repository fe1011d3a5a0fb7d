package keytable

import (
	"math/bits"

	"github.com/leapflow/leapflow/internal/pace"

	"go.uber.org/atomic"
)

// sketch keeps what active keys had when they were evicted, so that a key
// evicted and seen again starts from it (see Table). It has two rows of
// cells, each indexed by its own bits of the key's hash; a cell keeps,
// bucket by bucket, the largest count any key written to it had (Window),
// or the latest timeline head (Pace). A key's estimate is the smaller of
// its two cells, never below what it had: keys that share a cell can only
// be made stricter, for what remains of that window.
//
// Counts stay in the buckets they were made in, so they leave the key's
// window when they would have; a key evicted again and again is not held
// beyond its own counts.
type sketch struct {
	counts []atomic.Pointer[carry] // Window: 2 rows of mask+1
	heads  []atomic.Int64          // Pace: 2 rows of mask+1
	mask   uint64
}

// carry is a key's window at eviction: counts by bucket slot for the
// buckets head-Buckets+1 to head. A cell's carry is replaced, never
// changed in place.
type carry struct {
	head   int64
	counts [Buckets]uint32 // per-key limits fit: flow's maxKeyWindowCount
}

// at is the count carried in bucket x (0 outside the carry's window).
func (c *carry) at(x int64) uint32 {
	if x > c.head || x <= c.head-Buckets {
		return 0
	}
	return c.counts[slotOf(x)]
}

// newSketch sizes the sketch to a power of two at least maxKeys cells
// per row: a flood of evicted keys fills about as many cells as the table
// has keys.
func newSketch(maxKeys int, kind Kind) sketch {
	w := uint64(1) << bits.Len64(uint64(max(maxKeys, 512)-1))
	s := sketch{mask: w - 1}
	if kind == Pace {
		s.heads = make([]atomic.Int64, 2*w)
	} else {
		s.counts = make([]atomic.Pointer[carry], 2*w)
	}
	return s
}

// cells returns the indexes of a key's two cells from h, its table's first
// hash (its bits past those that chose the key's sets).
func (s *sketch) cells(h uint64) [2]uint64 {
	h = bits.RotateLeft64(h, 17)
	return [2]uint64{h & s.mask, s.mask + 1 + (h>>32)&s.mask}
}

// addCarry merges c into the key's cells: bucket by bucket, the larger
// count.
func (s *sketch) addCarry(h uint64, c carry) {
	for _, i := range s.cells(h) {
		cell := &s.counts[i]
		for {
			old := cell.Load()
			next := c
			if old != nil && old.head > c.head-Buckets {
				next.head = max(old.head, c.head)
				for x := next.head - Buckets + 1; x <= next.head; x++ {
					next.counts[slotOf(x)] = max(old.at(x), c.at(x))
				}
			}
			if cell.CompareAndSwap(old, &next) {
				break
			}
		}
	}
}

// carryOf is the key's estimate for the window whose newest bucket is b,
// or the newest bucket of its cells if later (a carry made on a clock read
// a little ahead of ours); false if it carries nothing.
func (s *sketch) carryOf(h uint64, b int64) (carry, bool) {
	idx := s.cells(h)
	c0, c1 := s.counts[idx[0]].Load(), s.counts[idx[1]].Load()
	if c0 == nil || c1 == nil {
		return carry{head: b}, false
	}
	b = max(b, c0.head, c1.head)
	est := carry{head: b}
	var any bool
	for x := b - Buckets + 1; x <= b; x++ {
		if n := min(c0.at(x), c1.at(x)); n > 0 {
			est.counts[slotOf(x)] = n
			any = true
		}
	}
	return est, any
}

// addHead records a pacing timeline's head at.
func (s *sketch) addHead(h uint64, at int64) {
	for _, i := range s.cells(h) {
		cell := &s.heads[i]
		for {
			old := cell.Load()
			if old >= at || cell.CompareAndSwap(old, at) {
				break
			}
		}
	}
}

// rescaleHeads rescales every timeline head (see pace.Rescale).
func (s *sketch) rescaleHeads(now int64, ratio float64) {
	for i := range s.heads {
		pace.Rescale(&s.heads[i], now, ratio)
	}
}

// head is the key's estimated timeline head (0: none).
func (s *sketch) head(h uint64) int64 {
	idx := s.cells(h)
	return min(s.heads[idx[0]].Load(), s.heads[idx[1]].Load())
}
