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

type admitStep struct {
	now, n int64
	want   bool
}

func runAdmitSteps(t *testing.T, tbl *Table, st *State, limit int64, steps []admitStep) {
	t.Helper()
	for i, s := range steps {
		_, _, ok, dead := tbl.Admit(st, st.Life(), s.now, s.n, limit)
		require.False(t, dead, "step %d", i)
		if ok != s.want {
			t.Fatalf("step %d: Admit(now %d, n %d) = %v want %v", i, s.now, s.n, ok, s.want)
		}
	}
}

func TestAdmitUpToLimitPerWindow(t *testing.T) {
	tbl, st := windowState()
	runAdmitSteps(t, tbl, st, 3, []admitStep{
		{0, 1, true},
		{100, 2, true},
		{200, 1, false},  // the window holds 3
		{250, 1, false},  // bucket 1: buckets 0..1 still hold 3
		{999, 1, false},  // bucket 3: the last of bucket 0's window
		{1000, 1, true},  // bucket 4: bucket 0 left the window
		{1000, 2, true},  // 3 again
		{1100, 1, false}, //
		{500, 1, false},  // behind the newest bucket: counted there, full
		{2250, 3, true},  // bucket 9: idle a whole window, empty
		{2250, 4, false}, // more than the limit never fits
	})
}

// Admit moves the head from h to b (b-h >= Buckets) and then calls
// clearOld(b). If that goroutine is descheduled between the two for more
// than a window (cheap with StatInterval 1ms), others move the head on and
// count in newer buckets; its late clearOld(b) leaves their words alone.
// Here the delayed tail is played by calling clearOld as the late goroutine
// would.
func TestAdmitLateClearOldKeepsNewerCounts(t *testing.T) {
	tbl, st := windowState()
	const limit = 4
	// The key counted long ago at bucket 0.
	_, _, ok, _ := tbl.Admit(st, st.Life(), 0, 1, limit)
	require.True(t, ok)
	// Goroutine A (now in bucket 10) CASes the head 0 -> 10, and is
	// descheduled before clearOld(10). Simulate the CAS:
	const b = 10
	require.True(t, st.head.CompareAndSwap(0, b))
	// Meanwhile others count on, up to bucket b+5, filling its window.
	now := int64(b+5) * testBucket
	for range limit {
		_, _, ok, _ := tbl.Admit(st, st.Life(), now, 1, limit)
		require.True(t, ok)
	}
	_, _, ok, _ = tbl.Admit(st, st.Life(), now, 1, limit)
	require.False(t, ok, "window full")
	// A resumes.
	st.clearOld(b, st.Life().tag())
	got := 0
	for range limit {
		if _, _, ok, _ := tbl.Admit(st, st.Life(), now, 1, limit); ok {
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
			got, seen, ok, dead := tbl.Admit(st, st.Life(), now, n, limit)
			require.False(t, dead)
			require.Equal(t, want, ok, "seed %d at %d: window held %d, limit %d, n %d", seed, now, sum, limit, n)
			if ok {
				require.Equal(t, b, got, "seed %d at %d: the bucket counted in", seed, now)
				counts[b] += n
				sum += n
			} else if n <= limit {
				require.Equal(t, sum, seen, "seed %d at %d: the count a refusal saw", seed, now)
			}
			require.Equal(t, uint64(sum), st.sum(newest), "seed %d at %d: the window's sum", seed, now)
		}
	}
}

func TestUndoGivesBackToItsBucket(t *testing.T) {
	tbl, st := windowState()
	const limit = 3
	b, _, ok, _ := tbl.Admit(st, st.Life(), 0, 3, limit)
	require.True(t, ok)
	runAdmitSteps(t, tbl, st, limit, []admitStep{{10, 1, false}})
	st.Undo(b, st.Life(), 2)
	runAdmitSteps(t, tbl, st, limit, []admitStep{{20, 2, true}, {30, 1, false}})
}

