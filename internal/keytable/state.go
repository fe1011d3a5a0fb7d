package keytable

import (
	"math"
	"runtime"
	stdatomic "sync/atomic"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/pace"
)

// State is one key's state, one cache line (64 bytes: allocated alone, in
// the 64-byte size class, it starts a line). Only the fields of its
// table's kind are used: one type keeps the table's code single. It must
// not be copied after first use.
//
// A state evicted from its table's sets is reused for the key that
// replaces it: each reuse is a new life (see Life), and a request that
// found the state in an earlier life counts nothing in the new one.
type State struct {
	// head is the newest bucket index (Window), the timeline's head in ns
	// (Pace), or the requests in flight (Conc).
	head  atomic.Int64
	words [Buckets]atomic.Uint64
	// idh and idc are the key's identity in its table (see ID), rewritten
	// when the state is reused.
	idh, idc stdatomic.Uint64
	// life is the state's generation above its dead bit (see Life). The
	// flags are sync/atomic's (4 bytes; go.uber.org/atomic's Bool is 8),
	// so the state fits one line.
	life stdatomic.Uint32
	// pinned is set while a Conc state with requests in flight sits in
	// its table's side table.
	pinned stdatomic.Bool
}

// Life is a state's generation (bits 1 and up) and dead bit (bit 0) as a
// lookup found them. A request keeps the life it found its key's state
// in and hands it to Admit, Undo and Acquire, which count nothing once the
// state has left that life: evicted (dead, the bit set) or reused for
// another key (the generation moved on). A lookup returns live states
// only, so a Life a request holds has the bit clear.
type Life uint32

// dead is Life's dead bit.
const dead Life = 1

// tag is the 8 bits of a life's generation a Window word carries, in
// place above its epoch (see packBucket): a count written in one life
// never passes for one of the next 255 lives of its state.
func (l Life) tag() uint64 { return uint64(uint8(l>>1)) << epochBits }

// Life is the state's life now.
func (st *State) Life() Life { return Life(st.life.Load()) }

// Alive reports whether the state is still in life l.
func (st *State) Alive(l Life) bool { return Life(st.life.Load()) == l }

// id is the state's key identity.
func (st *State) id() ID { return ID{st.idh.Load(), st.idc.Load()} }

// setID makes id the state's identity.
func (st *State) setID(id ID) {
	st.idh.Store(id.h)
	st.idc.Store(id.c)
}

// kill sets the dead bit: a request that counted in the state since takes
// its count back and looks its key up again. revive clears it (a Conc
// state with requests in flight stays alive in the side table).
func (st *State) kill()   { st.life.Or(uint32(dead)) }
func (st *State) revive() { st.life.And(^uint32(dead)) }

// noBucket is the head of a window that never counted.
const noBucket = math.MinInt64 / 2

func (t *Table) newState(id ID) *State {
	st := &State{}
	st.setID(id)
	if t.kind != Conc {
		st.head.Store(noBucket)
	}
	return st
}

// reset empties a state of a table of kind k: a Window state's buckets
// (its head stays: the emptied buckets count nothing), a Pace state's
// timeline, back to idle.
func (st *State) reset(k Kind) {
	switch k {
	case Window:
		for i := range st.words {
			st.words[i].Store(0)
		}
	case Pace:
		st.head.Store(noBucket)
	}
}

// Timeline is a Pace state's timeline head (ns), for the pacer to reserve
// on.
func (st *State) Timeline() *atomic.Int64 { return &st.head }

// GiveBack returns slot h, which a request of life l took on a Pace
// state's timeline, unless the state has left life l: its timeline is
// then another key's (or its key's memory keeps the slot: stricter, never
// looser). The life is checked and the slot given back under the state's
// give-back guard (its first word, unused by a timeline), which a reuse
// waits out before it rewrites the timeline: the head a give-back moves
// is always its own life's.
func (st *State) GiveBack(l Life, h pace.Held) {
	guard := &st.words[0]
	for !guard.CompareAndSwap(0, 1) {
		runtime.Gosched() // another give-back of this key, a few instructions long
	}
	if st.Alive(l) {
		pace.GiveBack(&st.head, h)
	}
	guard.Store(0)
}

// awaitGiveBacks waits until no give-back holds the guard of a Pace state
// whose life has ended (see GiveBack), so that none moves its new
// timeline.
func (st *State) awaitGiveBacks() {
	for st.words[0].Load() != 0 {
		runtime.Gosched()
	}
}

// InFlight is a Conc state's count in flight.
func (st *State) InFlight() int64 { return st.head.Load() }
