package keytable

// What flow's Engine-level tests read of a table, and Revive, their way
// out of a regression that would hang them; none of it is on a request's
// path.

// Len is the keys in the table's sets (not counting listed or pinned
// keys).
func (t *Table) Len() int64 { return t.size.Load() }

// Listed is how many listed keys' states the table keeps (see Specific).
func (t *Table) Listed() int {
	t.specMu.Lock()
	defer t.specMu.Unlock()
	return len(t.spec)
}

// Pinned returns the Conc states evicted with requests in flight that
// wait in the side table for their last Release.
func (t *Table) Pinned() []*State {
	t.specMu.Lock()
	defer t.specMu.Unlock()
	pinned := make([]*State, 0, len(t.pinned))
	for _, st := range t.pinned {
		pinned = append(pinned, st)
	}
	return pinned
}

// Each calls fn with every state in the table's sets. With keys being
// added meanwhile it may see a key that moves (see relocate) twice or not
// at all: callers hold every lock (lockAll), or call it at quiescence.
func (t *Table) Each(fn func(*State)) {
	for i := range t.sets {
		for j := range t.sets[i].ways {
			if st := t.sets[i].ways[j].st.Load(); st != nil {
				fn(st)
			}
		}
	}
}

// Revive clears the dead mark of every state in the table's sets. For
// tests only: should a regression make a request spin on a dead state (a
// state live in one table and evicted from another, see Migrate), it lets
// the request finish, so that the test fails instead of hanging.
func (t *Table) Revive() { t.Each(func(st *State) { st.revive() }) }
