package keytable

import (
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/pace"
)

// victim picks the way a new key takes in sets a and b: an empty one, else
// the state that loses least when evicted: one whose window is over (or
// whose timeline is past, or with nothing in flight), else the one least
// recently counted in.
func (t *Table) victim(a, b int, now int64) (setIdx, wayIdx int) {
	best, bestAge := -1, int64(math.MinInt64)
	for k, si := range [2]int{a, b} {
		s := &t.sets[si]
		for i := range s.ways {
			st := s.ways[i].st.Load()
			if st == nil {
				return si, i
			}
			age := t.idleFor(st, now)
			if age > bestAge {
				best, bestAge = k*setWays+i, age
			}
		}
	}
	if best < setWays {
		return a, best
	}
	return b, best - setWays
}

// idleFor says how little a state loses if evicted at now: the larger, the
// less. Past 0 it loses nothing.
func (t *Table) idleFor(st *State, now int64) int64 {
	switch t.kind {
	case Conc:
		if st.head.Load() == 0 {
			return 1
		}
		return math.MinInt64 / 2 // pinned if evicted
	case Pace:
		return now - st.head.Load()
	}
	h := st.head.Load()
	if h == noBucket {
		return math.MaxInt64 / 2
	}
	return now - (h+Buckets)*t.bucketLen // past 0: the window is over
}

// evict takes st out of the table (its way is being replaced, under the
// set's lock): what it holds goes to the ghosts, or, for a Conc state with
// requests in flight, to the side table. It reports whether the state may
// be reused for another key (see renew): all but a pinned one may.
func (t *Table) evict(st *State, now int64) bool {
	st.kill()
	switch t.kind {
	case Conc:
		if st.head.Load() > 0 {
			t = t.lockSpec() // the side table it moved to, if it did
			id := st.id()
			t.pinned[id] = st
			st.pinned.Store(true)
			if st.head.Load() == 0 {
				// Its last request exited as we pinned it, and may have
				// missed the mark: unpinned here.
				delete(t.pinned, id)
				st.pinned.Store(false)
				t.specMu.Unlock()
				return true
			}
			// Alive again before the lock goes: a release that unpins it
			// (under the lock) marks it dead after this.
			st.revive()
			t.specMu.Unlock()
			return false
		}
		return true
	case Window:
		// Read after dead is set: a request that counts later sees it.
		// Kept for a window more than this clock reading needs: another
		// request's reading may be behind it.
		b := now / t.bucketLen
		c, ok := st.carry(b - Buckets)
		if !ok {
			return true // its window is over: nothing to keep
		}
		t.remember(st.idh.Load(), ghostOf(c), b)
		if c.head+Buckets <= b {
			return true // idle by this clock: not counted as active
		}
	case Pace:
		// Kept even when past: the next request's cost runs from it.
		at := st.head.Load()
		var x ghost
		x.setTimeline(at)
		t.remember(st.idh.Load(), x, now)
		if at <= now-t.paceLife.Load() {
			return true // idle past its slowest slot: not counted as active
		}
	}
	if count := t.evicted.Load(); count != nil {
		(*count)()
	}
	return true
}

// memory is the table's ghosts, made if needed (once: they are large).
func (t *Table) memory() *ghosts {
	if g := t.ghosts.Load(); g != nil {
		return g
	}
	t.ghostsMu.Lock()
	defer t.ghostsMu.Unlock()
	if g := t.ghosts.Load(); g != nil {
		return g
	}
	g := newGhosts(t.maxKeys)
	t.ghosts.Store(g)
	return g
}

// takeGhost takes the ghost of id from the ghosts of t, if it has any.
func (t *Table) takeGhost(id ID) (ghost, bool) {
	if g := t.ghosts.Load(); g != nil {
		return g.take(id.h)
	}
	return ghost{}, false
}

// ghostNow is the clock in the unit of the table's ghosts (see ends).
func (t *Table) ghostNow() int64 {
	if t.kind == Window {
		return max(t.now(), 0) / t.bucketLen
	}
	return t.now()
}

// SetPaceLife sets how long after its timeline head a Pace key's state
// matters: its rule's slowest slot, at least a second (load time).
func (t *Table) SetPaceLife(d int64) { t.paceLife.Store(max(d, int64(time.Second))) }

// remember puts an evicted key's ghost (see ghosts.put), counting a
// ghost forgotten while it mattered.
func (t *Table) remember(h uint64, x ghost, now int64) {
	if t.memory().put(t.kind, h, x, now, t.paceLife.Load()) {
		t.countForgotten(1)
	}
}

