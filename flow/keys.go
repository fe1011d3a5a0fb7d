package flow

import (
	"hash/maphash"
	"math"
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/stat"
)

// A per-key rule keeps a compact state per key in a bounded table (see
// keyTable). A key is not a resource: its state is one cache line, with no
// stripes and no statistics of its own; the resource's node counts every
// request as before.
//
// When a key new to the table finds both its sets full, it replaces the
// state that loses least, and none of them lets a key exceed its threshold
// in any window:
//   - A key whose window is over (QPS), whose timeline is past (Throttle)
//     or with nothing in flight (Concurrency) goes first: nothing is lost.
//   - Else the key least recently counted in is evicted while active (more
//     keys active at once than the table holds). Its count in its last
//     window, and until when it counts, go into a small count sketch (two
//     rows of cells, each keeping the largest live count written to it). A
//     key that comes back starts with the smaller of its two cells in its
//     newest bucket, which covers what it had: evicting a key k times in a
//     window gives it nothing more. A key that shares both cells with an
//     evicted active key starts with that key's count instead (stricter,
//     never looser) until that window ends. Each such eviction is counted
//     in the resource's KeyEvictions.
//   - A Concurrency key with requests in flight is never dropped: evicted,
//     it moves to a side table until its last request exits or it is seen
//     again.
//
// A request that found a key's state just before it was evicted and counts
// in it after sees the state marked dead, takes its count back and looks
// the key up again.

// keyKind is what a per-key rule keeps per key.
type keyKind uint8

const (
	keyWindow keyKind = iota // QPS Reject: a sliding window of keyBuckets
	keyPace                  // QPS Throttle: a pacing timeline
	keyConc                  // Concurrency: requests in flight
)

// keyBuckets is the bucket count of a key's window, whatever the engine's
// sample count: any span shorter than 3/4 of the window admits at most the
// threshold, a whole window at most twice it (as a resource's default
// second window).
const keyBuckets = 4

// A window word is a bucket's epoch (its index, low keyEpochBits bits)
// above its count.
const (
	keyCountBits = 40
	keyCountMask = 1<<keyCountBits - 1
	keyEpochMask = 1<<(64-keyCountBits) - 1
)

func packBucket(b int64, count uint64) uint64 {
	return uint64(b)&keyEpochMask<<keyCountBits | count
}

func epochIs(w uint64, b int64) bool { return w>>keyCountBits == uint64(b)&keyEpochMask }

// newer reports whether w holds a bucket later than b (epochs compared
// modulo 2^24, so within 2^23 buckets of each other).
func newer(w uint64, b int64) bool {
	d := (w>>keyCountBits - uint64(b)) & keyEpochMask
	return d != 0 && d < 1<<(63-keyCountBits)
}

// slotOf is bucket b's word (b may be negative: a clock near its origin).
func slotOf(b int64) int { return int(uint64(b) % keyBuckets) }

// keyState is one key's state, one cache line (64 bytes). Only the fields
// of its table's kind are used: one type keeps the table's code single.
type keyState struct {
	// head is the newest bucket index (keyWindow), the timeline's head in
	// ns (keyPace), or the requests in flight (keyConc).
	head  atomic.Int64
	words [keyBuckets]atomic.Uint64
	// id is the key's identity in its table (see keyID).
	id keyID
	// dead is set when the state left its table: a request that counted
	// in it since takes the count back and looks the key up again.
	dead atomic.Bool
	// pinned is set while a keyConc state with requests in flight sits in
	// its table's side table.
	pinned atomic.Bool
}

// noBucket is the head of a window that never counted.
const noBucket = math.MinInt64 / 2

func (t *keyTable) newState(id keyID) *keyState {
	st := &keyState{id: id}
	if t.kind != keyConc {
		st.head.Store(noBucket)
	}
	return st
}

