package keytable

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newConcTable(maxKeys int) *Table {
	return New(Config{Kind: Conc, MaxKeys: maxKeys, Now: func() int64 { return 0 }})
}

func TestAcquireHoldsAtMostTheLimitInFlight(t *testing.T) {
	tbl := newConcTable(16)
	st := tbl.Get("k")
	for i := range 3 {
		_, ok, dead := st.Acquire(1, 3)
		require.True(t, ok, "request %d", i)
		require.False(t, dead)
	}
	seen, ok, _ := st.Acquire(1, 3)
	assert.False(t, ok)
	assert.Equal(t, int64(3), seen)
	_, ok, _ = st.Acquire(5, 4)
	assert.False(t, ok, "more than the limit never fits")
	tbl.Release(st, 2)
	assert.Equal(t, int64(1), st.InFlight())
	_, ok, _ = st.Acquire(2, 3)
	assert.True(t, ok)
	_, ok, _ = st.Acquire(1, 3)
	assert.False(t, ok)
}

func TestAcquireOnAnEvictedStateCountsNothing(t *testing.T) {
	tbl := newConcTable(4)
	st := tbl.Get("k")
	st.dead.Store(true)
	_, ok, dead := st.Acquire(1, 3)
	assert.False(t, ok)
	assert.True(t, dead)
	assert.Zero(t, st.InFlight())
}

// TestKeyInFlightIsNeverDropped: a Conc key evicted with requests in
// flight waits in the side table: seen again, it is the same state, and
// its last Release takes it out.
func TestKeyInFlightIsNeverDropped(t *testing.T) {
	tbl := newConcTable(4)
	a := tbl.Get("a")
	_, ok, _ := a.Acquire(2, 2)
	require.True(t, ok)
	// Keys with requests in flight too, until a goes.
	var others []*State
	for i := 0; len(tbl.Pinned()) == 0; i++ {
		require.Less(t, i, 100, "a never evicted")
		st := tbl.Get(fmt.Sprint("other", i))
		_, ok, _ := st.Acquire(1, 2)
		require.True(t, ok)
		others = append(others, st)
	}
	pinned := tbl.Pinned()
	assert.False(t, a.Dead(), "a pinned state stays alive")
	_, ok, _ = tbl.Get("a").Acquire(1, 2)
	assert.False(t, ok, "back from the side table with its 2 in flight")
	assert.Same(t, a, tbl.Get("a"))
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

func TestIdleConcKeyGoesFirstAndUnpinned(t *testing.T) {
	tbl := newConcTable(4)
	busy := make([]*State, 3)
	for i := range busy {
		busy[i] = tbl.Get(fmt.Sprint("busy", i))
		_, ok, _ := busy[i].Acquire(1, 1)
		require.True(t, ok)
	}
	idle := tbl.Get("idle")
	tbl.Get("new")
	assert.True(t, idle.Dead())
	for _, st := range busy {
		assert.False(t, st.Dead())
	}
	assert.Empty(t, tbl.Pinned())
}
