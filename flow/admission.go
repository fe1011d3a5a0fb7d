package flow

import (
	"sync"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// An admission is recorded in a slot so that Exit releases it at most once,
// however many copies of its Entry exit: the Entry carries the slot and the
// generation it claimed, and Exit releases only if it moves the slot from
// that generation to the next. A stale copy finds a later generation and
// does nothing. Slots are claimed from a small ring per P, so the pass path
// allocates nothing and touches a line its P owns; when every slot near the
// ring's cursor is held (many long admissions), one comes from a shared
// overflow list.
type slot struct {
	// word is twice the slot's generation, plus one while an admission
	// holds it.
	word atomic.Uint64
	// overflow is set on slots of the overflow list, which go back to it.
	overflow bool
}

// ringSize is the slots per P: an admission that outlives ringSize later
// admissions on its P only makes claims probe past it, and ringProbe held
// slots in a row send a claim to the overflow list.
const (
	ringSize  = 64
	ringProbe = 4
)

type ring struct {
	next  atomic.Uint32
	_     [cpu.CacheLine - 4]byte
	slots [ringSize]slot
}

// slots is an engine's rings, one per stripe, and its overflow slots.
type slots struct {
	rings []ring
	mask  int

	mu   sync.Mutex // guards the overflow list: the rare path
	free []*slot
}

func newSlots() *slots {
	n := cpu.Stripes()
	return &slots{rings: make([]ring, n), mask: n - 1}
}

// claim takes a free slot on stripe p for a new admission and returns it
// with the generation to release it with.
func (s *slots) claim(p int) (*slot, uint64) {
	r := &s.rings[p&s.mask]
	// A plain load and store: only this P moves its cursor, and a move lost
	// to a goroutine that changed P only makes two claims probe one slot,
	// which the compare-and-swap settles.
	i := r.next.Load()
	r.next.Store(i + 1)
	for k := range uint32(ringProbe) {
		sl := &r.slots[(i+k)%ringSize]
		if w := sl.word.Load(); w&1 == 0 && sl.word.CompareAndSwap(w, w+1) {
			return sl, w + 1
		}
	}
	return s.claimOverflow()
}

func (s *slots) claimOverflow() (*slot, uint64) {
	s.mu.Lock()
	var sl *slot
	if k := len(s.free); k > 0 {
		sl, s.free = s.free[k-1], s.free[:k-1]
	} else {
		sl = &slot{overflow: true} // kept for reuse: at most the peak of overflowing admissions
	}
	s.mu.Unlock()
	// A free slot is not held: only its claimer moves the word now (a stale
	// Entry's release finds another generation).
	return sl, sl.word.Add(1)
}

// release ends the admission of generation gen and reports whether it was
// still held (false for a copy of an Entry that exited already).
func (s *slots) release(sl *slot, gen uint64) bool {
	if !sl.word.CompareAndSwap(gen, gen+1) {
		return false
	}
	if sl.overflow {
		s.mu.Lock()
		s.free = append(s.free, sl)
		s.mu.Unlock()
	}
	return true
}