// keyTable is one per-key rule's keys: a set-associative table of sets of
// keyWays states. A key hashes to two sets and lives in one of them;
// lookups take no lock (a set is one cache line of tag and pointer pairs:
// a tag compare per way, then the key), and adding a key locks its two sets and, when both are full, replaces the state in
// them that loses least (see victim). It outlives rule sets: a rule
// reloaded with other thresholds keeps its keys' counts.
//
// It is our own rather than a cache library's: measured on the bench's
// zipf stream over 100,000 keys, an otter v2 lookup took 63 ns where a Go
// map took 15 ns, which alone would have made a per-key Entry three times
// the cost of a plain one; this table's lookup is a hash and two cache
// lines, and its eviction knows which keys lose nothing.
type keyTable struct {
	kind      keyKind
	bucketLen int64 // keyWindow
	window    int64 // keyWindow: bucketLen * keyBuckets
	sets      []keySet
	seeds     [2]maphash.Seed
	noKey     *keyState
	now       func() int64
	node      atomic.Pointer[stat.Node] // where evictions are counted
	size      atomic.Int64              // keys in sets

	// sketch holds what evicted active keys had (see the type's doc).
	sketch carrySketch

	// locks guard adding to and evicting from sets (by set index).
	locks [keyLocks]paddedMutex
	// next is the table this one moved to (see migrate).
	next atomic.Pointer[keyTable]

	// specMu guards spec, the states of the keys listed in the rule's
	// Keys (kept across reloads), and pinned, keyConc states with
	// requests in flight that were evicted.
	specMu sync.Mutex
	spec   map[string]*keyState
	pinned map[keyID]*keyState
}

// keyID identifies a key in its table: two 64-bit hashes of it, keyed by
// seeds drawn per table. Two keys share a state only if both hashes
// collide, odds of 2^-128 per pair that no caller can steer (the seeds are
// secret); were it to happen, they would share one window, stricter for
// both, never looser. Keeping the hashes rather than the key saves a
// pointer chase per lookup and the key's bytes per tracked key.
type keyID struct{ h, c uint64 }

// keyWays is the states per set: a set is one cache line of tag and
// pointer pairs.
const (
	keyWays  = 4
	keyLocks = 64
)

type keySet struct {
	ways [keyWays]keyWay
}

type keyWay struct {
	tag atomic.Uint64 // the hash of the key (0: none)
	st  atomic.Pointer[keyState]
}

type paddedMutex struct {
	sync.Mutex
	_ [cpu.CacheLine - 8]byte
}

// newKeyTable makes the table of a per-key rule r (valid, defaults in).
func newKeyTable(r *Rule, node *stat.Node, now func() int64) *keyTable {
	t := &keyTable{now: now, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		spec: map[string]*keyState{}, pinned: map[keyID]*keyState{}}
	t.noKey = t.newState(keyID{})
	t.node.Store(node)
	switch {
	case r.Metric == Concurrency:
		t.kind = keyConc
	case r.Behavior == Throttle:
		t.kind = keyPace
	default:
		t.kind = keyWindow
		t.window = int64(r.StatInterval)
		t.bucketLen = t.window / keyBuckets
	}
	if t.kind != keyConc {
		t.sketch = newCarrySketch(r.MaxKeys, t.kind)
	}
	t.sets = make([]keySet, (r.MaxKeys+keyWays-1)/keyWays)
	return t
}

// capacity is the most keys the table tracks: MaxKeys rounded up to a
// whole set.
func (t *keyTable) capacity() int { return len(t.sets) * keyWays }

func newKeyTableCap(maxKeys int) int { return (maxKeys + keyWays - 1) / keyWays * keyWays }

// hash is key's first hash, never 0 (0 marks an empty way).
func (t *keyTable) hash(key string) uint64 { return maphash.String(t.seeds[0], key) | 1 }

// check is key's second hash.
func (t *keyTable) check(key string) uint64 { return maphash.String(t.seeds[1], key) }

// setsOf returns the two sets of hash h.
func (t *keyTable) setsOf(h uint64) (int, int) {
	n := uint64(len(t.sets))
	return int(uint64(uint32(h)) * n >> 32), int((h >> 32) * n >> 32)
}

// specific returns the state of a key listed in the rule's Keys, kept
// across reloads (load time only).
func (t *keyTable) specific(key string) *keyState {
	t.specMu.Lock()
	defer t.specMu.Unlock()
	st := t.spec[key]
	if st == nil {
		if st = t.take(key); st == nil {
			st = t.newState(keyID{})
		}
		t.spec[key] = st
	}
	return st
}

