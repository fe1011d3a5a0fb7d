package window

import (
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// The words of a stripe.
const (
	stripeBlock = iota
	stripeSuccess
	stripeException
	stripeRT
	// stripeUsed counts passes admitted from this stripe's lease.
	stripeUsed
	// stripeTaken counts the tokens leased to this stripe; stripeUsed may
	// only pass it transiently, while an admission backs out.
	stripeTaken
	// stripeDirect counts passes added without admission (Add of Pass).
	stripeDirect
	stripeWords
)

var stripeOf = [numEvents]int{Block: stripeBlock, Success: stripeSuccess, Exception: stripeException, RT: stripeRT}

// sealBit marks a word that no longer takes counts. When a bucket freezes
// (a newer one was made) a rotation adds sealBit to every stripe word a
// writer may still be adding to, and the values those adds return are what
// the bucket counted, summed into its frozen words; when it retires (leaves
// the ring) the frozen words are sealed the same way and handed over. A
// writer that raced the rotation learns from the value its own add returns
// whether it landed before the seal (it is counted there) or after (it is
// not, and the writer makes it again on the newest bucket). A word
// reads as sealed from sealBit/2 up, so counts may be anywhere in
// (-sealBit/2, sealBit/2): a correction may take a word below zero.
const sealBit = 1 << 62

// load reads a counter word without its seal, in a few branchless
// instructions (window sums run it per stripe).
func load(c *atomic.Int64) int64 {
	v := c.Load()
	return v - (v+sealBit/2)&sealBit
}

// sealed reports whether v, a value an add returned, landed after the seal.
func sealed(v int64) bool { return v >= sealBit/2 }

// stripe holds one P's share of a bucket's counters, alone on its cache
// line: everything a request writes on its way in and out.
type stripe struct {
	c [stripeWords]atomic.Int64
	_ [cpu.CacheLine - stripeWords*8]byte
}

// bucket holds the counts of one time bucket. Its zero value is not usable:
// buckets are made by a Window. A bucket is safe for simultaneous use by
// multiple goroutines and must not be copied after first use.
//
// # Admission by leases
//
// Passes are counted per stripe, so admitting a request touches only the
// caller's cache line. The window's budget is handed to stripes in leases:
// granted is the one shared word, the total leased out of the bucket, and
// Admit moves tokens from it to a stripe's taken count by compare-and-swap,
// checking that the window stays within the threshold. A stripe then admits
// locally while used <= taken. Leases shrink with the room left (down to the
// request itself near the threshold) and die with their bucket, so the
// threshold holds in every window; tokens leased and not used go back to
// the bucket when a request on another stripe finds no room (reclaim).
type bucket struct {
	// Read-mostly: set before the bucket is published, except base, which
	// the first lease sets once.
	stripes []stripe
	mask    int
	// base caches the Pass of the other buckets in this bucket's window
	// (-1 until known). While this bucket is current that set of buckets is
	// fixed, and none of them can gain a pass once this bucket is published
	// (see Window.Admit), so admission needs no walk over the ring.
	base atomic.Int64
	// direct is set once the bucket counts a pass without admission, so
	// that leasing (which must count those) only then reads every stripe:
	// a read of other Ps' lines on every refusal would bounce them.
	direct atomic.Bool
	// rest caches, while this bucket is the newest, the frozen passes of
	// the rest of its window (see Reader.Sum), or holds sumUnknown or the
	// token of a fill in progress (both negative).
	rest atomic.Int64
	// minRT holds the minimum RT plus one (0: none yet). Every completion
	// reads it and few write it (a bucket's minimum settles after its
	// first completions), so it shares the read-mostly line that every
	// completion reads anyway.
	minRT atomic.Int64
	_     [cpu.CacheLine]byte

	// granted is the total leased to stripes (and folded in from borrows);
	// occupied counts borrowed admissions folded in.
	granted  atomic.Int64
	occupied atomic.Int64
	// spread is set when a lease gave a stripe more than its request:
	// tokens a stripe may hold unused while requests on other stripes
	// find no room (see Window.reclaim).
	spread atomic.Bool
	_      [cpu.CacheLine - 20]byte

	// maxConc is the largest concurrency seen: read on every update and
	// written only when it improves.
	maxConc atomic.Int64
	// fz holds, once frozen is set, the bucket's count of each event Pass
	// to RT summed over the stripes (see freeze): a read of a bucket that is
	// no longer the newest costs this one line, however many stripes it
	// has. The line is read-mostly: max concurrency is written only when it
	// improves, fz and frozen once.
	fz     [RT + 1]atomic.Int64
	frozen atomic.Bool
	_      [cpu.CacheLine - 8 - (RT+1)*8 - 4]byte
}

func (b *bucket) init(stripes int) {
	b.stripes = make([]stripe, stripes)
	b.mask = stripes - 1
	b.base.Store(-1)
	b.rest.Store(sumUnknown)
}

// stripeOn returns the stripe for hint p (a P index from Pin; any value is
// correct, the caller's P is fastest).
func (b *bucket) stripeOn(p int) *stripe { return &b.stripes[p&b.mask] }

// addOn adds n to event e on stripe p and returns the word's new value (see
// sealed).
func (b *bucket) addOn(p int, e Event, n int64) int64 {
	switch e {
	case Pass:
		if !b.direct.Load() {
			b.direct.Store(true)
		}
		return b.stripeOn(p).c[stripeDirect].Add(n)
	case OccupiedPass:
		return b.occupied.Add(n)
	default:
		return b.stripeOn(p).c[stripeOf[e]].Add(n)
	}
}

// sum adds word i over the stripes.
func (b *bucket) sum(i int) int64 {
	var s int64
	for j := range b.stripes {
		s += load(&b.stripes[j].c[i])
	}
	return s
}

// passes returns the bucket's passes: admitted and added directly.
func (b *bucket) passes() int64 {
	if b.frozen.Load() {
		return load(&b.fz[Pass])
	}
	return b.livePasses()
}

// livePasses sums the passes over the stripes.
func (b *bucket) livePasses() int64 {
	var s int64
	for j := range b.stripes {
		st := &b.stripes[j]
		s += load(&st.c[stripeUsed]) + load(&st.c[stripeDirect])
	}
	return s
}

// get returns the count of event e.
func (b *bucket) get(e Event) int64 {
	switch {
	case e == OccupiedPass:
		return load(&b.occupied)
	case b.frozen.Load():
		return load(&b.fz[e])
	case e == Pass:
		return b.passes()
	}
	return b.sum(stripeOf[e])
}

// committed is what the bucket holds against a threshold: everything leased
// out plus passes added directly. It is at least get(Pass).
func (b *bucket) committed() int64 { return b.granted.Load() + b.directSum() }

// directSum is the passes added without admission.
func (b *bucket) directSum() int64 {
	if !b.direct.Load() {
		return 0
	}
	return b.sum(stripeDirect)
}

// updateMinRT lowers the bucket's minimum RT to rt if rt is smaller.
func (b *bucket) updateMinRT(rt int64) {
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

// lowestRT returns the minimum RT recorded, and false if none was.
func (b *bucket) lowestRT() (int64, bool) {
	v := b.minRT.Load()
	return v - 1, v != 0
}

// updateConcurrency raises the bucket's maximum concurrency to c if c is
// larger.
func (b *bucket) updateConcurrency(c int64) {
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

// maxConcurrency returns the largest concurrency recorded (0 if none).
func (b *bucket) maxConcurrency() int64 { return b.maxConc.Load() }

// Counts is what a bucket held when it retired: what WithHandover hands
// over and Window.Absorb takes in.
type Counts struct {
	Pass, Block, Success, Exception, RT, Occupied int64
	// MinRT is the smallest RT recorded, -1 if none was.
	MinRT          int64
	MaxConcurrency int64
}

// sealedWords are the stripe words a writer may add to without holding a
// lease: all but stripeTaken, which only a lease on the newest bucket moves.
var sealedWords = [...]int{stripeBlock, stripeSuccess, stripeException, stripeRT, stripeUsed, stripeDirect}

// freeze runs once, under the rotation lock, when the bucket stops being the
// newest: nothing but writers that loaded it earlier can reach it from then
// on. It seals the stripe words (see sealBit) and adds what they held into
// fz. A writer whose add lands after the seal makes it again on the newest
// bucket; one that takes back an add that landed before it takes it back
// from fz too (Window.backOut).
func (b *bucket) freeze() {
	var w [stripeWords]int64
	for j := range b.stripes {
		st := &b.stripes[j]
		for _, i := range sealedWords {
			w[i] += st.c[i].Add(sealBit) - sealBit
		}
	}
	b.fz[Pass].Add(w[stripeUsed] + w[stripeDirect])
	b.fz[Block].Add(w[stripeBlock])
	b.fz[Success].Add(w[stripeSuccess])
	b.fz[Exception].Add(w[stripeException])
	b.fz[RT].Add(w[stripeRT])
	b.frozen.Store(true)
}

// seal runs once, under the rotation lock, when the bucket leaves the ring
// (after its freeze): it seals fz and the occupied word and returns the
// counts they held, the bucket's final counts. Min RT and max concurrency
// are read after the seal: every writer updates them before the add that
// the seal orders (CompleteOn), so those that landed before it are seen.
func (b *bucket) seal() Counts {
	c := Counts{
		Pass: b.fz[Pass].Add(sealBit) - sealBit, Block: b.fz[Block].Add(sealBit) - sealBit,
		Success: b.fz[Success].Add(sealBit) - sealBit, Exception: b.fz[Exception].Add(sealBit) - sealBit,
		RT: b.fz[RT].Add(sealBit) - sealBit, Occupied: b.occupied.Add(sealBit) - sealBit,
		MinRT: -1, MaxConcurrency: b.maxConcurrency(),
	}
	if v, ok := b.lowestRT(); ok {
		c.MinRT = v
	}
	return c
}