// countForgotten counts n ghosts forgotten while they mattered.
func (t *Table) countForgotten(n int) {
	if count := t.forgot.Load(); count != nil {
		for range n {
			(*count)()
		}
	}
}

// fresh makes a state for key, starting from what it had when it was
// evicted, if remembered.
func (t *Table) fresh(id ID) *State {
	st := t.newState(id)
	t.renew(st, id, t.begin(id, t.now()))
	return st
}

// begin is what a key's state starts from: what it had when it was
// evicted, if remembered (taken from the memory), else nothing.
type begin struct {
	c  carry // Window
	at int64 // Pace: the timeline's head (noBucket: idle)
}

// begin takes id's ghost, if any, as a start at now.
func (t *Table) begin(id ID, now int64) begin {
	switch t.kind {
	case Window:
		// The state starts at the newest bucket its carry was read for,
		// even with nothing carried: a request whose clock reading is
		// behind counts there, not in a window the carry was not read for.
		b := max(now, 0) / t.bucketLen
		if x, ok := t.ghost(id); ok {
			return begin{c: x.carryAt(b)}
		}
		return begin{c: carry{head: b}}
	case Pace:
		if x, ok := t.ghost(id); ok {
			return begin{at: x.timeline()}
		}
		return begin{at: noBucket}
	}
	return begin{}
}

// renew makes st, new or evicted (dead), the state of id starting from
// from, in its next life: its identity is written before that life
// begins, so that a lookup that finds the life finds the identity (see
// find). A Conc state keeps its count in flight: a request of its earlier
// life that counted there late takes it back (see Acquire).
func (t *Table) renew(st *State, id ID, from begin) {
	l := (st.Life() | dead) + 1
	st.setID(id)
	switch t.kind {
	case Window:
		st.load(from.c, l)
	case Pace:
		st.awaitGiveBacks() // the dead bit is set: later ones give nothing
		st.head.Store(from.at)
	}
	st.life.Store(uint32(l))
}

// ghost takes key id's ghost: while a table moves into this one, from its
// ghosts first (Migrate moves each under the old one's lock, so a ghost
// not found there has arrived here).
func (t *Table) ghost(id ID) (ghost, bool) {
	if from := t.from.Load(); from != nil {
		if x, ok := from.takeGhost(id); ok {
			return x, true
		}
	}
	return t.takeGhost(id)
}

// Migrate moves the keys of old, a table of another MaxKeys, into t (load
// time). The states move, so requests in flight on them still count, and
// old forwards every lookup and release to t from then on: a request that
// read the old rule set finds the same states, and no state lives in two
// tables (evicted from one, it would be dead in the other).
//
// A lookup in t of a key not moved yet moves its state itself (see add):
// were it to make a state of its own, the key would start afresh, and the
// requests still counting in the old state would count where no lookup
// finds them. Locks go old table's sets first, then t's, in both.
func (t *Table) Migrate(old *Table) {
	t.seeds = old.seeds // the states keep their identities
	t.noKey = old.noKey
	t.from.Store(old)
	defer t.from.Store(nil)
	old.specMu.Lock()
	t.spec, t.listed, t.pinned = old.spec, old.listed, old.pinned
	old.spec, old.listed, old.pinned = map[string]*State{}, map[ID]*State{}, map[ID]*State{}
	t.hasListed.Store(old.hasListed.Load())
	old.next.Store(t)
	old.specMu.Unlock()
	// Each set is read under its lock: an add to it that began before
	// next was set has finished (its evictions made), and one after it
	// sees next and goes to t.
	for i := range old.sets {
		held := old.lock(i, i)
		for j := range old.sets[i].ways {
			w := &old.sets[i].ways[j]
			if st := w.st.Load(); st != nil {
				w.tag.Store(0)
				w.st.Store(nil)
				old.size.Dec()
				t.insert(st)
			}
		}
		held.unlock()
	}
	// Then the ghosts: every add that could write one in old is over.
	if g := old.ghosts.Load(); g != nil {
		t.countForgotten(t.memory().moveFrom(g, t.kind, t.ghostNow(), t.paceLife.Load(), nil))
	}
}

// current is the table lookups go to: t, or the table it moved to.
func (t *Table) current() *Table {
	for {
		n := t.next.Load()
		if n == nil {
			return t
		}
		t = n
	}
}

// lockSpec locks the specMu of the table t moved to, if it did (Migrate
// moves the side table under the old table's specMu, so a table whose
// next is unset under its specMu still holds it), and returns that table.
func (t *Table) lockSpec() *Table {
	for {
		t.specMu.Lock()
		n := t.next.Load()
		if n == nil {
			return t
		}
		t.specMu.Unlock()
		t = n
	}
}