// keepSpecific drops the states of keys no longer listed in the rule's
// Keys into the sets, with their counts (load time).
func (t *keyTable) keepSpecific(keys []KeyLimit) {
	listed := make(map[string]bool, len(keys))
	for _, kl := range keys {
		listed[kl.Key] = true
	}
	t.specMu.Lock()
	var gone []string
	for k := range t.spec {
		if !listed[k] {
			gone = append(gone, k)
		}
	}
	t.specMu.Unlock()
	for _, k := range gone {
		t.specMu.Lock()
		st := t.spec[k]
		delete(t.spec, k)
		t.specMu.Unlock()
		t.put(k, st)
	}
}

// get returns key's state, adding it if the table lacks it.
func (t *keyTable) get(key string) *keyState {
	if n := t.next.Load(); n != nil {
		return n.current().get(key) // moved to a table of another MaxKeys
	}
	h := t.hash(key)
	a, b := t.setsOf(h)
	var c uint64 // the second hash, made when a tag matches
	if st := t.sets[a].find(h, &c, t, key); st != nil {
		return st
	}
	if st := t.sets[b].find(h, &c, t, key); st != nil {
		return st
	}
	if c == 0 {
		c = t.check(key)
	}
	return t.add(keyID{h, c}, a, b)
}

// find returns the live state of key in s, or nil.
func (s *keySet) find(h uint64, c *uint64, t *keyTable, key string) *keyState {
	for i := range s.ways {
		w := &s.ways[i]
		if w.tag.Load() == h {
			if *c == 0 {
				*c = t.check(key)
			}
			if st := w.st.Load(); st != nil && st.id == (keyID{h, *c}) {
				return st
			}
		}
	}
	return nil
}

// findID is find by identity (under the sets' locks).
func (s *keySet) findID(id keyID) *keyState {
	for i := range s.ways {
		if st := s.ways[i].st.Load(); st != nil && st.id == id {
			return st
		}
	}
	return nil
}

// add is get's slow path: a key new to the table (or back to it).
func (t *keyTable) add(id keyID, a, b int) *keyState {
	unlock := t.lock(a, b)
	if n := t.next.Load(); n != nil {
		// Moved to another table while we waited (see migrate).
		unlock()
		return n.current().getID(id)
	}
	defer unlock()
	// Added by another request while we waited?
	if st := t.findLocked(id, a, b); st != nil {
		return st
	}
	var st *keyState
	if t.kind == keyConc {
		t.specMu.Lock()
		if st = t.pinned[id]; st != nil {
			// Back from the side table.
			delete(t.pinned, id)
			st.pinned.Store(false)
		}
		t.specMu.Unlock()
	}
	if st == nil {
		st = t.fresh(id)
	}
	t.placeLocked(st, a, b)
	return st
}

// getID is get for a key known by its identity (same seeds: see migrate).
func (t *keyTable) getID(id keyID) *keyState {
	a, b := t.setsOf(id.h)
	if st := t.sets[a].findID(id); st != nil {
		return st
	}
	if st := t.sets[b].findID(id); st != nil {
		return st
	}
	return t.add(id, a, b)
}

// lock locks sets a and b (in one order: no deadlock) and returns the
// unlock.
func (t *keyTable) lock(a, b int) func() {
	la, lb := &t.locks[a%keyLocks], &t.locks[b%keyLocks]
	if la == lb {
		la.Lock()
		return la.Unlock
	}
	if a%keyLocks > b%keyLocks {
		la, lb = lb, la
	}
	la.Lock()
	lb.Lock()
	return func() {
		lb.Unlock()
		la.Unlock()
	}
}

func (t *keyTable) findLocked(id keyID, a, b int) *keyState {
	if st := t.sets[a].findID(id); st != nil {
		return st
	}
	return t.sets[b].findID(id)
}

