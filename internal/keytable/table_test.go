package keytable

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/cpu"
)

func TestStatesAndSetsAreOneCacheLine(t *testing.T) {
	assert.Equal(t, uintptr(cpu.CacheLine), unsafe.Sizeof(State{}))
	assert.Equal(t, uintptr(cpu.CacheLine), unsafe.Sizeof(set{}))
	assert.Equal(t, uintptr(cpu.CacheLine), unsafe.Sizeof(paddedMutex{}))
}

func TestGetReturnsTheSameStateForTheSameKey(t *testing.T) {
	var now int64
	tbl := newWindowTable(1024, &now)
	states := map[*State]string{}
	for i := range 200 {
		k := fmt.Sprint("key-", i)
		st, _ := tbl.Get(k)
		require.NotContains(t, states, st, "%s shares %s's state", k, states[st])
		states[st] = k
	}
	for st, k := range states {
		assert.Same(t, st, stateOf(tbl, k), k)
	}
	assert.Equal(t, int64(200), tbl.Len())
	assert.NotSame(t, tbl.NoKey(), stateOf(tbl, ""), "no key is not the empty key")
}

func TestTableNeverHoldsMoreThanItsCapacity(t *testing.T) {
	for _, maxKeys := range []int{1, 4, 5, 64, 1000} {
		var now int64
		tbl := newWindowTable(maxKeys, &now)
		assert.Equal(t, CapacityFor(maxKeys), tbl.Capacity())
		assert.GreaterOrEqual(t, tbl.Capacity(), maxKeys)
		assert.Less(t, tbl.Capacity(), maxKeys+setWays)
		for i := range 20 * tbl.Capacity() {
			now += 10
			// Active keys, remembered once evicted (more than the table
			// remembers: some are forgotten).
			_, _, _, dead := admitKey(tbl, fmt.Sprint(i), now, 1, 1)
			require.False(t, dead)
		}
		n := 0
		tbl.Each(func(*State) { n++ })
		assert.LessOrEqual(t, n, tbl.Capacity(), "maxKeys %d", maxKeys)
		assert.Equal(t, int64(n), tbl.Len(), "maxKeys %d", maxKeys)
	}
}

// fill adds keys prefix0.. to tbl until st leaves its life stL (evicted),
// counting one in each at now if count; it returns how many it added.
func fill(t *testing.T, tbl *Table, st *State, stL Life, prefix string, now int64, count bool) int {
	t.Helper()
	for i := range 100 * tbl.Capacity() {
		f, fL := tbl.Get(fmt.Sprint(prefix, i))
		if count {
			tbl.Admit(f, fL, now, 1, 1)
		}
		if !st.Alive(stL) {
			return i + 1
		}
	}
	t.Fatal("never evicted")
	return 0
}

func TestEvictionTakesAnIdleKeyFirstAndCountsNone(t *testing.T) {
	var now int64
	tbl := newWindowTable(4, &now) // one set: every key competes
	evictions := 0
	tbl.CountEvictions(func() { evictions++ })
	idle, idleL := tbl.Get("idle")
	_, _, ok, _ := tbl.Admit(idle, idleL, 0, 1, 3)
	require.True(t, ok)
	now = 2000 // idle's window is over
	var active []*State
	for i := range 3 {
		st, stL := tbl.Get(fmt.Sprint("active", i))
		_, _, ok, _ := tbl.Admit(st, stL, now, 1, 3)
		require.True(t, ok)
		active = append(active, st)
	}
	tbl.Get("new")
	assert.True(t, !idle.Alive(idleL), "the idle key went")
	for _, st := range active {
		assert.True(t, st.Alive(st.Life()&^dead), "an active key stays")
	}
	assert.Zero(t, evictions, "an idle key's eviction loses nothing")
}

