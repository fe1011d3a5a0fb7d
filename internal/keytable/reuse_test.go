package keytable

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/pace"
)

// reuseFor floods tbl with keys counting one each at now (if count) until
// st, found in life l, is reused for another key, and returns that key
// (the state of the others is not st).
func reuseFor(t *testing.T, tbl *Table, st *State, l Life, now int64, count bool) string {
	t.Helper()
	for i := range 100 * tbl.Capacity() {
		k := fmt.Sprint("flood-", i)
		got, gl := tbl.Get(k)
		if count && tbl.Kind() == Window {
			tbl.Admit(got, gl, now, 1, 1<<20)
		}
		if got == st {
			require.False(t, st.Alive(l), "reused in a new life")
			return k
		}
	}
	t.Fatal("never reused")
	return ""
}

// TestAnEvictedStateIsReusedInANewLife: a new key through a full table
// takes the victim's state itself, in a new life; the victim, seen again,
// finds its own counts, and a lookup never returns the state to its old
// key.
func TestAnEvictedStateIsReusedInANewLife(t *testing.T) {
	var now int64
	tbl := newWindowTable(4, &now) // one set: every key competes
	const limit = 3
	st, l := tbl.Get("a")
	_, _, ok, _ := tbl.Admit(st, l, now, 2, limit)
	require.True(t, ok)
	other := reuseFor(t, tbl, st, l, now, false)
	assert.Equal(t, l+2, st.Life(), "the next life")
	got, gl := tbl.Get(other)
	require.Same(t, st, got)
	assert.Equal(t, st.Life(), gl)
	assert.Zero(t, st.sum(st.head.Load()), "the new key starts from nothing")
	back, bl := tbl.Get("a")
	_, _, ok, _ = tbl.Admit(back, bl, now, 2, limit)
	assert.False(t, ok, "a's 2 came back with it")
	_, _, ok, _ = tbl.Admit(back, bl, now, 1, limit)
	assert.True(t, ok)
}

// TestARequestOfAnEarlierLifeCountsNothingInTheNext: a request that found
// its key's state before the state was reused for another key counts
// nothing there: Admit and Acquire say gone, and the new key's window is
// as its own requests left it.
func TestARequestOfAnEarlierLifeCountsNothingInTheNext(t *testing.T) {
	t.Run("window", func(t *testing.T) {
		var now int64
		tbl := newWindowTable(4, &now)
		const limit = 3
		st, l := tbl.Get("a")
		other := reuseFor(t, tbl, st, l, now, false)
		_, ol := tbl.Get(other)
		_, _, ok, _ := tbl.Admit(st, ol, now, 1, limit)
		require.True(t, ok)
		for _, at := range []int64{now, now + testBucket, now + Buckets*testBucket} {
			_, _, ok, gone := tbl.Admit(st, l, at, 1, limit)
			assert.False(t, ok, "at %d", at)
			assert.True(t, gone, "at %d", at)
		}
		assert.Equal(t, uint64(1), st.sum(st.head.Load()), "the new key holds its own 1 only")
		_, _, ok, _ = tbl.Admit(st, ol, now+Buckets*testBucket-1, 3, limit)
		assert.False(t, ok, "its 1 is still in its window")
	})
	t.Run("conc", func(t *testing.T) {
		tbl := newConcTable(4)
		st, l := tbl.Get("a")
		reuseFor(t, tbl, st, l, 0, false)
		_, ok, gone := tbl.Acquire(st, l, 1, 5)
		assert.False(t, ok)
		assert.True(t, gone)
		assert.Zero(t, st.InFlight(), "taken back")
	})
}

// TestUndoOfAnEarlierLifeLeavesTheNextAlone: a request admitted in a
// state's earlier life that gives back after the state went to another key
// (a later rule refused it, or its reservation was cancelled) gives back
// nothing: the count it took left with its key. Subtracted from the new
// key's bucket, it would let that key past its limit.
func TestUndoOfAnEarlierLifeLeavesTheNextAlone(t *testing.T) {
	var now int64
	tbl := newWindowTable(4, &now)
	const limit = 3
	st, l := tbl.Get("a")
	b, _, ok, _ := tbl.Admit(st, l, now, 1, limit)
	require.True(t, ok)
	other := reuseFor(t, tbl, st, l, now, true)
	ost, ol := tbl.Get(other)
	require.Same(t, st, ost)
	for {
		if _, _, ok, _ := tbl.Admit(st, ol, now, 1, limit); !ok {
			break
		}
	}
	require.Equal(t, uint64(limit), st.sum(st.head.Load()), "the new key is full in a's bucket")
	st.Undo(b, l, 1)
	_, _, ok, _ = tbl.Admit(st, ol, now, 1, limit)
	assert.False(t, ok, "still full: a's undo took nothing from it")
}

// TestLateWordsOfAnEarlierLifeReadAsEmpty: words an earlier life's late
// request wrote into a reused state (as it found an old bucket, or
// cleared old ones) count nothing for the new key, and are written over.
func TestLateWordsOfAnEarlierLifeReadAsEmpty(t *testing.T) {
	var now int64
	tbl := newWindowTable(4, &now)
	const limit = 3
	st, l := tbl.Get("a")
	reuseFor(t, tbl, st, l, now, false)
	nl := st.Life()
	b := st.head.Load()
	// The late request's words: bucket b+1 with a count, b+2 cleared.
	st.words[slotOf(b+1)].Store(packBucket(b+1, l.tag(), 2))
	st.clearOld(b+Buckets, l.tag())
	for _, at := range []int64{b + 1, b + 2} {
		got, _, ok, gone := tbl.Admit(st, nl, at*testBucket, limit, limit)
		require.False(t, gone)
		assert.True(t, ok, "bucket %d: the earlier life's words count nothing", at)
		assert.Equal(t, at, got)
		st.Undo(got, nl, limit)
	}
	held, _ := tbl.Held(st, (b+2)*testBucket)
	assert.Zero(t, held)
}