// placeLocked puts st into set a or b, replacing the victim's state.
func (t *keyTable) placeLocked(st *keyState, a, b int) {
	now := t.now()
	set, way := t.victim(a, b, now)
	w := &t.sets[set].ways[way]
	if old := w.st.Load(); old != nil {
		t.evict(old, now)
	} else {
		t.size.Inc()
	}
	w.tag.Store(0) // no lookup matches a half-written way
	w.st.Store(st)
	w.tag.Store(st.id.h)
}

// take removes key's state from the sets, if there, without ending it:
// it moves to the rule's Keys (load time).
func (t *keyTable) take(key string) *keyState {
	id := keyID{t.hash(key), t.check(key)}
	a, b := t.setsOf(id.h)
	unlock := t.lock(a, b)
	defer unlock()
	for _, si := range [2]int{a, b} {
		for i := range t.sets[si].ways {
			w := &t.sets[si].ways[i]
			if st := w.st.Load(); st != nil && st.id == id {
				w.tag.Store(0)
				w.st.Store(nil)
				t.size.Dec()
				return st
			}
		}
	}
	return nil
}

// put puts st, the state of key, into the sets: a key that left the
// rule's Keys keeps its counts (load time).
func (t *keyTable) put(key string, st *keyState) {
	st.id = keyID{t.hash(key), t.check(key)}
	t.insert(st)
}

// insert puts st into its sets unless its key is there already.
func (t *keyTable) insert(st *keyState) {
	a, b := t.setsOf(st.id.h)
	unlock := t.lock(a, b)
	defer unlock()
	if t.findLocked(st.id, a, b) == nil {
		t.placeLocked(st, a, b)
	}
}

// victim picks the way a new key takes in sets a and b: an empty one, else
// the state that loses least when evicted: one whose window is over (or
// whose timeline is past, or with nothing in flight), else the one least
// recently counted in.
func (t *keyTable) victim(a, b int, now int64) (set, way int) {
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
				best, bestAge = k*keyWays+i, age
			}
		}
	}
	if best < keyWays {
		return a, best
	}
	return b, best - keyWays
}

// idleFor says how little a state loses if evicted at now: the larger, the
// less. Past 0 it loses nothing.
func (t *keyTable) idleFor(st *keyState, now int64) int64 {
	switch t.kind {
	case keyConc:
		if st.head.Load() == 0 {
			return 1
		}
		return math.MinInt64 / 2 // pinned if evicted
	case keyPace:
		return now - st.head.Load()
	}
	h := st.head.Load()
	if h == noBucket {
		return math.MaxInt64 / 2
	}
	return now - (h+keyBuckets)*t.bucketLen // past 0: the window is over
}

// evict takes st out of the table (its way is being replaced, under the
// set's lock): what it holds goes to the sketch, or, for a keyConc state
// with requests in flight, to the side table.
func (t *keyTable) evict(st *keyState, now int64) {
	st.dead.Store(true)
	switch t.kind {
	case keyConc:
		if st.head.Load() > 0 {
			t.specMu.Lock()
			t.pinned[st.id] = st
			st.pinned.Store(true)
			if st.head.Load() == 0 {
				// Its last request exited as we pinned it, and may have
				// missed the mark: unpinned here.
				delete(t.pinned, st.id)
				st.pinned.Store(false)
				t.specMu.Unlock()
				return
			}
			// Alive again before the lock goes: a release that unpins it
			// (under the lock) marks it dead after this.
			st.dead.Store(false)
			t.specMu.Unlock()
		}
		return
	case keyWindow:
		// Read after dead is set: a request that counts later sees it.
		// Kept for a window more than this clock reading needs: another
		// request's reading may be behind it.
		b := now / t.bucketLen
		c, ok := st.carry(b - keyBuckets)
		if !ok {
			return // its window is over: nothing to keep
		}
		t.sketch.addCarry(st.id.h, c)
		if c.head+keyBuckets <= b {
			return // idle by this clock: not counted as active
		}
	case keyPace:
		// Kept even when past: the next request's cost runs from it.
		at := st.head.Load()
		t.sketch.addHead(st.id.h, at)
		if at <= now-int64(time.Second) {
			return // idle a second: not counted as active
		}
	}
	t.node.Load().AddKeyEviction()
}

