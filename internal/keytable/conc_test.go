package keytable

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

func newConcTable(maxKeys int) *Table {
	return New(Config{Kind: Conc, MaxKeys: maxKeys, Now: func() int64 { return 0 }})
}

func TestAcquireHoldsAtMostTheLimitInFlight(t *testing.T) {
	tbl := newConcTable(16)
	st, stL := tbl.Get("k")
	for i := range 3 {
		_, ok, dead := tbl.Acquire(st, stL, 1, 3)
		require.True(t, ok, "request %d", i)
		require.False(t, dead)
	}
	seen, ok, _ := tbl.Acquire(st, stL, 1, 3)
	assert.False(t, ok)
	assert.Equal(t, int64(3), seen)
	_, ok, _ = tbl.Acquire(st, stL, 5, 4)
	assert.False(t, ok, "more than the limit never fits")
	tbl.Release(st, 2)
	assert.Equal(t, int64(1), st.InFlight())
	_, ok, _ = tbl.Acquire(st, stL, 2, 3)
	assert.True(t, ok)
	_, ok, _ = tbl.Acquire(st, stL, 1, 3)
	assert.False(t, ok)
}

func TestAcquireOnAnEvictedStateCountsNothing(t *testing.T) {
	tbl := newConcTable(4)
	st, stL := tbl.Get("k")
	st.kill()
	_, ok, dead := tbl.Acquire(st, stL, 1, 3)
	assert.False(t, ok)
	assert.True(t, dead)
	assert.Zero(t, st.InFlight())
}

// TestKeyInFlightIsNeverDropped: a Conc key evicted with requests in
// flight waits in the side table: seen again, it is the same state, and
// its last Release takes it out.
func TestKeyInFlightIsNeverDropped(t *testing.T) {
	tbl := newConcTable(4)
	a, aL := tbl.Get("a")
	_, ok, _ := tbl.Acquire(a, aL, 2, 2)
	require.True(t, ok)
	// Keys with requests in flight too, until a goes.
	var others []*State
	for i := 0; len(tbl.Pinned()) == 0; i++ {
		require.Less(t, i, 100, "a never evicted")
		st, stL := tbl.Get(fmt.Sprint("other", i))
		_, ok, _ := tbl.Acquire(st, stL, 1, 2)
		require.True(t, ok)
		others = append(others, st)
	}
	pinned := tbl.Pinned()
	assert.True(t, a.Alive(aL), "a pinned state stays alive")
	back, backL := tbl.Get("a")
	assert.Equal(t, aL, backL, "in the life it was pinned in")
	_, ok, _ = tbl.Acquire(back, backL, 1, 2)
	assert.False(t, ok, "back from the side table with its 2 in flight")
	assert.Same(t, a, back)
	assert.NotContains(t, tbl.Pinned(), a, "seen again, it is back in the sets")
	// The other pinned states go with their last release.
	for _, st := range others {
		tbl.Release(st, 1)
	}
	tbl.Release(a, 2)
	assert.Empty(t, tbl.Pinned())
	for _, st := range pinned {
		assert.Zero(t, st.InFlight())
	}
}

// A Conc key evicted with requests in flight and then listed in the
// rule's Keys (Specific, at a reload) keeps what it has in flight: its
// listed state is the evicted one, out of the side table.
func TestListingAnEvictedKeyKeepsItsRequestsInFlight(t *testing.T) {
	tbl := newConcTable(4)
	held := map[string]*State{}
	for i := 0; len(tbl.Pinned()) == 0; i++ {
		require.Less(t, i, 100, "no key ever evicted")
		k := fmt.Sprint("k", i)
		st, stL := tbl.Get(k)
		_, ok, _ := tbl.Acquire(st, stL, 1, 3)
		require.True(t, ok)
		held[k] = st
	}
	for k, st := range held {
		listed, _ := tbl.Specific(k)
		assert.Same(t, st, listed, "%s: the listed state is the one holding its request", k)
		assert.EqualValues(t, 1, listed.InFlight(), k)
	}
	assert.Empty(t, tbl.Pinned(), "every pinned state went to its listing")
}

func TestIdleConcKeyGoesFirstAndUnpinned(t *testing.T) {
	tbl := newConcTable(4)
	busy := make([]*State, 3)
	for i := range busy {
		var l Life
		busy[i], l = tbl.Get(fmt.Sprint("busy", i))
		_, ok, _ := tbl.Acquire(busy[i], l, 1, 1)
		require.True(t, ok)
	}
	idle, idleL := tbl.Get("idle")
	tbl.Get("new")
	assert.False(t, idle.Alive(idleL), "the idle key went")
	for _, st := range busy {
		assert.True(t, st.Alive(st.Life()&^dead), "a busy key stays")
	}
	assert.Empty(t, tbl.Pinned())
}

// Tables of a Conc rule moving one into the next (reloads of MaxKeys, as
// fast as they go) while a request goroutine looks up and acquires more
// keys than either holds, never releasing: a key evicted with requests in
// flight is found in the side table it moved to, even by a lookup in a
// table that began to move after the lookup read its next, so no key is
// ever admitted over its limit.
func TestMigratingTablesKeepEveryKeyInFlight(t *testing.T) {
	var latest atomic.Pointer[Table]
	latest.Store(newConcTable(64))
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			default:
			}
			nt := newConcTable([]int{128, 64}[n%2])
			nt.Migrate(latest.Load())
			latest.Store(nt)
			time.Sleep(50 * time.Microsecond)
		}
	}()
	held := map[int]int{}
	for step := 0; step < 200; step++ {
		for k := 0; k < 300; k++ {
			for spins := 0; ; spins++ {
				if spins > 1_000_000 {
					t.Fatalf("key %d: a lookup spins on dead states", k)
				}
				cur := latest.Load()
				st, stL := cur.Get(fmt.Sprint("k", k))
				_, ok, dead := cur.Acquire(st, stL, 1, 2)
				if dead {
					continue
				}
				if ok {
					held[k]++
					if held[k] > 2 {
						t.Errorf("key %d: %d in flight (its state says %d)", k, held[k], st.InFlight())
					}
				}
				break
			}
		}
	}
	close(stop)
	<-done
}
