package keytable

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The window tests use buckets of 250 (a window of 1000): times are plain
// numbers, not durations.
const testBucket = 250

// newWindowTable is a Window table of maxKeys on the clock *now.
func newWindowTable(maxKeys int, now *int64) *Table {
	return New(Config{Kind: Window, MaxKeys: maxKeys, Window: testBucket * Buckets, Now: func() int64 { return *now }})
}

// windowState is a fresh Window state outside any table's sets.
func windowState() (*Table, *State) {
	var now int64
	tbl := newWindowTable(4, &now)
	return tbl, tbl.newState(ID{})
}

// TestAdmitLateClearOldKeepsNewerCounts (a bug an adversarial pass found,
// fixed; the test keeps it fixed; it was flow's
// TestKeyedClearOldDelayedErasesNewerBucket): Admit moves the head from h
// to b (b-h >= Buckets) and then calls clearOld(b). If that goroutine is
// descheduled between the two for more than a window (cheap with
// StatInterval 1ms), others move the head on and count in newer buckets;
// its late clearOld(b) then overwrites a live bucket b+5 word (epoch e+8
// is neither e nor e+Buckets), erasing counts in the current window. Here
// the delayed tail is played by calling clearOld as the late goroutine
// would.
func TestAdmitLateClearOldKeepsNewerCounts(t *testing.T) {
	tbl, st := windowState()
	const limit = 4
	// The key counted long ago at bucket 0.
	_, _, ok, _ := tbl.Admit(st, 0, 1, limit)
	require.True(t, ok)
	// Goroutine A (now in bucket 10) CASes the head 0 -> 10, and is
	// descheduled before clearOld(10). Simulate the CAS:
	const b = 10
	require.True(t, st.head.CompareAndSwap(0, b))
	// Meanwhile others count on, up to bucket b+5, filling its window.
	now := int64(b+5) * testBucket
	for range limit {
		_, _, ok, _ := tbl.Admit(st, now, 1, limit)
		require.True(t, ok)
	}
	_, _, ok, _ = tbl.Admit(st, now, 1, limit)
	require.False(t, ok, "window full")
	// A resumes.
	st.clearOld(b)
	got := 0
	for range limit {
		if _, _, ok, _ := tbl.Admit(st, now, 1, limit); ok {
			got++
		}
	}
	assert.Zero(t, got, "admitted past a full window after a late clearOld")
}

// TestAdmitMatchesBucketOracle (it was flow's TestPerKeyWindowOracle)
// drives one key's window single-threaded with random times (steps back
// included) and batches, against a brute-force model of the same bucketed
// window.
func TestAdmitMatchesBucketOracle(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		tbl, st := windowState()
		limit := int64(1 + rng.IntN(20))
		counts := map[int64]int64{} // bucket -> admitted
		newest := int64(-1)
		now := int64(rng.IntN(5000))
		for range 2000 {
			now += int64(rng.IntN(300)) - 60
			now = max(now, 0)
			n := int64(1 + rng.IntN(4))
			if n <= limit {
				newest = max(newest, now/testBucket) // a refusal moves the window too
			}
			b := newest
			var sum int64
			for j := range int64(Buckets) {
				sum += counts[b-j]
			}
			want := sum+n <= limit
			_, _, ok, dead := tbl.Admit(st, now, n, limit)
			require.False(t, dead)
			require.Equal(t, want, ok, "seed %d at %d: window held %d, limit %d, n %d", seed, now, sum, limit, n)
			if ok {
				counts[b] += n
			}
		}
	}
}
