package window

import (
	stdatomic "sync/atomic"

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
// not, and the writer makes it again on the newest bucket). An untagged
// word reads as sealed from sealBit/2 up, so counts may be anywhere in
// (-sealBit/2, sealBit/2): a correction may take a word below zero.
const sealBit = 1 << 62

// load reads an untagged counter word without its seal, in a few
// branchless instructions (window sums run it per stripe).
func load(c *atomic.Int64) int64 {
	v := c.Load()
	return v - (v+sealBit/2)&sealBit
}

// sealed reports whether v, a value an add to an untagged word returned,
// landed after the seal.
func sealed(v int64) bool { return v >= sealBit/2 }

// # Generations
//
// A window reuses its buckets: a rotation resets the bucket leaving a slot
// and puts it back for the new start, so that steady traffic allocates
// nothing. A caller that loaded the bucket before the reset may still
// write to it after. Two kinds of word tell such writes apart:
//
//   - Untagged words (block, success, exception, RT and their frozen
//     sums) only count statistics. A reset zeroes them after the retire
//     sealed them: a late add that lands before the zeroing finds the seal
//     and is made again on the newest bucket; one that lands after counts
//     in the reused bucket, which is then the newest (or, once superseded,
//     sealed again), as a late writer clamped to the newest bucket would.
//   - Tagged words (the admission words used, taken and granted, the
//     direct and occupied passes and the frozen passes) decide admissions
//     and take corrections, so every write to them must land in the
//     generation its writer read. They hold the bucket's generation tag
//     above a biased count, and are only written by compare-and-swap
//     against a value of the writer's generation: a write meant for an
//     older generation fails, and the writer learns that the bucket
//     retired (its counts handed over) instead.
//
// A tagged word is sealBit (frozen, or retired for the frozen words) | tag
// << countBits | count + countBias. The generation word gen holds the tag
// of the current generation over a zero count: the value every tagged word
// is reset to.
//
// Tags are 8 bits, which leaves counts 53 bits and a sign (MaxCount, about
// 9e15: an hour at 1e12 a second, flow's largest window, fits), and a tag
// only has to tell apart the generations a bucket goes through between
// two adjacent steps of one writer: every writer that can be arbitrarily
// late (a Cancel, an Unborrow) first checks the bucket's start, which
// changes with every reuse, and a bucket is reused at most every second
// rotation (it must be retired in between), so a tag comes back only
// after 512 rotations or more (n+1 x 256 under steady traffic).
const (
	countBits = 54
	countBias = 1 << (countBits - 1)
	countMask = 1<<countBits - 1
	// tagMask keeps a tag below sealBit.
	tagMask = 1<<(62-countBits) - 1
	// MaxCount bounds the passes a bucket counts (2^53 - 1): counts stay
	// within (-MaxCount, MaxCount). Admission caps a threshold there, and
	// passes added beyond it are dropped (see Window.AddOn).
	MaxCount = countBias - 1
)

// countOf returns the count a tagged word's value holds.
func countOf(v int64) int64 { return v&countMask - countBias }

// loadT reads a tagged word's count.
func loadT(c *atomic.Int64) int64 { return countOf(c.Load()) }

// inGen reports whether v, a tagged word's value, is of generation g (a
// gen word) and not sealed.
func inGen(v, g int64) bool { return (v^g)>>countBits == 0 }

// sealedIn reports whether v is of generation g and sealed.
func sealedIn(v, g int64) bool { return (v^g)>>countBits == sealBit>>countBits }

// nextGen returns the generation word after g.
func nextGen(g int64) int64 {
	return ((g>>countBits+1)&tagMask)<<countBits | countBias
}

// addSat is addIn for counts that no threshold bounds (passes added
// without admission, and their hand-overs): the count stays within
// [-MaxCount, MaxCount], what goes beyond is dropped.
func addSat(c *atomic.Int64, g, n int64) bool {
	n = min(max(n, -2*MaxCount), 2*MaxCount)
	for {
		v := c.Load()
		if !inGen(v, g) {
			return false
		}
		k := countOf(v)
		if c.CompareAndSwap(v, v-k+min(max(k+n, -MaxCount), MaxCount)) {
			return true
		}
	}
}

// tagged reports whether stripe word i is tagged.
func tagged(i int) bool { return i == stripeUsed || i == stripeTaken || i == stripeDirect }

// addIn adds n to tagged word c if it is of generation g and not sealed,
// and reports whether it did.
func addIn(c *atomic.Int64, g, n int64) bool {
	for {
		v := c.Load()
		if !inGen(v, g) {
			return false
		}
		if c.CompareAndSwap(v, v+n) {
			return true
		}
	}
}

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
	mask    int32
	// direct is set once the bucket counts a pass without admission, so
	// that leasing (which must count those) only then reads every stripe:
	// a read of other Ps' lines on every refusal would bounce them.
	// (The standard library's Bool: four bytes, where go.uber.org/atomic's
	// takes eight and would push min RT off the line.)
	direct stdatomic.Bool
	// gen is the generation word: the current generation's tag over a zero
	// count (see Generations). A reset changes it before any other word.
	gen atomic.Int64
	// base caches the Pass of the other buckets in this bucket's window
	// (baseUnknown of the bucket's start until known). While this bucket
	// is current that set of buckets is fixed, and none of them can gain
	// a pass once this bucket is published (see Window.Admit), so
	// admission needs no walk over the ring.
	base atomic.Int64
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

// baseUnknown is the base of a bucket starting at start until a lease
// sums it: negative, and different for every start the bucket is given,
// so that a lease computing the base of one generation cannot store it
// into the next.
func baseUnknown(start int64) int64 { return -2 - start }

// baseStart returns the start a baseUnknown value stands for.
func baseStart(v int64) int64 { return -2 - v }

func (b *bucket) init(start int64, stripes int) {
	b.stripes = make([]stripe, stripes)
	b.mask = int32(stripes - 1)
	b.gen.Store(countBias)
	b.clear(start, countBias)
}

// reuse resets a retired bucket for start, in a new generation. It runs
// under the rotation lock, while the ring hides the bucket from every time
// (see ring.Reuse).
func (b *bucket) reuse(start int64) {
	g := nextGen(b.gen.Load())
	b.gen.Store(g) // first: a tagged write of the old generation fails from here on
	b.clear(start, g)
}

// clear sets every word to zero in generation g.
func (b *bucket) clear(start, g int64) {
	for j := range b.stripes {
		st := &b.stripes[j]
		for i := range st.c {
			if tagged(i) {
				st.c[i].Store(g)
			} else {
				st.c[i].Store(0)
			}
		}
	}
	b.base.Store(baseUnknown(start))
	b.direct.Store(false)
	b.rest.Store(sumUnknown)
	b.minRT.Store(0)
	b.granted.Store(g)
	b.occupied.Store(g)
	b.spread.Store(false)
	b.maxConc.Store(0)
	for e := range b.fz {
		b.fz[e].Store(0)
	}
	b.fz[Pass].Store(g)
	b.frozen.Store(false)
}

// stripeOn returns the stripe for hint p (a P index from Pin; any value is
// correct, the caller's P is fastest).
func (b *bucket) stripeOn(p int) *stripe { return &b.stripes[p&int(b.mask)] }

// sum adds untagged word i over the stripes.
func (b *bucket) sum(i int) int64 {
	var s int64
	for j := range b.stripes {
		s += load(&b.stripes[j].c[i])
	}
	return s
}

// sumT adds tagged word i over the stripes.
func (b *bucket) sumT(i int) int64 {
	var s int64
	for j := range b.stripes {
		s += loadT(&b.stripes[j].c[i])
	}
	return s
}

// passes returns the bucket's passes: admitted and added directly.
func (b *bucket) passes() int64 {
	if b.frozen.Load() {
		return loadT(&b.fz[Pass])
	}
	return b.livePasses()
}

// livePasses sums the passes over the stripes.
func (b *bucket) livePasses() int64 {
	var s int64
	for j := range b.stripes {
		st := &b.stripes[j]
		s += loadT(&st.c[stripeUsed]) + loadT(&st.c[stripeDirect])
	}
	return s
}

// get returns the count of event e.
func (b *bucket) get(e Event) int64 {
	switch {
	case e == OccupiedPass:
		return loadT(&b.occupied)
	case e == Pass:
		return b.passes()
	case b.frozen.Load():
		return load(&b.fz[e])
	}
	return b.sum(stripeOf[e])
}

// committed is what the bucket holds against a threshold: everything leased
// out plus passes added directly. It is at least get(Pass).
func (b *bucket) committed() int64 { return loadT(&b.granted) + b.directSum() }

// directSum is the passes added without admission.
func (b *bucket) directSum() int64 {
	if !b.direct.Load() {
		return 0
	}
	return b.sumT(stripeDirect)
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
			v := st.c[i].Add(sealBit) - sealBit
			if tagged(i) {
				v = countOf(v)
			}
			w[i] += v
		}
	}
	b.fz[Pass].Add(min(max(w[stripeUsed]+w[stripeDirect], -MaxCount), MaxCount)) // see addSat
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
		Pass: countOf(b.fz[Pass].Add(sealBit)), Block: b.fz[Block].Add(sealBit) - sealBit,
		Success: b.fz[Success].Add(sealBit) - sealBit, Exception: b.fz[Exception].Add(sealBit) - sealBit,
		RT: b.fz[RT].Add(sealBit) - sealBit, Occupied: countOf(b.occupied.Add(sealBit)),
		MinRT: -1, MaxConcurrency: b.maxConcurrency(),
	}
	if v, ok := b.lowestRT(); ok {
		c.MinRT = v
	}
	return c
}