// TestEvictedKeyComesBackWithItsCount: a flood of other keys evicts an
// active key, which comes back within its window with its count: the
// flood resets nothing. Its counts leave the window when they would have.
func TestEvictedKeyComesBackWithItsCount(t *testing.T) {
	var now int64
	tbl := newWindowTable(4, &now)
	evictions := 0
	tbl.CountEvictions(func() { evictions++ })
	const limit = 3
	hot, hotL := tbl.Get("hot")
	runAdmitSteps(t, tbl, hot, limit, []admitStep{{0, 1, true}, {300, 2, true}, {400, 1, false}})
	now = 500
	// Keys that count nothing leave no ghost: hot comes back with
	// exactly its own counts.
	fill(t, tbl, hot, hotL, "flood", now, false)
	assert.Positive(t, evictions, "an active key's eviction is counted")
	back, _ := tbl.Get("hot")
	runAdmitSteps(t, tbl, back, limit, []admitStep{
		{600, 1, false},  // still 3 in the window
		{1000, 1, true},  // bucket 0's 1 left
		{1000, 1, false}, //
		{1250, 2, true},  // bucket 1's 2 left
	})
	// Evicted again and again within one window: never more.
	now = 1300
	for round := range 5 {
		st, stL := tbl.Get("hot")
		_, _, ok, _ := tbl.Admit(st, stL, now, 1, limit)
		assert.False(t, ok, "round %d", round)
		fill(t, tbl, st, stL, fmt.Sprint("round", round, "-"), now, true)
	}
}

func TestEvictedPaceKeyKeepsItsTimeline(t *testing.T) {
	var now int64
	tbl := New(Config{Kind: Pace, MaxKeys: 4, Now: func() int64 { return now }})
	hot, hotL := tbl.Get("hot")
	hot.Timeline().Store(5e9)
	for i := 0; hot.Alive(hotL); i++ {
		require.Less(t, i, 1000, "never evicted")
		stateOf(tbl, fmt.Sprint("flood", i)).Timeline().Store(6e9) // ahead of hot: hot goes first
	}
	assert.GreaterOrEqual(t, stateOf(tbl, "hot").Timeline().Load(), int64(5e9))
}

func TestSpecificKeysAreNeverEvicted(t *testing.T) {
	var now int64
	tbl := newWindowTable(4, &now)
	const limit = 2
	// A key in the sets moves out with its count when listed.
	st, _ := tbl.Get("vip")
	runAdmitSteps(t, tbl, st, limit, []admitStep{{0, 2, true}})
	vip, vipL := tbl.Specific("vip")
	require.Same(t, st, vip)
	assert.Zero(t, tbl.Len())
	assert.Equal(t, 1, tbl.Listed())
	for i := range 100 {
		admitKey(tbl, fmt.Sprint("flood", i), 0, 1, 1)
	}
	assert.True(t, vip.Alive(vipL))
	again, _ := tbl.Specific("vip")
	assert.Same(t, vip, again)
	// No longer listed: back in the sets, with its count.
	tbl.KeepSpecific([]string{"other"})
	assert.Zero(t, tbl.Listed())
	assert.Same(t, vip, stateOf(tbl, "vip"))
	runAdmitSteps(t, tbl, vip, limit, []admitStep{{10, 1, false}})
}

// TestMigrateKeepsCounts: a reload that changes MaxKeys moves the keys to
// a new table: the same states when it grows, their counts through the
// ghosts of evicted keys when it shrinks; the old table forwards to the new one, so a
// request that read the old rules finds a live state.
func TestMigrateKeepsCounts(t *testing.T) {
	for _, c := range []struct{ from, to int }{{8, 64}, {64, 4}} {
		t.Run(fmt.Sprintf("maxKeys=%d->%d", c.from, c.to), func(t *testing.T) {
			var now int64
			old := newWindowTable(c.from, &now)
			const limit = 2
			var keys []string
			for i := range c.from / 2 {
				k := fmt.Sprint("k", i)
				keys = append(keys, k)
				_, _, ok, _ := admitKey(old, k, 0, limit, limit)
				require.True(t, ok)
			}
			next := newWindowTable(c.to, &now)
			next.Migrate(old)
			assert.LessOrEqual(t, next.Len(), int64(next.Capacity()))
			for _, k := range keys {
				for _, tbl := range []*Table{next, old} {
					st, stL := tbl.Get(k)
					require.False(t, !st.Alive(stL), "%s", k)
					_, seen, ok, dead := tbl.Admit(st, stL, 100, 1, limit)
					assert.False(t, dead, "%s", k)
					assert.False(t, ok, "%s counted again after the reload", k)
					assert.GreaterOrEqual(t, seen, int64(limit), "%s", k)
				}
			}
			if c.to > c.from {
				for _, k := range keys {
					assert.Same(t, stateOf(next, k), stateOf(old, k), "%s: one state", k)
				}
			}
		})
	}
}

