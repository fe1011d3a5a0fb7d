package metric

import (
	"math/bits"
	"runtime"

	"go.uber.org/atomic"
)

// CacheLine is the size hot counters are padded to: the line of x86-64 and
// of most arm64 cores. Cores with 128-byte lines (Apple M-series) still keep
// padded counters apart; only a pair of adjacent stripes may then share one.
const CacheLine = 64

// Striped events live in stripes; Pass and OccupiedPass do not.
const (
	stripeBlock = iota
	stripeSuccess
	stripeException
	stripeRT
	stripedEvents
)

var stripeOf = [numEvents]int{Block: stripeBlock, Success: stripeSuccess, Exception: stripeException, RT: stripeRT}

// stripe holds one share of the summed counters, alone on its cache line.
type stripe struct {
	c [stripedEvents]atomic.Int64
	_ [CacheLine - stripedEvents*8]byte
}

// MaxStripes caps the stripes per bucket: beyond it, memory grows faster
// than contention falls.
const MaxStripes = 64

// DefaultStripes returns the stripe count used when none is configured:
// GOMAXPROCS rounded up to a power of two, at most MaxStripes.
func DefaultStripes() int { return roundStripes(runtime.GOMAXPROCS(0)) }

func roundStripes(n int) int {
	if n <= 1 {
		return 1
	}
	if n > MaxStripes {
		return MaxStripes
	}
	return 1 << bits.Len(uint(n-1))
}

// Bucket holds the counts of one time bucket. Its zero value is not usable:
// buckets are made by a Window. A Bucket is safe for simultaneous use by
// multiple goroutines and must not be copied after first use.
type Bucket struct {
	// Read-mostly: set before the bucket is published, except base, which
	// the first Reserve sets once.
	stripes []stripe
	mask    int
	// base caches the Pass of the other buckets in this bucket's window
	// (-1 until known). While this bucket is current that set of buckets is
	// fixed, and none of them can gain a pass once this bucket is published
	// (see Window.Reserve), so Reserve needs no walk over the ring.
	base atomic.Int64
	_    [CacheLine]byte

	// pass is the word Reserve compares-and-swaps; it gets a line of its own
	// so admissions do not evict the read-mostly fields above.
	pass     atomic.Int64
	occupied atomic.Int64
	_        [CacheLine - 16]byte

	// minRT holds the minimum RT plus one (0: none yet) and maxConc the
	// largest concurrency seen. Both are read on every update and written
	// only when they improve.
	minRT   atomic.Int64
	maxConc atomic.Int64
	_       [CacheLine - 16]byte
}

func (b *Bucket) init(stripes int) {
	b.stripes = make([]stripe, stripes)
	b.mask = stripes - 1
	b.base.Store(-1)
}

func (b *Bucket) stripe() *stripe { return &b.stripes[pid()&b.mask] }

// Add adds n to event e.
func (b *Bucket) Add(e Event, n int64) {
	switch e {
	case Pass:
		b.pass.Add(n)
	case OccupiedPass:
		b.occupied.Add(n)
	default:
		b.stripe().c[stripeOf[e]].Add(n)
	}
}

// Get returns the count of event e.
func (b *Bucket) Get(e Event) int64 {
	switch e {
	case Pass:
		return b.pass.Load()
	case OccupiedPass:
		return b.occupied.Load()
	}
	i := stripeOf[e]
	var sum int64
	for s := range b.stripes {
		sum += b.stripes[s].c[i].Load()
	}
	return sum
}

// UpdateMinRT lowers the bucket's minimum RT to rt if rt is smaller.
func (b *Bucket) UpdateMinRT(rt int64) {
	v := rt + 1
	for {
		cur := b.minRT.Load()
		if cur != 0 && cur <= v {
			return // not an improvement: the common case costs one load
		}
		if b.minRT.CompareAndSwap(cur, v) {
			return
		}
		// Another writer changed it; re-read and compare again.
	}
}

// MinRT returns the minimum RT recorded, and false if none was.
func (b *Bucket) MinRT() (int64, bool) {
	v := b.minRT.Load()
	return v - 1, v != 0
}

// UpdateConcurrency raises the bucket's maximum concurrency to c if c is
// larger.
func (b *Bucket) UpdateConcurrency(c int64) {
	for {
		cur := b.maxConc.Load()
		if c <= cur {
			return
		}
		if b.maxConc.CompareAndSwap(cur, c) {
			return
		}
	}
}

// MaxConcurrency returns the largest concurrency recorded (0 if none).
func (b *Bucket) MaxConcurrency() int64 { return b.maxConc.Load() }
