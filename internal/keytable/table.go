package keytable

import (
	"sync"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// Kind is what a table keeps per key.
type Kind uint8

const (
	Window Kind = iota // QPS Reject: a sliding window of Buckets buckets
	Pace               // QPS Throttle: a pacing timeline
	Conc               // Concurrency: requests in flight
)

// Config is what a table is made with.
type Config struct {
	Kind Kind
	// MaxKeys is the most keys tracked, rounded up to a whole set (see
	// CapacityFor); at least 1.
	MaxKeys int
	// Window is a Window table's window in ns: Buckets buckets of
	// Window/Buckets.
	Window int64
	// Now is the clock (ns) a key's state is made and evicted at; the
	// lookup path never reads it.
	Now func() int64
	// PaceLife is how long after its timeline head a Pace key's state
	// matters, ns (see SetPaceLife); at least a second.
	PaceLife int64
}

// Table is one per-key rule's keys: a set-associative table of sets of
// setWays states. A key hashes to two sets and lives in one of them; lookups
// take no lock (a set is one cache line of tag and pointer pairs: a tag
// compare per way, then the key), and adding a key locks its two sets and,
// when both are full, replaces the state in them that loses least (see
// victim). It outlives rule sets: a rule reloaded with other thresholds
// keeps its keys' counts. It is safe for simultaneous use by multiple
// goroutines.
//
// It is our own rather than a cache library's: measured on the bench's
// zipf stream over 100,000 keys, an otter v2 lookup took 63 ns where a Go
// map took 15 ns, which alone would have made a per-key Entry three times
// the cost of a plain one; this table's lookup is a hash and two cache
// lines, and its eviction knows which keys lose nothing.
type Table struct {
	kind      Kind
	bucketLen int64 // Window
	sets      []set
	seeds     [2]seed
	noKey     *State
	now       func() int64
	evicted   atomic.Pointer[func()] // counts an active key's eviction
	forgot    atomic.Pointer[func()] // counts a live ghost forgotten
	size      atomic.Int64           // keys in sets

	// ghosts holds what evicted active keys had (see the type's doc),
	// made at the first such eviction (a table that never fills costs
	// none); never for Conc. maxKeys sizes it.
	ghosts   atomic.Pointer[ghosts]
	ghostsMu sync.Mutex
	maxKeys  int
	// paceLife is how long after its timeline head a Pace key's state
	// matters (see SetPaceLife), ns.
	paceLife atomic.Int64

	// locks guard adding to and evicting from sets (by set index).
	locks [setLocks]paddedMutex
	// next is the table this one moved to, from the table moving into
	// this one while Migrate runs (see Migrate).
	next, from atomic.Pointer[Table]
	// rewound is where t's keys went when a reload changed the window
	// (see Rewindow); nil while t is in use.
	rewound atomic.Pointer[successor]

	// specMu guards spec, the states of the keys listed in the rule's
	// Keys (kept across reloads), listed, the same by identity, and
	// pinned, Conc states with requests in flight that were evicted.
	// hasListed is set once spec held a key: lookups that miss the sets
	// look in listed only then.
	specMu    sync.Mutex
	spec      map[string]*State
	listed    map[ID]*State
	hasListed atomic.Bool
	pinned    map[ID]*State
}

// ID identifies a key in its table: two 64-bit hashes of it, keyed by
// seeds drawn per table. Two keys share a state only if both hashes
// collide, odds of 2^-128 per pair that no caller can steer (the seeds are
// secret); were it to happen, they would share one window, stricter for
// both, never looser. Keeping the hashes rather than the key saves a
// pointer chase per lookup and the key's bytes per tracked key.
type ID struct{ h, c uint64 }

// setWays is the states per set: a set is one cache line of tag and
// pointer pairs. setLocks is the locks the sets share.
const (
	setWays  = 4
	setLocks = 64
)

type set struct {
	ways [setWays]way
}

type way struct {
	tag atomic.Uint64 // the hash of the key (0: none)
	st  atomic.Pointer[State]
}

type paddedMutex struct {
	sync.Mutex
	_ [cpu.CacheLine - 8]byte
}

// New makes a table.
func New(cfg Config) *Table {
	t := &Table{kind: cfg.Kind, now: cfg.Now, seeds: [2]seed{newSeed(), newSeed()},
		spec: map[string]*State{}, listed: map[ID]*State{}, pinned: map[ID]*State{}}
	// The shared "no key" state starts as every key's does: a Conc
	// table's at nothing in flight.
	t.noKey = t.newState(ID{})
	if t.kind == Window {
		t.bucketLen = cfg.Window / Buckets
	}
	t.maxKeys = cfg.MaxKeys
	t.SetPaceLife(cfg.PaceLife)
	t.sets = make([]set, (cfg.MaxKeys+setWays-1)/setWays)
	return t
}

// CountEvictions makes the table call count on every eviction of an
// active key (under a set's lock, never on a lookup of a tracked key).
func (t *Table) CountEvictions(count func()) { t.evicted.Store(&count) }

// CountForgotten makes the table call count whenever it forgets what an
// evicted key had while that still mattered: more active keys were
// evicted within a window than it remembers (see ghosts), and that key,
// seen again in the window, starts afresh.
func (t *Table) CountForgotten(count func()) { t.forgot.Store(&count) }

// Kind is what the table keeps per key.
func (t *Table) Kind() Kind { return t.kind }

// BucketLen is a Window table's bucket length (ns).
func (t *Table) BucketLen() int64 { return t.bucketLen }

// NoKey is the state requests without a key share.
func (t *Table) NoKey() *State { return t.noKey }

// NoKeyState is NoKey and the life a request counts in it in: its own,
// the dead bit clear, so that once it ended (a reload of another window
// moved it: see Successor) Admit reports it gone.
func (t *Table) NoKeyState() (*State, Life) {
	st := t.noKey
	return st, st.Life() &^ dead
}

// Capacity is the most keys the table tracks: MaxKeys rounded up to a
// whole set.
func (t *Table) Capacity() int { return len(t.sets) * setWays }

// CapacityFor is the capacity of a table made with maxKeys.
func CapacityFor(maxKeys int) int { return (maxKeys + setWays - 1) / setWays * setWays }

// hash is key's first hash, never 0 (0 marks an empty way).
func (t *Table) hash(key string) uint64 { return t.seeds[0].sum(key) | 1 }

// check is key's second hash.
func (t *Table) check(key string) uint64 { return t.seeds[1].sum(key) }

// setsOf returns the two sets of hash h.
func (t *Table) setsOf(h uint64) (int, int) {
	n := uint64(len(t.sets))
	return int(uint64(uint32(h)) * n >> 32), int((h >> 32) * n >> 32)
}

// Specific returns the state of a key listed in the rule's Keys, kept
// apart from the sets (never evicted) and across reloads (load time
// only), and its life: a reload that no longer lists the key puts the
// state into the sets, where it may be evicted and reused. Meanwhile a
// lookup of the key (by a request of a rule set that does not list it,
// during a reload) finds this state too: a key has one state.
func (t *Table) Specific(key string) (*State, Life) {
	id := ID{t.hash(key), t.check(key)}
	a, b := t.setsOf(id.h)
	defer t.lock(a, b).unlock()
	t.specMu.Lock()
	st := t.spec[key]
	t.specMu.Unlock()
	if st == nil {
		// Out of the sets, or back from the side table or its ghost, with
		// its counts; under the sets' locks, so that no lookup adds
		// another state for it meanwhile.
		if st = t.removeLocked(id, a, b); st == nil {
			if st = t.unpin(id); st == nil {
				st = t.fresh(id)
			}
		}
		t.specMu.Lock()
		t.list(key, st)
		t.specMu.Unlock()
	}
	return st, st.Life()
}

// list adds st, the state of key, to the listed keys (specMu held).
func (t *Table) list(key string, st *State) {
	t.spec[key] = st
	t.listed[st.id()] = st
	t.hasListed.Store(true)
}

// listedState is the state of listed key id, or nil (the sets' locks of
// id held).
func (t *Table) listedState(id ID) *State {
	if !t.hasListed.Load() {
		return nil
	}
	side := t.lockSpec() // the table it moved to, if it did
	defer side.specMu.Unlock()
	return side.listed[id]
}

// KeepSpecific drops the states of keys no longer listed, those not in
// keys, into the sets, with their counts (load time).
func (t *Table) KeepSpecific(keys []string) {
	keep := make(map[string]bool, len(keys))
	for _, k := range keys {
		keep[k] = true
	}
	t.specMu.Lock()
	var gone []string
	for k := range t.spec {
		if !keep[k] {
			gone = append(gone, k)
		}
	}
	t.specMu.Unlock()
	for _, k := range gone {
		id := ID{t.hash(k), t.check(k)}
		a, b := t.setsOf(id.h)
		unlock := t.lock(a, b)
		t.specMu.Lock()
		st := t.spec[k]
		delete(t.spec, k)
		delete(t.listed, id)
		t.specMu.Unlock()
		if st != nil {
			st.setID(id)
			if t.findLocked(id, a, b) == nil {
				t.placeLocked(st, id, a, b)
			} else {
				st.kill() // not expected: one state per key (see Specific)
			}
		}
		unlock.unlock()
	}
}

// Get returns key's state, adding it if the table lacks it, and the life
// it found it in (see Life).
func (t *Table) Get(key string) (*State, Life) {
	if n := t.next.Load(); n != nil {
		return n.current().Get(key) // moved to a table of another MaxKeys
	}
	// Both hashes first: a key found needs both, and a key added too.
	id := ID{t.hash(key), t.check(key)}
	a, b := t.setsOf(id.h)
	if st, l := t.sets[a].find(id); st != nil {
		return st, l
	}
	if st, l := t.sets[b].find(id); st != nil {
		return st, l
	}
	return t.add(id, a, b)
}

// Peek returns key's state, or nil if the table lacks it: nothing is
// added or evicted (a key evicted to the memory of evicted keys reads as
// absent).
func (t *Table) Peek(key string) *State {
	if n := t.next.Load(); n != nil {
		return n.current().Peek(key)
	}
	id := ID{t.hash(key), t.check(key)}
	a, b := t.setsOf(id.h)
	if st, _ := t.sets[a].find(id); st != nil {
		return st
	}
	if st, _ := t.sets[b].find(id); st != nil {
		return st
	}
	// Both missed: a move between the two reads (see relocate) may have
	// carried the key from b to a. Under their locks the sets hold still.
	defer t.lock(a, b).unlock()
	return t.findLocked(id, a, b)
}

// Reset empties what key counted: its state leaves the sets (marked dead:
// a request that counted in it since looks the key up again and finds it
// afresh; one that gives back gives back to it, not to the new state), and
// its memory among the evicted goes, both under the sets' locks, so that
// no eviction between puts its counts back; a listed key's state, listed,
// is emptied in place (its buckets or timeline). A Conc table is left
// alone: its counts are requests in flight.
func (t *Table) Reset(key string, listed *State) {
	if t.kind == Conc {
		return
	}
	if listed != nil {
		listed.reset(t.kind)
	}
	for ; t != nil; t = t.next.Load() {
		id := ID{t.hash(key), t.check(key)}
		a, b := t.setsOf(id.h)
		// The order add locks in: a table moving into this one first.
		var unlockFrom locked
		from := t.from.Load()
		var fa, fb int
		if from != nil {
			fa, fb = from.setsOf(id.h)
			unlockFrom = from.lock(fa, fb)
		}
		unlock := t.lock(a, b)
		if from != nil {
			forget(from, id, fa, fb)
		}
		forget(t, id, a, b)
		unlock.unlock()
		unlockFrom.unlock()
	}
}

// forget takes id's state out of t's sets a and b, ending it, and its
// ghost out of t's memory (the sets' locks held).
func forget(t *Table, id ID, a, b int) {
	if st := t.removeLocked(id, a, b); st != nil {
		st.kill()
	}
	t.takeGhost(id)
}

// find returns the live state of key id in s and its life, or nil. The
// life is read before the identity: a state reused since for another key
// (its identity rewritten before its new life begins) fails the identity
// check or, found in its old life, counts nothing in the new one.
func (s *set) find(id ID) (*State, Life) {
	for i := range s.ways {
		w := &s.ways[i]
		if w.tag.Load() == id.h {
			if st := w.st.Load(); st != nil {
				if l := st.Life(); l&dead == 0 && st.idh.Load() == id.h && st.idc.Load() == id.c {
					return st, l
				}
			}
		}
	}
	return nil, 0
}

// findID is find by identity (under the sets' locks: no life changes).
func (s *set) findID(id ID) *State {
	for i := range s.ways {
		if st := s.ways[i].st.Load(); st != nil && st.id() == id {
			return st
		}
	}
	return nil
}

// add is Get's slow path: a key new to the table (or back to it).
func (t *Table) add(id ID, a, b int) (*State, Life) {
	// While a table moves into this one, its key may not have moved yet:
	// its sets are locked first (the order Migrate locks in), and a state
	// still there moves now.
	var fa, fb int
	var unlockFrom locked
	from := t.from.Load()
	if from != nil {
		fa, fb = from.setsOf(id.h)
		unlockFrom = from.lock(fa, fb)
	}
	unlock := t.lock(a, b)
	if n := t.next.Load(); n != nil {
		// Moved to another table while we waited (see Migrate).
		unlock.unlock()
		unlockFrom.unlock()
		return n.current().getID(id)
	}
	defer unlockFrom.unlock()
	defer unlock.unlock()
	if t.rewound.Load() != nil {
		// Its keys went to a table of another window (see Rewindow):
		// the request counts there, through Successor.
		return moved, 0
	}
	// Added by another request while we waited? Or listed in the rule's
	// Keys (by a rule set this request's does not know yet)?
	if st := t.findLocked(id, a, b); st != nil {
		return st, st.Life()
	}
	if st := t.listedState(id); st != nil {
		return st, st.Life()
	}
	var st *State
	if from != nil {
		st = from.removeLocked(id, fa, fb)
	}
	if st == nil {
		// The side table is the one it moved to if t began to move since
		// next was read (this add's sets are moved after it).
		st = t.unpin(id)
	}
	st = t.placeLocked(st, id, a, b)
	return st, st.Life()
}

// removeLocked takes the state of id out of sets a and b, if there (their
// locks held), without ending it: it moves.
func (t *Table) removeLocked(id ID, a, b int) *State {
	for _, si := range [2]int{a, b} {
		for i := range t.sets[si].ways {
			w := &t.sets[si].ways[i]
			if st := w.st.Load(); st != nil && st.id() == id {
				w.tag.Store(0)
				w.st.Store(nil)
				t.size.Dec()
				return st
			}
		}
	}
	return nil
}

// getID is Get for a key known by its identity (same seeds: see
// Migrate). The sets are read under their locks: findID reads a state's
// identity, which a reuse rewrites.
func (t *Table) getID(id ID) (*State, Life) {
	a, b := t.setsOf(id.h)
	unlock := t.lock(a, b)
	st := t.findLocked(id, a, b)
	unlock.unlock()
	if st != nil {
		return st, st.Life()
	}
	return t.add(id, a, b)
}

// lock locks sets a and b (in one order: no deadlock) and returns the
// unlock.
func (t *Table) lock(a, b int) locked {
	la, lb := &t.locks[a%setLocks], &t.locks[b%setLocks]
	if la == lb {
		la.Lock()
		return locked{a: la}
	}
	if a%setLocks > b%setLocks {
		la, lb = lb, la
	}
	la.Lock()
	lb.Lock()
	return locked{la, lb}
}

// locked is the one or two locks lock took, in their order; its zero
// value holds none. A value, not a closure: taking a key's sets allocates
// nothing.
type locked struct{ a, b *paddedMutex }

// unlock releases what l holds, in the reverse order.
func (l locked) unlock() {
	if l.b != nil {
		l.b.Unlock()
	}
	if l.a != nil {
		l.a.Unlock()
	}
}

func (t *Table) findLocked(id ID, a, b int) *State {
	if st := t.sets[a].findID(id); st != nil {
		return st
	}
	return t.sets[b].findID(id)
}

// placeLocked puts st into set a or b, replacing the victim's state; an
// active victim only if no key of a or b can move to its other set. With
// st nil it makes id's state: the victim's, reused, if there is one (see
// evict), else a new one. It returns the state placed.
func (t *Table) placeLocked(st *State, id ID, a, b int) *State {
	now := t.now()
	var from begin
	if st == nil {
		// Before the victim's memory is kept: its keeping may forget
		// others'.
		from = t.begin(id, now)
	}
	si, wi := t.victim(a, b, now)
	w := &t.sets[si].ways[wi]
	if old := w.st.Load(); old != nil && t.idleFor(old, now) < 0 {
		if x, i, ok := t.relocate(a, b); ok {
			si, wi = x, i
			w = &t.sets[si].ways[wi]
		}
	}
	w.tag.Store(0) // no lookup matches a half-written way
	old := w.st.Load()
	reuse := false
	if old != nil {
		reuse = t.evict(old, now) && st == nil
	} else {
		t.size.Inc()
	}
	switch {
	case reuse:
		st = old
		t.renew(st, id, from)
	case st == nil:
		st = t.newState(id)
		t.renew(st, id, from)
	}
	w.st.Store(st)
	w.tag.Store(id.h)
	return st
}

// relocate makes room in set a or b (their locks held, both full) by
// moving one of their keys to its other set, where that has an empty way,
// and returns the way it emptied. Without it a key lives only where it
// first landed, and a table of active keys evicts some of them long before
// it is full (4% of the keys of a table filled to 80% of its capacity, 11%
// at 100%, measured on uniform keys). The other set's lock is only tried:
// taken after a and b's, waiting for it could deadlock. A lookup of the
// moved key finds it in one set or the other, or, between the two writes,
// misses and adds it under its sets' locks, which wait for this move and
// then find it. No key moves while the table moves to another (Migrate).
func (t *Table) relocate(a, b int) (setIdx, wayIdx int, ok bool) {
	for _, x := range [2]int{a, b} {
		for i := range t.sets[x].ways {
			from := &t.sets[x].ways[i]
			o := from.st.Load()
			if o == nil {
				continue
			}
			p, q := t.setsOf(o.idh.Load())
			alt := p
			if alt == x {
				alt = q
			}
			if alt == a || alt == b || !t.sets[alt].hasEmpty() {
				continue
			}
			l := &t.locks[alt%setLocks]
			held := l == &t.locks[a%setLocks] || l == &t.locks[b%setLocks]
			if !held && !l.TryLock() {
				continue
			}
			moved := false
			if t.next.Load() == nil && t.from.Load() == nil {
				for j := range t.sets[alt].ways {
					to := &t.sets[alt].ways[j]
					if to.st.Load() == nil {
						to.st.Store(o)
						to.tag.Store(o.idh.Load())
						from.tag.Store(0)
						from.st.Store(nil)
						moved = true
						break
					}
				}
			}
			if !held {
				l.Unlock()
			}
			if moved {
				return x, i, true
			}
		}
	}
	return 0, 0, false
}

// hasEmpty reports whether s has an empty way (a hint, read without its
// lock).
func (s *set) hasEmpty() bool {
	for i := range s.ways {
		if s.ways[i].st.Load() == nil {
			return true
		}
	}
	return false
}

// unpin takes the state of id back from the side table of Conc states
// evicted with requests in flight (nil if not there), with the sets'
// locks of id held.
func (t *Table) unpin(id ID) *State {
	if t.kind != Conc {
		return nil
	}
	side := t.lockSpec()
	defer side.specMu.Unlock()
	st := side.pinned[id]
	if st != nil {
		delete(side.pinned, id)
		st.pinned.Store(false)
	}
	return st
}

// insert puts st into its sets unless its key is there already.
func (t *Table) insert(st *State) {
	id := st.id()
	a, b := t.setsOf(id.h)
	defer t.lock(a, b).unlock()
	if t.findLocked(id, a, b) == nil {
		t.placeLocked(st, id, a, b)
	}
}