// fresh makes a state for key, starting from what the sketch says it had
// when it was evicted.
func (t *keyTable) fresh(id keyID) *keyState {
	st := t.newState(id)
	switch t.kind {
	case keyWindow:
		// The state starts at the newest bucket its carry was read for,
		// even with nothing carried: a request whose clock reading is
		// behind counts there, not in a window the carry was not read for.
		b := max(t.now(), 0) / t.bucketLen
		c, _ := t.sketch.carryOf(id.h, b)
		st.head.Store(c.head)
		for x := c.head - keyBuckets + 1; x <= c.head; x++ {
			// Each count back in its own bucket: they leave the window
			// when they would have.
			st.words[slotOf(x)].Store(packBucket(x, uint64(c.at(x))))
		}
	case keyPace:
		if at := t.sketch.head(id.h); at != 0 {
			st.head.Store(at)
		}
	}
	return st
}

// migrate moves the keys of old, a table of another MaxKeys, into t (load
// time). The states move, so requests in flight on them still count, and
// old forwards every lookup and release to t from then on: a request that
// read the old rule set finds the same states, and no state lives in two
// tables (evicted from one, it would be dead in the other).
func (t *keyTable) migrate(old *keyTable) {
	t.sketch = old.sketch
	t.seeds = old.seeds // the states keep their identities
	t.noKey = old.noKey
	old.specMu.Lock()
	t.spec, t.pinned = old.spec, old.pinned
	old.spec, old.pinned = map[string]*keyState{}, map[keyID]*keyState{}
	old.next.Store(t)
	old.specMu.Unlock()
	// Each set is read under its lock: an add to it that began before
	// next was set has finished (its evictions made), and one after it
	// sees next and goes to t.
	for i := range old.sets {
		unlockOld := old.lock(i, i)
		for j := range old.sets[i].ways {
			if st := old.sets[i].ways[j].st.Load(); st != nil {
				t.insert(st)
			}
		}
		unlockOld()
	}
}

// current is the table lookups go to: t, or the table it moved to.
func (t *keyTable) current() *keyTable {
	for {
		n := t.next.Load()
		if n == nil {
			return t
		}
		t = n
	}
}

// release ends a keyConc request of n on st, which may have left the
// cache meanwhile (see onDelete).
func (t *keyTable) release(st *keyState, n int64) {
	if st.head.Sub(n) > 0 || !st.pinned.Load() {
		return
	}
	t = t.current()
	t.specMu.Lock()
	defer t.specMu.Unlock()
	if st.pinned.Load() && st.head.Load() == 0 {
		// Dead first, then look again: a request that counted in it
		// meanwhile either sees it dead (and takes its count back) or is
		// seen here, and the state stays pinned, alive.
		st.dead.Store(true)
		if st.head.Load() != 0 {
			st.dead.Store(false)
			return
		}
		if t.pinned[st.id] == st {
			delete(t.pinned, st.id)
		}
		st.pinned.Store(false)
	}
}

// carry is what the state's window holds at bucket now, bucket by bucket;
// false if nothing.
func (st *keyState) carry(now int64) (carry, bool) {
	head := st.head.Load()
	if head == noBucket || head+keyBuckets <= now {
		return carry{}, false
	}
	c := carry{head: head}
	var any bool
	for x := head - keyBuckets + 1; x <= head; x++ {
		if w := st.words[slotOf(x)].Load(); epochIs(w, x) && w&keyCountMask > 0 {
			c.counts[slotOf(x)] = uint32(min(w&keyCountMask, math.MaxUint32))
			any = true
		}
	}
	return c, any
}

// sum is the count of the window whose newest bucket is head.
func (st *keyState) sum(head int64) uint64 {
	var c uint64
	if head == noBucket {
		return 0
	}
	for j := range int64(keyBuckets) {
		b := head - j
		if w := st.words[slotOf(b)].Load(); epochIs(w, b) {
			c += w & keyCountMask
		}
	}
	return c
}

