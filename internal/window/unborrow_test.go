package window

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnborrowBeforeItsBucket: a borrow given back before its bucket is
// made leaves nothing behind; the room is anyone's again.
func TestUnborrowBeforeItsBucket(t *testing.T) {
	w := newWindow(t, 2, time.Second)
	require.True(t, w.Reserve(100*ms, 10, 10))
	s, wait, ok := w.BorrowAt(100*ms, 3, 10, time.Second)
	require.True(t, ok)
	assert.Equal(t, int64(time.Second), s)
	assert.Equal(t, time.Duration(900*ms), wait)
	assert.Equal(t, int64(3), w.Borrowed())
	w.Unborrow(s, 3)
	assert.Zero(t, w.Borrowed())
	assert.True(t, w.Reserve(int64(time.Second), 10, 10), "the bucket the borrow would have used is whole")
}

// TestUnborrowAfterItsBucket: given back after its bucket started (folded
// into it), the pass and the occupied pass come out of that bucket, and
// the room with them.
func TestUnborrowAfterItsBucket(t *testing.T) {
	for _, late := range []bool{false, true} {
		w := newWindow(t, 2, time.Second)
		require.True(t, w.Reserve(100*ms, 10, 10))
		s, _, ok := w.BorrowAt(100*ms, 3, 10, time.Second)
		require.True(t, ok)
		at := s
		if late {
			// No request made the borrowed bucket: it folds into the next
			// one made.
			at = s + int64(500*ms)
		}
		require.True(t, w.Reserve(at, 1, 10))
		assert.Equal(t, int64(4), w.Sum(at, Pass))
		w.Unborrow(s, 3)
		assert.Equal(t, int64(1), w.Sum(at, Pass), "late=%v", late)
		assert.Zero(t, w.Sum(at, OccupiedPass), "late=%v", late)
		assert.True(t, w.Reserve(at, 9, 10), "late=%v: the whole room is back", late)
		assert.False(t, w.Reserve(at, 1, 10))
	}
}

// TestAdmitAtCountsInTheArrivalBucket: an arrival within the current
// bucket is admitted there; a later one borrows exactly its own bucket,
// or is refused if that bucket has no room, even when an earlier one has.
func TestAdmitAtCountsInTheArrivalBucket(t *testing.T) {
	w := newWindow(t, 4, time.Second)
	_, _, later, ok := w.AdmitAt(0, 100*ms, 200*ms, 1, 10)
	require.True(t, ok)
	assert.False(t, later)
	assert.Equal(t, int64(1), w.Sum(100*ms, Pass))
	_, s, later, ok := w.AdmitAt(0, 100*ms, 600*ms, 2, 10)
	require.True(t, ok)
	assert.True(t, later)
	assert.Equal(t, int64(500*ms), s)
	assert.Equal(t, int64(2), w.Borrowed())
	w.Land(600 * ms)
	assert.Zero(t, w.Borrowed(), "landing made the bucket and folded the borrow")
	assert.Equal(t, int64(2), w.Sum(600*ms, OccupiedPass))
	// An arrival at 1.1 s counts in the bucket of 1.0 s, whose windows
	// hold the 2 borrowed at 500 ms: 8 fit, not 9.
	_, _, _, ok = w.AdmitAt(0, 600*ms, 1100*ms, 9, 10)
	assert.False(t, ok)
	_, s, later, ok = w.AdmitAt(0, 600*ms, 1100*ms, 8, 10)
	require.True(t, ok)
	assert.True(t, later)
	assert.Equal(t, int64(time.Second), s)
}

// A borrow of the bucket at 1 s that no request made is folded late, into
// the bucket at 1.5 s. While the first borrower has not settled (Unborrow
// or Arrived), its record is kept and a waiter for the bucket at 2 s cannot
// reuse it; the first's give-back then finds it, and the bucket is anyone's
// again.
func TestUnborrowAfterLateFoldAndSlotReuse(t *testing.T) {
	w := newWindow(t, 4, time.Second)
	require.True(t, w.Reserve(100*ms, 10, 10))
	s, _, ok := w.BorrowAt(100*ms, 1, 10, time.Second)
	require.True(t, ok)
	require.Equal(t, int64(time.Second), s)
	// No request at 1 s; the first one is at 1.6 s: the borrow folds there.
	require.True(t, w.Reserve(1600*ms, 1, 10))
	require.Equal(t, int64(2), w.Sum(1600*ms, Pass))
	_, _, _, ok = w.AdmitAt(0, 1600*ms, 2100*ms, 1, 10)
	assert.False(t, ok, "the record is the first borrower's until it settles")
	w.Unborrow(s, 1)
	assert.Equal(t, int64(1), w.Sum(1600*ms, Pass), "the cancelled waiter's pass came out of the bucket at 1.5 s")
	_, s2, later, ok := w.AdmitAt(0, 1600*ms, 2100*ms, 1, 10)
	require.True(t, ok)
	assert.True(t, later)
	assert.Equal(t, int64(2*time.Second), s2)
	w.Arrived(s2, 1)
}
