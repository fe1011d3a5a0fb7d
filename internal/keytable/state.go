package keytable

import (
	"math"
	stdatomic "sync/atomic"

	"go.uber.org/atomic"
)

// State is one key's state, one cache line (64 bytes: allocated alone, in
// the 64-byte size class, it starts a line). Only the fields of its
// table's kind are used: one type keeps the table's code single. It must
// not be copied after first use.
type State struct {
	// head is the newest bucket index (Window), the timeline's head in ns
	// (Pace), or the requests in flight (Conc).
	head  atomic.Int64
	words [Buckets]atomic.Uint64
	// id is the key's identity in its table (see ID).
	id ID
	// dead is set when the state left its table: a request that counted
	// in it since takes the count back and looks the key up again. The
	// flags are sync/atomic's (4 bytes; go.uber.org/atomic's Bool is 8),
	// so the state fits one line.
	dead stdatomic.Bool
	// pinned is set while a Conc state with requests in flight sits in
	// its table's side table.
	pinned stdatomic.Bool
}

// noBucket is the head of a window that never counted.
const noBucket = math.MinInt64 / 2

func (t *Table) newState(id ID) *State {
	st := &State{id: id}
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

// Dead reports whether the state left its table: a request that took
// from it since gives back and looks its key up again.
func (st *State) Dead() bool { return st.dead.Load() }

// Timeline is a Pace state's timeline head (ns), for the pacer to reserve
// on.
func (st *State) Timeline() *atomic.Int64 { return &st.head }

// InFlight is a Conc state's count in flight.
func (st *State) InFlight() int64 { return st.head.Load() }

// Acquire counts n in flight on a Conc state if it stays at or below
// limit. It returns the count seen when it refuses; dead reports that the
// state left the table (nothing counted): the caller looks the key up
// again. Release gives it back.
func (st *State) Acquire(n, limit int64) (seen int64, ok, dead bool) {
	for {
		cur := st.head.Load()
		if cur+n > limit {
			return cur, false, st.dead.Load()
		}
		if st.head.CompareAndSwap(cur, cur+n) {
			break
		}
	}
	if st.dead.Load() {
		st.head.Sub(n)
		return 0, false, true
	}
	return 0, true, false
}