// Rewindow moves a key's counts to a table of another window length, each
// in the new bucket that holds the last instant of its old one: they stay
// in the new window at least as long as they would have, and leave it
// once every instant of their old bucket has.
func TestRewindowKeepsCountsOverTheNewSpan(t *testing.T) {
	const ms = 1 // the test tables' clock: a window of 1000, buckets of 250
	var now int64
	old := newWindowTable(64, &now)
	st, _ := old.Get("k")
	admit := func(tbl *Table, st *State, n, limit int64) bool {
		_, _, ok, _ := tbl.Admit(st, st.Life(), now, n, limit)
		return ok
	}
	now = 100 * ms
	require.True(t, admit(old, st, 3, 10))
	now = 600 * ms
	require.True(t, admit(old, st, 4, 10))
	now = 900 * ms
	next := New(Config{Kind: Window, MaxKeys: 64, Window: 2000 * ms, Now: func() int64 { return now }})
	next.Rewindow(old, Limits{10, 10}, nil, nil)
	ns, _ := next.Get("k")
	assert.NotSame(t, st, ns)
	assert.False(t, admit(next, ns, 4, 10), "7 of 10 held: [0, 250 ms) in bucket 0, [500, 750) in bucket 1 (500 ms each)")
	assert.True(t, admit(next, ns, 3, 10))
	now = 2100 * ms // buckets 1..4: the 3 of bucket 0 left, the 4+3 of bucket 1 stay
	assert.False(t, admit(next, ns, 4, 10))
	assert.True(t, admit(next, ns, 3, 10))
	now = 2600 * ms // buckets 2..5
	assert.True(t, admit(next, ns, 7, 10), "bucket 1 left")
}

// A longer window reaches back past what the old one knew of a key: that
// part is charged what the old rule may have admitted there (its limit
// per old window of it, at most the new limit), in the new bucket holding
// its last instant, so that nothing is admitted over either rule. Ghosts
// move with their counts, charged alike.
func TestRewindowToALongerWindowChargesWhatItCannotKnow(t *testing.T) {
	var now int64
	old := newWindowTable(4, &now) // a window of 1000, buckets of 250
	next := New(Config{Kind: Window, MaxKeys: 4, Window: 2000, Now: func() int64 { return now }})
	admit := func(tbl *Table, key string, n, limit int64) bool {
		_, _, ok, _ := admitKey(tbl, key, now, n, limit)
		return ok
	}
	now = 10_100
	require.True(t, admit(old, "k", 4, 5))
	for i := range 12 { // evict a key with counts: it leaves a ghost
		require.True(t, admit(old, fmt.Sprint("g", i), 2, 5))
	}
	now = 10_200
	next.Rewindow(old, Limits{Was: 5, Now: 10}, nil, nil)
	// Buckets of 500: the window at 10,200 is [8500, 10500); the old one
	// knew k from 9250: 5 charged at bucket 18, its 4 at bucket 20.
	assert.True(t, admit(next, "k", 1, 10))
	assert.False(t, admit(next, "k", 1, 10), "9 + 1 of 10")
	now = 11_000 // [9500, 11500): the charge left
	assert.True(t, admit(next, "k", 5, 10))
	assert.False(t, admit(next, "k", 1, 10))
	// An evicted key: its ghost moved, charged the same (2 + 5 of 10).
	now = 10_200
	assert.True(t, admit(next, "g0", 3, 10))
	assert.False(t, admit(next, "g0", 1, 10))
}