// Acquire counts n in flight on Conc state st, found in life l, if it
// stays at or below limit. It returns the count seen when it refuses;
// gone reports that the state left life l (nothing counted): the caller
// looks the key up again. Release gives it back. A reused Conc state keeps
// its count: what a request of an earlier life added late it takes back
// through Release, which unpins the state should that leave it evicted
// with nothing in flight.
func (t *Table) Acquire(st *State, l Life, n, limit int64) (seen int64, ok, gone bool) {
	for {
		cur := st.head.Load()
		if cur+n > limit {
			return cur, false, !st.Alive(l)
		}
		if !st.Alive(l) {
			return 0, false, true
		}
		if st.head.CompareAndSwap(cur, cur+n) {
			break
		}
	}
	if !st.Alive(l) {
		t.Release(st, n)
		return 0, false, true
	}
	return 0, true, false
}

// Release ends a Conc request of n on st (counted by st.Acquire), which
// may have left the table meanwhile (see evict).
func (t *Table) Release(st *State, n int64) {
	if st.head.Sub(n) > 0 || !st.pinned.Load() {
		return
	}
	t = t.lockSpec()
	defer t.specMu.Unlock()
	if st.pinned.Load() && st.head.Load() == 0 {
		// Dead first, then look again: a request that counted in it
		// meanwhile either sees it dead (and takes its count back) or is
		// seen here, and the state stays pinned, alive.
		st.kill()
		if st.head.Load() != 0 {
			st.revive()
			return
		}
		if id := st.id(); t.pinned[id] == st {
			delete(t.pinned, id)
		}
		st.pinned.Store(false)
	}
}

// lockAll locks every set of the table (in the order lock takes them),
// so that no key is added or evicted until the unlock it returns: keys
// and ghosts stay where they are (load time).
func (t *Table) lockAll() func() {
	for i := range t.locks {
		t.locks[i].Lock()
	}
	return func() {
		for i := range t.locks {
			t.locks[i].Unlock()
		}
	}
}

// Limits is what a key of a per-key rule admits per window, before and
// after a reload.
type Limits struct{ Was, Now int64 }

// Rewindow fills t, a Window table of another window length, with the
// keys of old (load time), old's sets held still meanwhile: each key (its
// state or its ghost) starts from what old counted over t's window at now,
// each count in the bucket that holds the last instant of the bucket it
// was counted in (so it stays as long as it would have, or longer), none
// of it dropped while any of that bucket is in t's window. Where t's
// window reaches further back than old's knew of a key (its four buckets
// up to its newest), the key is charged what old may have admitted there
// unseen, Was per old window of it (at most Now), in the bucket holding
// that part's last instant: it errs strict. limits gives a listed key's
// limits (one old lists, or one of listed, the keys the new rule set
// lists), rule those of the others.
//
// The requests of the old rule set, which run on until the new one is in
// force, count in t from then on: each state of old is ended before its
// counts are read (a request that counted in it meanwhile either is read
// or takes its count back), and old's lookups lead nowhere but to
// Successor, which waits until t holds every key, then names t and the
// stricter of a key's two limits there.
func (t *Table) Rewindow(old *Table, rule Limits, limits func(key string) Limits, listed []string) {
	now := max(t.now(), 0)
	unlockOld := old.lockAll()
	defer unlockOld()
	old.rewound.Store(&successor{t: t, rule: rule.Now, limits: limits})
	t.seeds = old.seeds
	ob := now / old.bucketLen
	conv := func(c carry, lim Limits) carry {
		out := rebucket(c, old.bucketLen, t.bucketLen, now)
		nb := out.head
		start := max((nb-Buckets+1)*t.bucketLen, 0) // t's window at now (nothing counts before 0)
		known := (c.head - Buckets + 1) * old.bucketLen
		if known > start && lim.Was > 0 {
			oldLen := old.bucketLen * Buckets
			windows := (known - start + oldLen - 1) / oldLen
			charge := min(lim.Now, lim.Was*windows, math.MaxUint32)
			s := &out.counts[slotOf(min((known-1)/t.bucketLen, nb))]
			*s = uint32(min(int64(*s)+charge, math.MaxUint32))
		}
		return out
	}
	state := func(st *State, lim Limits) *State {
		st.kill() // before its counts are read: see Admit
		ns := t.newState(st.id())
		head := st.head.Load()
		if head == noBucket || head > ob+Buckets {
			return ns // never counted (or on a clock far ahead): nothing known
		}
		c, _ := st.carry(head)
		c.head = head
		ns.load(conv(c, lim), ns.Life())
		return ns
	}
	t.noKey = state(old.noKey, rule)
	old.specMu.Lock()
	for k, st := range old.spec {
		t.list(k, state(st, limits(k)))
	}
	old.specMu.Unlock()
	// A key listed anew is in the sets (or among the ghosts), under its
	// own limits from now on.
	var own map[ID]Limits
	var ownGhost map[uint64]Limits
	if len(listed) > 0 {
		own, ownGhost = make(map[ID]Limits, len(listed)), make(map[uint64]Limits, len(listed))
		for _, k := range listed {
			id := ID{old.hash(k), old.check(k)}
			own[id], ownGhost[id.h] = limits(k), limits(k)
		}
	}
	for i := range old.sets {
		for j := range old.sets[i].ways {
			if st := old.sets[i].ways[j].st.Load(); st != nil {
				lim, ok := own[st.id()]
				if !ok {
					lim = rule
				}
				t.insert(state(st, lim))
			}
		}
	}
	// The old table's ghosts too, copied: it lives on for the old rules.
	if g := old.ghosts.Load(); g != nil {
		ng := t.memory()
		forgot := 0
		g.each(func(h uint64, x *ghost) bool {
			lim, ok := ownGhost[h]
			if !ok {
				lim = rule
			}
			y := ghostOf(conv(x.carryAt(x.headNear(ob)), lim))
			if y.n != ([Buckets]uint32{}) && ng.put(Window, h, y, now/t.bucketLen, 0) {
				forgot++
			}
			return false
		})
		t.countForgotten(forgot)
	}
}

