// Package slots records the admissions of flow that hold something (a
// Concurrency rule's count, a PerKey Concurrency rule's key) so that Exit
// gives it back at most once, however many copies of its Entry exit. It
// needs no Engine: flow's Entry carries the slot and the word it claimed
// it with, and the owner (the engine) comes back from the slot.
//
// An admission that holds nothing claims no slot: its Entry carries a
// Sentinel slot, never claimed, and each copy of it that exits counts a
// completion (flow documents this).
package slots

import (
	"sync"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/keytable"
)

// A Slot records one admission: the Entry carries the slot and the word it
// claimed it with, and Exit releases only if it moves the slot from that
// generation to the next. A stale copy finds a later generation and does
// nothing. Slots are claimed from a small ring per stripe, so the path
// allocates nothing and touches a line its P owns; when every slot near a
// claim's random start is held (many long admissions), one comes from a
// shared overflow list.
type Slot[O any] struct {
	// word is the slot's generation times slotGen plus the flags.
	word atomic.Uint64
	// kc is the key state a PerKey Concurrency rule counted the holder in
	// (nil: none), and kt its table. The holder stores them after
	// claiming, only when they differ from the last holder's; a stale copy
	// may read a later holder's, and then does nothing with them.
	kc atomic.Pointer[keytable.State]
	kt atomic.Pointer[keytable.Table]
	// n and p are the holder's count and stripe hint, stored like kc (the
	// Entry has no room for them beside the word).
	n, p atomic.Int32
	// at is where the holder's Exit has more to do (flow: the breakers of
	// its resource), stored like kc; nil: nothing more.
	at atomic.Pointer[O]
	// owner is whose slots these are (flow's Exit needs its engine).
	owner *O
	// overflow is set on slots of the overflow list, which go back to it.
	overflow bool
}

const (
	slotHeld    = 1 << iota // an admission holds the slot
	slotCounted             // counted in its node's concurrency
	slotGen                 // one generation
	slotFlags   = slotGen - 1
)

// Counted reports whether the admission that claimed with word w was
// counted in its node's concurrency (Claim's counted).
func Counted(w uint64) bool { return w&slotCounted != 0 }

// ringSize is the slots per stripe: an admission that outlives ringSize
// later admissions on its stripe only makes claims probe past it, and
// ringProbe held slots in a row send a claim to the overflow list.
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

// Sentinel returns a slot of owner that is never claimed: what an Entry
// that holds no claim carries to lead back to its owner.
func Sentinel[O any](owner *O) *Slot[O] { return &Slot[O]{owner: owner} }

// Owner returns whose slot sl is.
func (sl *Slot[O]) Owner() *O { return sl.owner }

// Claim takes a free slot on stripe p for an admission of n (counted in
// its node's concurrency if counted; in key state kc of table kt if kc is
// not nil; with at for its Exit, if not nil) and returns it with the word
// to release it with, which is odd.
func (s *Slots[O]) Claim(p int, n int32, counted bool, kc *keytable.State, kt *keytable.Table, at *O) (*Slot[O], uint64) {
	flags := uint64(slotHeld)
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
		if w = c.word.Load(); w&slotHeld == 0 && c.word.CompareAndSwap(w, w|flags) {
			sl = c
			break
		}
	}
	if sl == nil {
		sl, w = s.claimOverflow(flags)
	}
	if sl.kc.Load() != kc {
		sl.kc.Store(kc)
		sl.kt.Store(kt)
	}
	if sl.n.Load() != n {
		sl.n.Store(n)
	}
	if sl.at.Load() != at {
		sl.at.Store(at)
	}
	if sl.p.Load() != int32(p) {
		sl.p.Store(int32(p))
	}
	return sl, w | flags
}

// Holder returns the count and stripe hint Claim stored in sl; read before
// Release, they are the holder's when the release succeeds.
func (sl *Slot[O]) Holder() (n, p int32) { return sl.n.Load(), sl.p.Load() }

// At returns the at Claim stored in sl, read as Holder.
func (sl *Slot[O]) At() *O { return sl.at.Load() }

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
	w := sl.word.Load()
	sl.word.Store(w | flags)
	return sl, w
}

// Release ends the admission that claimed sl with word w: it returns the
// key state and table to give the admission's count back to (nil: none),
// and false for a copy of an Entry that exited already. The caller gives
// back the node's concurrency if Counted(w).
func (s *Slots[O]) Release(sl *Slot[O], w uint64) (*keytable.State, *keytable.Table, bool) {
	kc, kt := sl.kc.Load(), sl.kt.Load() // the holder's: read before the slot is free
	// Only the holder's first release moves the word from w: a claim needs
	// it free, and a stale word names an earlier generation.
	if !sl.word.CompareAndSwap(w, w&^slotFlags+slotGen) {
		return nil, nil, false
	}
	if sl.overflow {
		s.mu.Lock()
		s.free = append(s.free, sl)
		s.mu.Unlock()
	}
	return kc, kt, true
}