// A table holding fewer active keys than its capacity keeps them: a new
// key whose two sets are full moves a key of theirs to its other set
// rather than evict an active one. Filled to 80% of its capacity with
// active keys, a table evicts almost none (about 4% of them when keys
// stayed where they first landed).
func TestActiveKeysStayWhileTheTableHasRoom(t *testing.T) {
	var now int64
	tbl := newWindowTable(20_000, &now)
	evicted := 0
	tbl.CountEvictions(func() { evicted++ })
	n := tbl.Capacity() * 8 / 10
	for i := range n {
		_, _, ok, _ := admitKey(tbl, fmt.Sprint("key-", i), now, 1, 10)
		require.True(t, ok)
	}
	assert.LessOrEqual(t, evicted, n/200, "active keys evicted of %d", n)
	assert.Equal(t, int64(n-evicted), tbl.Len())
	for i := range n {
		st := tbl.Peek(fmt.Sprint("key-", i))
		if st == nil {
			continue // one of the evicted
		}
		held, _ := tbl.Held(st, now)
		assert.Equal(t, int64(1), held, "key-%d kept its count where it moved", i)
	}
}

// A lookup that reads a key's two sets without their locks (Peek) finds
// it while a new key moves it from its second set to its first: a key that
// never leaves the table never reads as absent.
func TestPeekFindsAKeyWhileItMoves(t *testing.T) {
	pool := make([]string, 20000)
	for i := range pool {
		pool[i] = fmt.Sprint("key-", i)
	}
	for range 300 {
		var now int64
		tbl := newWindowTable(64, &now) // 16 sets
		sets := func(k string) (int, int) { return tbl.setsOf(tbl.hash(k)) }
		used := map[string]bool{}
		pick := func(ok func(a, b int) bool) string {
			for _, k := range pool {
				if a, b := sets(k); !used[k] && ok(a, b) {
					used[k] = true
					return k
				}
			}
			require.FailNow(t, "no key for the sets wanted")
			return ""
		}
		add := func(k string) {
			_, _, ok, _ := admitKey(tbl, k, now, 1, 10)
			require.True(t, ok)
		}
		// o lands in its second set q (its first, p, full); q then fills.
		o := pick(func(a, b int) bool { return a != b })
		p, q := sets(o)
		var ps []string
		for range setWays {
			k := pick(func(a, b int) bool { return a == p && b != q })
			ps = append(ps, k)
			add(k)
		}
		add(o)
		for range setWays - 1 {
			add(pick(func(a, b int) bool { return a == q && b != p && b != q }))
		}
		// A new key of q and a full set r, with a way free in p: adding
		// it moves o from q to p.
		n := pick(func(a, b int) bool { return a == q && b != p && b != q })
		_, r := sets(n)
		for tbl.sets[r].hasEmpty() {
			add(pick(func(a, b int) bool { return a == r && b != q && b != p }))
		}
		tbl.Reset(ps[0], nil)
		st := tbl.Peek(o)
		require.NotNil(t, st)

		var started, stop, missed atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() {
			for !stop.Load() {
				if tbl.Peek(o) == nil {
					missed.Store(true)
				}
				started.Store(true)
			}
		})
		for !started.Load() {
			runtime.Gosched()
		}
		add(n)
		stop.Store(true)
		wg.Wait()
		require.Same(t, st, tbl.sets[p].findID(st.id()), "o moved to its first set, never evicted")
		require.False(t, missed.Load(), "Peek read o as absent while it moved from set %d to set %d", q, p)
	}
}

// admitKey is Admit on key's state, in the life Get found it in.
func admitKey(t *Table, key string, now, n, limit int64) (b, seen int64, ok, gone bool) {
	st, l := t.Get(key)
	return t.Admit(st, l, now, n, limit)
}

// stateOf is key's state (its life unread).
func stateOf(t *Table, key string) *State {
	st, _ := t.Get(key)
	return st
}

