// Package slots records flow's admissions so that Exit releases each at
// most once, however many copies of its Entry exit, and so that a
// Concurrency rule loaded while requests are in flight can count them: the
// admission slots. It needs no Engine: flow's Entry carries the slot and
// the word it claimed it with, and the owner (the engine) comes back from
// the slot.
package slots

import (
	"math"
	"sync"
	"unsafe"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/stat"
)

// An admission is recorded in a slot so that Exit releases it at most once,
// however many copies of its Entry exit: the Entry carries the slot and the
// word it claimed it with, and Exit releases only if it moves the slot from
// that generation to the next. A stale copy finds a later generation and
// does nothing. Slots are claimed from a small ring per P, so the pass path
// allocates nothing and touches a line its P owns; when every slot near the
// ring's cursor is held (many long admissions), one comes from a shared
// overflow list.
//
// The slot also says whether the admission is counted in its node's
// concurrency, which Exit then gives back: counted at admission by a
// Concurrency rule, or later, when a rule set that adds one is loaded while
// the admission is in flight (see Track).
type Slot[O any] struct {
	// word is the slot's generation times slotGen plus the flags.
	word atomic.Uint64
	// node and n are the holder's, for Track. The holder stores
	// them after claiming, and only when they differ from the last
	// holder's (the usual case is the same hot resource), so they can be
	// stale for a moment: see Track.
	node atomic.Pointer[stat.Node]
	n    atomic.Int64
	// kc is the key state a PerKey Concurrency rule counted the holder in
	// (nil: none), stored like node; only the holder reads it.
	kc atomic.Pointer[keytable.State]
	kt atomic.Pointer[keytable.Table]
	// walkedNode and walkedN are what track counted the admission as;
	// written before slotWalked is set, and never while it is.
	walkedNode atomic.Pointer[stat.Node]
	walkedN    atomic.Int64
	// owner is whose slots these are (flow's Exit needs its engine).
	owner *O
	// overflow is set on slots of the overflow list, which go back to it.
	overflow bool
}

const (
	slotHeld    = 1 << iota // an admission holds the slot
	slotCounted             // counted in the holder's node's concurrency
	slotWalked              // counted in walkedNode's concurrency by track
	// The holder's tag (see tagOf) sits in the next tagBits bits, then the
	// generation.
	tagShift  = iota
	tagBits   = 20
	tagMask   = 1<<tagBits - 1
	slotGen   = 1 << (tagShift + tagBits) // one generation
	slotFlags = slotGen - 1               // the flags and the tag
)

// tagOf is a hash of a holder's node and count. The claim writes it into
// the slot's word with the held bit, in the one compare-and-swap that
// claims, so that track can tell node and count fields a new holder has
// not stored yet (they are the previous holder's) from its own: a walk
// counts only slots whose fields match their tag. Two holders share a tag
// with odds of 2^-20, and then only in the instant between a claim and its
// stores.
func tagOf(node *stat.Node, n int64) uint64 {
	h := uint64(uintptr(unsafe.Pointer(node)))*0x9E3779B97F4A7C15 ^ uint64(n)*0xC2B2AE3D27D4EB4F
	return (h >> 40) & tagMask
}

// ringSize is the slots per P: an admission that outlives ringSize later
// admissions on its P only makes claims probe past it, and ringProbe held
// slots in a row send a claim to the overflow list.
const (
	ringSize  = 64
	ringProbe = 4
)

type ring[O any] struct {
	slots [ringSize]Slot[O]
	_     [cpu.CacheLine]byte // the next ring's first slot on another line
}

// Slots are an owner's rings, one per stripe, and its overflow slots.
type Slots[O any] struct {
	owner *O
	rings []ring[O]
	mask  int

	mu   sync.Mutex // guards the overflow list: the rare path
	free []*Slot[O]
	all  []*Slot[O]
}

// New returns the slots of owner, a ring per stripe.
func New[O any](owner *O) *Slots[O] {
	n := cpu.Stripes()
	s := &Slots[O]{owner: owner, rings: make([]ring[O], n), mask: n - 1}
	for i := range s.rings {
		for j := range s.rings[i].slots {
			s.rings[i].slots[j].owner = owner
		}
	}
	return s
}

// Owner returns whose slot sl is.
func (sl *Slot[O]) Owner() *O { return sl.owner }

// Claim takes a free slot on stripe p for an admission of n on node
// (counted in its concurrency if counted) and returns it with the word to
// release it with.
func (s *Slots[O]) Claim(p int, node *stat.Node, n int64, counted bool, kc *keytable.State, kt *keytable.Table) (*Slot[O], uint64) {
	flags := uint64(slotHeld) | tagOf(node, n)<<tagShift
	if counted {
		flags |= slotCounted
	}
	r := &s.rings[p&s.mask]
	// Start at a random slot: a cursor would cost a store per claim (a
	// locked instruction on amd64); the compare-and-swap settles any clash.
	i := cpu.Rand()
	var sl *Slot[O]
	var w uint64
	for k := range uint32(ringProbe) {
		c := &r.slots[(i+k)%ringSize]
		if w = c.word.Load(); w&slotHeld == 0 && c.word.CompareAndSwap(w, w&^slotFlags|flags) {
			sl = c
			break
		}
	}
	if sl == nil {
		sl, w = s.claimOverflow(flags)
	}
	w &^= slotFlags
	if sl.node.Load() != node {
		sl.node.Store(node)
	}
	if sl.n.Load() != n {
		sl.n.Store(n)
	}
	if sl.kc.Load() != kc {
		sl.kc.Store(kc)
		sl.kt.Store(kt)
	}
	return sl, w | flags
}