// TestANewKeyThroughAFullTableAllocatesNothing: a new key through a full
// table, evicting another on every request, allocates nothing: it takes
// the victim's state (the sets' and the memory's locks are values, not
// closures), for every kind.
func TestANewKeyThroughAFullTableAllocatesNothing(t *testing.T) {
	keys := make([]string, 64*1024)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", 1_000_000+i)
	}
	var now int64
	for name, tbl := range map[string]*Table{
		"window": newWindowTable(1024, &now),
		"pace":   New(Config{Kind: Pace, MaxKeys: 1024, Now: func() int64 { return now }}),
		"conc":   newConcTable(1024),
	} {
		i := 0
		next := func() {
			now += 10
			st, l := tbl.Get(keys[i%len(keys)])
			switch tbl.Kind() {
			case Window:
				tbl.Admit(st, l, now, 1, 1<<20)
			case Pace:
				st.Timeline().Store(now)
			}
			i++
		}
		for range 8192 { // full, and evicting: the memory of evicted keys made
			next()
		}
		assert.Zero(t, testing.AllocsPerRun(2000, next), name)
	}
}

// TestAStaleRequestCountsNothing256LivesOn: a window word carries 8 bits
// of its life, so a state reused 256 times has words of the tag a request
// of its first life holds; that request still counts nothing in them.
func TestAStaleRequestCountsNothing256LivesOn(t *testing.T) {
	now := int64(10 * testBucket)
	tbl := newWindowTable(4, &now)
	st, l := tbl.Get("a")
	for i := 0; st.Life()>>1 != l>>1+256; i++ {
		require.Less(t, i, 1<<16, "never reused 256 times")
		tbl.Get(fmt.Sprint("k", i))
	}
	nl := st.Life()
	require.Equal(t, l.tag(), nl.tag(), "the same tag")
	_, _, ok, gone := tbl.Admit(st, l, now, 1, 5)
	assert.False(t, ok)
	assert.True(t, gone)
	held, _ := tbl.Held(st, now)
	assert.Zero(t, held, "nothing counted in the 256th life")
	_, _, ok, _ = tbl.Admit(st, nl, now, 1, 1)
	assert.True(t, ok, "its key has its whole limit")
}

// TestALateAcquireGivingBackUnpinsTheState: a request of a Conc state's
// earlier life whose count landed after the state went to another key,
// and then that key was evicted with it in flight (pinned), gives it back
// through Release: the state leaves the side table with nothing in
// flight, not kept there until its key returns.
func TestALateAcquireGivingBackUnpinsTheState(t *testing.T) {
	tbl := newConcTable(4)
	st, l := tbl.Get("a")
	reuseFor(t, tbl, st, l, 0, false)
	st.head.Add(1) // the late request's count, as Acquire's CAS makes it
	// The new key evicted now, with that 1 in flight: pinned.
	a, b := tbl.setsOf(st.idh.Load())
	unlock := tbl.lock(a, b)
	require.False(t, tbl.evict(st, 0), "pinned, not for reuse")
	require.NotNil(t, tbl.removeLocked(st.id(), a, b))
	unlock.unlock()
	require.Contains(t, tbl.Pinned(), st, "evicted with 1 in flight")
	require.False(t, st.Alive(l))
	tbl.Release(st, 1) // what Acquire does on finding its life gone
	assert.Empty(t, tbl.Pinned(), "nothing in flight: nothing pinned")
}

// TestAReuseWaitsForAGiveBackInProgress: a Throttle key's give-back
// checks its life and moves the timeline back under the state's guard; a
// reuse of the state waits for the guard before it writes the next key's
// timeline, so the give-back moves its own life's timeline, never the
// next key's (which may end at the same instant).
func TestAReuseWaitsForAGiveBackInProgress(t *testing.T) {
	const second = int64(1e9)
	now := 3600 * second
	tbl := New(Config{Kind: Pace, MaxKeys: 4, Now: func() int64 { return now }}) // one set
	// Three keys queued ahead: k1 goes first.
	for i := range 3 {
		st, _ := tbl.Get(fmt.Sprint("x", i))
		st.Timeline().Store(now + 2*second)
	}
	k1, l1 := tbl.Get("k1")
	held, _, ok := pace.Reserve(k1.Timeline(), 0, now, 1, 1)
	require.True(t, ok)
	k1.words[0].Store(1) // a give-back past its life check, before its swap
	reused := make(chan *State)
	go func() {
		st, _ := tbl.Get("k2")
		reused <- st
	}()
	select {
	case <-reused:
		t.Fatal("reused while a give-back of the earlier life was in progress")
	case <-time.After(20 * time.Millisecond):
	}
	pace.GiveBack(k1.Timeline(), held) // the give-back's swap, in its own life
	k1.words[0].Store(0)
	k2 := <-reused
	require.Same(t, k1, k2)
	require.False(t, k2.Alive(l1))
	_, _, ok = pace.Reserve(k2.Timeline(), 0, now, 1, 1)
	require.True(t, ok, "k2's first slot")
	k1.GiveBack(l1, held) // late: k2's timeline ends where k1's slot did
	_, _, ok = pace.Reserve(k2.Timeline(), 0, now, 1, 1)
	assert.False(t, ok, "k2 gets one slot per second")
}