// TestAListedKeyHasOneState: a key listed in the rule's Keys has one
// state, whoever looks it up: a lookup through the sets (a request of a
// rule set that does not list it, during a reload) finds the listed state
// rather than starting the key afresh, before and after it is unlisted.
func TestAListedKeyHasOneState(t *testing.T) {
	var now int64
	tbl := newWindowTable(64, &now)
	st, l := tbl.Get("k")
	_, _, ok, _ := tbl.Admit(st, l, now, 2, 3)
	require.True(t, ok)
	listed, _ := tbl.Specific("k")
	require.Same(t, st, listed, "it moves out with its count")
	got, gl := tbl.Get("k")
	assert.Same(t, listed, got, "a lookup finds the listed state")
	assert.Zero(t, tbl.Len(), "and leaves it out of the sets")
	_, _, ok, _ = tbl.Admit(got, gl, now, 2, 3)
	assert.False(t, ok, "its 2 are there")
	tbl.KeepSpecific(nil)
	assert.Same(t, listed, stateOf(tbl, "k"), "unlisted, into the sets")
	assert.EqualValues(t, 1, tbl.Len())
}

// admitThrough is a request of the rule set of table tbl: it counts in its
// key's state there, or, once a reload of another window moved the keys
// (see Rewindow), in the successor under the stricter limit.
func admitThrough(tbl *Table, key string, hasKey bool, now, n, limit int64) bool {
	for {
		st, l := tbl.Lookup(key, hasKey)
		_, _, ok, gone := tbl.Admit(st, l, now, n, limit)
		if !gone {
			return ok
		}
		if next, lim := tbl.Successor(key, hasKey, limit); next != nil {
			tbl, limit = next, lim
		}
	}
}

// A request of the rule set a reload of another window replaces counts
// in the table the keys moved to, under the stricter of its two limits:
// a key it tracked, a key new to it and the state of requests without a
// key alike. Its own table counts nothing more.
func TestRewindowedRequestsCountInTheSuccessor(t *testing.T) {
	var now int64 = 10_000
	old := New(Config{Kind: Window, MaxKeys: 64, Window: 2000, Now: func() int64 { return now }})
	require.True(t, admitThrough(old, "k", true, now, 2, 4))
	require.True(t, admitThrough(old, "", false, now, 2, 4))
	next := newWindowTable(64, &now) // a window of 1000: nothing charged
	next.Rewindow(old, Limits{Was: 4, Now: 3}, nil, nil)

	for _, key := range []string{"k", "new"} {
		nt, lim := old.Successor(key, true, 4)
		assert.Same(t, next, nt, key)
		assert.Equal(t, int64(3), lim, "%s: the new limit, stricter", key)
		st, l := old.Get(key)
		_, _, ok, gone := old.Admit(st, l, now, 1, 4)
		assert.True(t, !ok && gone, "%s: the old table counts nothing", key)
	}
	assert.True(t, admitThrough(old, "k", true, now, 1, 4), "2 moved + 1 of 3")
	assert.False(t, admitThrough(old, "k", true, now, 1, 4))
	assert.False(t, admitThrough(next, "k", true, now, 1, 3), "the new rule set sees the old one's request")
	assert.True(t, admitThrough(old, "", false, now, 1, 4))
	assert.False(t, admitThrough(next, "", false, now, 1, 3))
	assert.True(t, admitThrough(old, "new", true, now, 3, 4))
	assert.False(t, admitThrough(next, "new", true, now, 1, 3))
	_, lim := old.Successor("k", true, 2)
	assert.Equal(t, int64(2), lim, "the old limit where stricter")
	nt, _ := next.Successor("k", true, 3)
	assert.Nil(t, nt, "a table in use has none")
}