// TestUndoOfABucketPastTheWindowChangesNothing: a bucket's word reused by
// a later bucket (Buckets later) is not the undo's to change.
func TestUndoOfABucketPastTheWindowChangesNothing(t *testing.T) {
	tbl, st := windowState()
	const limit = 3
	old, _, ok, _ := tbl.Admit(st, st.Life(), 0, 1, limit)
	require.True(t, ok)
	b, _, ok, _ := tbl.Admit(st, st.Life(), Buckets*testBucket, 3, limit)
	require.True(t, ok)
	require.Equal(t, slotOf(old), slotOf(b), "the same word")
	st.Undo(old, st.Life(), 1)
	runAdmitSteps(t, tbl, st, limit, []admitStep{{Buckets * testBucket, 1, false}})
	assert.Equal(t, uint64(3), st.sum(b))
}

func TestRoomInSaysWhenTheOldestBucketsLeave(t *testing.T) {
	tbl, st := windowState()
	const limit = 4
	retry, reset := tbl.RoomIn(st, 600, 1, limit)
	assert.Equal(t, [2]int64{0, 0}, [2]int64{retry, reset}, "a window that never counted")
	// 1 in bucket 0, 1 in bucket 1, 2 in bucket 2: full.
	runAdmitSteps(t, tbl, st, limit, []admitStep{{0, 1, true}, {250, 1, true}, {500, 2, true}})
	for _, c := range []struct{ now, n, retry, reset int64 }{
		{600, 1, 400, 900},  // bucket 0 leaves at 1000
		{600, 2, 650, 900},  // bucket 1 at 1250
		{600, 3, 900, 900},  // bucket 2 at 1500, when the window empties
		{600, 4, 900, 900},  //
		{600, 5, -1, -1},    // over the limit: never
		{1000, 1, 0, 1000},  // room now: bucket 0 left; reset from bucket 4, now's
		{1300, 3, 200, 950}, // at 1300, only bucket 2's 2 remain
		{9000, 4, 0, 1000},  // long after: room, and now's bucket's window
	} {
		retry, reset := tbl.RoomIn(st, c.now, c.n, limit)
		assert.Equal(t, [2]int64{c.retry, c.reset}, [2]int64{retry, reset}, "RoomIn(now %d, n %d)", c.now, c.n)
	}
	// What RoomIn says is what Admit does.
	runAdmitSteps(t, tbl, st, limit, []admitStep{{1249, 2, false}, {1250, 2, true}})
}

func TestAdmitOnAnEvictedStateCountsNothing(t *testing.T) {
	tbl, st := windowState()
	l := st.Life()
	st.kill()
	_, _, ok, dead := tbl.Admit(st, l, 0, 1, 3)
	assert.False(t, ok)
	assert.True(t, dead)
	assert.Zero(t, st.sum(0), "the count was taken back")
}

func TestWindowWordsKeepEpochLifeAndCount(t *testing.T) {
	for _, b := range []int64{0, 1, 5, -3, 1<<24 - 1, 1 << 24, 1<<40 + 7} {
		tag, other := Life(0xa7<<1).tag(), Life(0xa6<<1).tag()
		w := packBucket(b, tag, 12345)
		assert.True(t, epochIs(w, b), "bucket %d", b)
		assert.True(t, ours(w, b, tag), "bucket %d", b)
		assert.False(t, ours(w, b, other), "bucket %d in another life", b)
		assert.Equal(t, Life(0xa7<<1).tag(), Life(0xa7<<1+256<<1+1).tag(), "8 bits of the generation")
		assert.False(t, epochIs(w, b+1), "bucket %d", b)
		assert.Equal(t, uint64(12345), w&countMask)
		assert.True(t, newer(w, b-1), "bucket %d is newer than %d", b, b-1)
		assert.False(t, newer(w, b), "bucket %d", b)
		assert.False(t, newer(w, b+1), "bucket %d", b)
		assert.Equal(t, int(((b%Buckets)+Buckets)%Buckets), slotOf(b), "bucket %d", b)
	}
}