func (s *Slots[O]) claimOverflow(flags uint64) (*Slot[O], uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sl *Slot[O]
	if k := len(s.free); k > 0 {
		sl, s.free = s.free[k-1], s.free[:k-1]
	} else {
		sl = &Slot[O]{owner: s.owner, overflow: true} // kept for reuse: at most the peak of overflowing admissions
		s.all = append(s.all, sl)
	}
	// A free slot is not held: only its claimer moves the word now (a stale
	// Entry's release finds another generation).
	w := sl.word.Load() &^ slotFlags
	sl.word.Store(w | flags)
	return sl, w
}

// Release ends the admission that claimed sl with word w and gives back
// the concurrency it was counted in. It reports false for a copy of an
// Entry that exited already.
func (s *Slots[O]) Release(sl *Slot[O], w uint64, node *stat.Node, n int64) bool {
	cur := w
	kc, kt := sl.kc.Load(), sl.kt.Load() // the holder's: read before the slot is free
	for {
		var walked *stat.Node
		var walkedN int64
		if cur&slotWalked != 0 {
			// Read before the release: written before the mark, and not
			// again while it stays, which is until this release.
			walked, walkedN = sl.walkedNode.Load(), sl.walkedN.Load()
		}
		if sl.word.CompareAndSwap(cur, cur&^slotFlags+slotGen) {
			if cur&slotCounted != 0 {
				node.ReleaseConcurrency(n)
			}
			if walked != nil {
				walked.ReleaseConcurrency(walkedN)
			}
			if kc != nil {
				kt.Release(kc, n)
			}
			break
		}
		// Marked since the claim (see Track), or released already.
		cur = sl.word.Load()
		if cur&^slotFlags != w&^slotFlags || cur&slotHeld == 0 {
			return false
		}
	}
	if sl.overflow {
		s.mu.Lock()
		s.free = append(s.free, sl)
		s.mu.Unlock()
	}
	return true
}

// Count counts the admission of word w in sl in node's concurrency, unless
// track did so first with the holder's own node and count. It returns the
// word to release with.
func (s *Slots[O]) Count(sl *Slot[O], w uint64, node *stat.Node, n int64) uint64 {
	// Counted first, so a concurrent check never sees too few.
	node.AcquireConcurrency(n, math.MaxInt64)
	for {
		if sl.word.CompareAndSwap(w, w|slotCounted) {
			return w | slotCounted
		}
		// track marked the slot meanwhile.
		w = sl.word.Load()
		if sl.walkedNode.Load() == node && sl.walkedN.Load() == n {
			node.ReleaseConcurrency(n) // it counted this admission
			return w
		}
		// It counted the previous holder's node or count (the holder had
		// not stored its own yet): keep this count too; release gives
		// back both.
	}
}

// each calls fn with every slot, ring and overflow.
func (s *Slots[O]) each(fn func(sl *Slot[O])) {
	for i := range s.rings {
		for j := range s.rings[i].slots {
			fn(&s.rings[i].slots[j])
		}
	}
	s.mu.Lock()
	all := s.all
	s.mu.Unlock()
	for _, sl := range all {
		fn(sl)
	}
}

// Track counts in their node's concurrency the admissions in flight on the
// nodes of targets that no concurrency rule counted: a rule set that adds a
// Concurrency rule to a resource runs it after it is published, so that the
// rule sees every request in flight, including those admitted before it
// existed. Admissions made under the old rule set but recorded after the
// walk passed their slot count themselves (Engine.admitted sees the new
// set), and so do those whose node and count the walk found not yet
// stored (their tag does not match). Should a tag match anyway (odds of
// 2^-20, in that instant), the slot is counted with the previous holder's
// node or count: the holder then counts itself too (see Count), the other
// node is stricter until the admission exits, and the slot gives back
// exactly what was counted.
func (s *Slots[O]) Track(targets map[*stat.Node]bool) {
	s.each(func(sl *Slot[O]) {
		w := sl.word.Load()
		if w&slotHeld == 0 || w&(slotCounted|slotWalked) != 0 {
			return
		}
		node := sl.node.Load()
		if !targets[node] {
			return
		}
		n := sl.n.Load()
		if tagOf(node, n) != (w>>tagShift)&tagMask {
			// The holder has not stored its node and count yet: it reads
			// the new rules after it does, and counts itself (see Count).
			return
		}
		sl.walkedNode.Store(node)
		sl.walkedN.Store(n)
		node.AcquireConcurrency(n, math.MaxInt64)
		if !sl.word.CompareAndSwap(w, w|slotWalked) {
			node.ReleaseConcurrency(n) // released, or counted by its holder
		}
	})
}