// A request of a rule set two reloads back (one of MaxKeys, which moves
// the keys to a table of another size, then one of the window) counts in
// the newest table, with or without a key, under its limit there: its
// lookups lead through both moves and end.
func TestRequestsFollowAMigrationThenARewindow(t *testing.T) {
	for _, hasKey := range []bool{true, false} {
		var now int64 = 10_000
		first := newWindowTable(8, &now)
		require.True(t, admitThrough(first, "k", hasKey, now, 2, 3))
		sized := newWindowTable(16, &now)
		sized.Migrate(first)
		last := New(Config{Kind: Window, MaxKeys: 16, Window: testBucket * Buckets / 2, Now: func() int64 { return now }}) // shorter: nothing charged
		last.Rewindow(sized, Limits{Was: 3, Now: 3}, nil, nil)

		nt, lim := first.Successor("k", hasKey, 3)
		assert.Same(t, last, nt, "hasKey %v", hasKey)
		assert.Equal(t, int64(3), lim)
		// Bounded: a lookup that never settles would loop forever.
		tbl, limit, settled, ok := first, int64(3), false, false
		for range 8 {
			st, l := tbl.Lookup("k", hasKey)
			var gone bool
			if _, _, ok, gone = tbl.Admit(st, l, now, 1, limit); !gone {
				settled = true
				break
			}
			if next, lm := tbl.Successor("k", hasKey, limit); next != nil {
				tbl, limit = next, lm
			}
		}
		require.True(t, settled, "hasKey %v: the request found a table to count in", hasKey)
		assert.True(t, ok, "hasKey %v: 2 moved + 1 of 3", hasKey)
		assert.Same(t, last, tbl)
		assert.False(t, admitThrough(last, "k", hasKey, now, 1, 3), "hasKey %v: the newest rule set sees all 3", hasKey)
	}
}

// Requests of the replaced rule set, running while a reload of another
// window moves the keys, are neither lost nor counted beside a moved key:
// no key is admitted over its limit at one instant, whichever rule set
// admitted it.
func TestRewindowUnderTrafficNeverAdmitsOverTheLimit(t *testing.T) {
	const keys, goroutines, rounds, limit = 512, 4, 20, 3
	for round := range rounds {
		var now int64 = 10_000
		old := newWindowTable(keys/2, &now) // half the keys at a time: evictions too
		windows := [2]int64{500, 250}       // shorter: nothing charged
		next := New(Config{Kind: Window, MaxKeys: keys / 2, Window: windows[round%2], Now: func() int64 { return now }})
		var admitted [keys + 1]atomic.Int64
		var inForce, started atomic.Bool // inForce: the new rule set, through next
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := 0; i < 4*keys || !inForce.Load(); i++ {
					k := (g*7919 + i*131 + round) % (keys + 1) // keys, and no key
					tbl := old
					if g%2 == 1 && inForce.Load() {
						tbl = next
					}
					if admitThrough(tbl, fmt.Sprint("k", k), k < keys, now, 1, limit) {
						admitted[k].Add(1)
					}
					if i == keys {
						started.Store(true)
					}
				}
			})
		}
		for !started.Load() {
			runtime.Gosched()
		}
		next.Rewindow(old, Limits{Was: limit, Now: limit}, nil, nil)
		inForce.Store(true)
		wg.Wait()
		for k := range admitted {
			require.LessOrEqual(t, admitted[k].Load(), int64(limit), "round %d, key %d", round, k)
		}
	}
}

// Successor waits while the keys are moving (Rewindow holds every set's
// lock until the successor holds them all): a request it sent on early
// would add its key there beside the one being moved.
func TestSuccessorWaitsUntilTheKeysMoved(t *testing.T) {
	var now int64
	old, next := newWindowTable(4, &now), newWindowTable(4, &now)
	unlock := old.lockAll() // a Rewindow under way
	old.rewound.Store(&successor{t: next, rule: 3})
	got := make(chan *Table, 1)
	go func() {
		nt, _ := old.Successor("k", true, 3)
		got <- nt
	}()
	select {
	case <-got:
		t.Fatal("Successor returned while the keys were moving")
	case <-time.After(20 * time.Millisecond):
	}
	unlock()
	assert.Same(t, next, <-got)
}