// admitWindow counts n in the key's window at now if its window stays at
// or below limit. It returns the bucket counted in (for undo), or false
// and the count seen. dead reports that the state left the table: the
// caller looks the key up again.
//
// The check and the count are strict at any concurrency: the count is a
// compare-and-swap on the current bucket's word bounded by the sum of the
// window read before it, and a request that finds a newer bucket after its
// count takes it back and counts there. Only the newest bucket takes
// counts, so for any window the request counted last in it read every
// other count of that window first.
func (t *keyTable) admitWindow(st *keyState, now, n, limit int64) (b int64, seen int64, ok, dead bool) {
	if n > limit {
		return 0, 0, false, false
	}
	b = max(now, 0) / t.bucketLen
	for {
		h := st.head.Load()
		if b > h {
			if !st.head.CompareAndSwap(h, b) {
				continue
			}
			if b-h >= keyBuckets {
				t.clearOld(st, b)
			}
		} else {
			b = h // behind the newest bucket: count there
		}
		slot := &st.words[slotOf(b)]
		w := slot.Load()
		if !epochIs(w, b) {
			// A word of a later bucket means the head moved on since we
			// read it: count there. (With the head still at b, a word that
			// looks later is one so old its epoch wrapped.)
			if newer(w, b) && st.head.Load() != b {
				continue
			}
			if !slot.CompareAndSwap(w, packBucket(b, 0)) {
				continue
			}
			w = packBucket(b, 0)
		}
		sum := int64(w & keyCountMask)
		for j := int64(1); j < keyBuckets; j++ {
			if x := st.words[slotOf(b-j)].Load(); epochIs(x, b-j) {
				sum += int64(x & keyCountMask)
			}
		}
		if sum+n > limit {
			return 0, sum, false, st.dead.Load()
		}
		if !slot.CompareAndSwap(w, w+uint64(n)) {
			continue
		}
		if st.head.Load() != b {
			// A newer bucket began: count there instead.
			undoBucket(st, b, n)
			continue
		}
		if st.dead.Load() {
			undoBucket(st, b, n)
			return 0, 0, false, true
		}
		return b, 0, true, false
	}
}

// clearOld marks the buckets before b as empty ones of b's window after
// the key was idle for a window or more, so that no word older than that
// can pass for a current one (epochs are kept modulo 2^24). A word a newer
// bucket wrote meanwhile is left alone.
func (t *keyTable) clearOld(st *keyState, b int64) {
	for j := int64(1); j < keyBuckets; j++ {
		e := b - j
		slot := &st.words[slotOf(e)]
		// Late (the head moved on meanwhile), leave every word alone; and
		// never touch a word of a later bucket.
		if w := slot.Load(); st.head.Load() == b && !epochIs(w, e) && !newer(w, e) {
			slot.CompareAndSwap(w, packBucket(e, 0))
		}
	}
}

// undoBucket takes back n counted in bucket b, unless the bucket left the
// window (its word holds a newer one).
func undoBucket(st *keyState, b, n int64) {
	slot := &st.words[slotOf(b)]
	for {
		w := slot.Load()
		if !epochIs(w, b) || slot.CompareAndSwap(w, w-uint64(n)) {
			return
		}
	}
}

// acquireConc counts n in flight on a key if it stays at or below limit.
func acquireConc(st *keyState, n, limit int64) (seen int64, ok, dead bool) {
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

// roomIn is Window.RoomIn for a key's window: how long until it has room
// for n under limit, taking no more admissions, and until it empties.
func (t *keyTable) roomIn(st *keyState, now, n, limit int64) room {
	if n > limit {
		return unknownRoom
	}
	head := st.head.Load()
	if head == noBucket {
		return room{0, 0}
	}
	b := max(now, 0) / t.bucketLen
	head = max(head, b)
	held := int64(st.sum(head))
	rm := room{0, max((head+keyBuckets)*t.bucketLen-now, 0)}
	// Oldest bucket first: each leaves the window keyBuckets after it.
	for x := head - keyBuckets + 1; held+n > limit && x <= head; x++ {
		if w := st.words[slotOf(x)].Load(); epochIs(w, x) {
			held -= int64(w & keyCountMask)
		}
		rm.retry = max((x+keyBuckets)*t.bucketLen-now, 0)
	}
	return rm
}