// successor is where a table's keys went (see Rewindow): the table, and
// a key's limit there (limits nil: rule for every key).
type successor struct {
	t      *Table
	rule   int64
	limits func(key string) Limits
}

// moved is what a lookup of a table whose keys went to another (see
// Rewindow) returns: a state no request counts in (Admit reports it
// gone), so that the request asks Successor.
var moved = func() *State {
	st := &State{}
	st.head.Store(noBucket)
	st.kill()
	return st
}()

// Successor is the table a request counts in once t's keys went to a
// table of another window (see Rewindow), following moves before and
// after it, and
// limit lowered to the key's limit there if that is stricter (hasKey
// false: the rule's). It returns nil while t is in use: a request that
// Admit reported gone then looks its key up again in t.
func (t *Table) Successor(key string, hasKey bool, limit int64) (*Table, int64) {
	// The table t's lookups go to: t's keys may have moved to a table of
	// another MaxKeys (Migrate) before that one's moved to another window.
	t = t.current()
	s := t.rewound.Load()
	if s == nil {
		return nil, limit
	}
	// Wait out the move itself: Rewindow holds every lock of t's sets
	// until the successor holds every key, and one made there by a
	// request meanwhile would stand beside the key moved.
	t.locks[0].Lock()
	t.locks[0].Unlock() //nolint:staticcheck // an empty section: a wait
	now := s.rule
	if hasKey && s.limits != nil {
		now = s.limits(key).Now
	}
	return s.t.current(), min(limit, now)
}

// Lookup is the state a request of key counts in (hasKey false: the
// state requests without a key share), and its life.
func (t *Table) Lookup(key string, hasKey bool) (*State, Life) {
	if !hasKey {
		return t.NoKeyState() // shared by the tables it moves between (see Migrate)
	}
	return t.Get(key)
}

// RescaleTimelines makes every Pace key's queue ahead of now ratio times
// as long (see pace.Rescale): ratio(key) for a listed key, rule for the
// others (load time, before the listed keys change), the sets held still
// meanwhile (a key evicted or back would be rescaled twice, or not at
// all).
func (t *Table) RescaleTimelines(now int64, rule float64, ratio func(key string) float64) {
	defer t.lockAll()()
	t.specMu.Lock()
	for k, st := range t.spec {
		pace.Rescale(&st.head, now, ratio(k))
	}
	t.specMu.Unlock()
	pace.Rescale(&t.noKey.head, now, rule)
	t.Each(func(st *State) { pace.Rescale(&st.head, now, rule) })
	if g := t.ghosts.Load(); g != nil {
		g.rescaleTimelines(now, rule)
	}
}

// RescaleListed rescales the timeline of a key the rule lists, kept apart
// from now on (see Specific and pace.Rescale; load time).
func (t *Table) RescaleListed(key string, now int64, ratio float64) {
	st, _ := t.Specific(key)
	pace.Rescale(&st.head, now, ratio)
}
