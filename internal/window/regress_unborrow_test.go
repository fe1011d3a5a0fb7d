package window

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnborrowAfterLateFoldAndSlotReuse (found by an adversarial run): a
// borrow of the bucket at 1 s that no request made is folded late, into
// the bucket at 1.5 s. A waiter for the bucket at 2 s would reuse the same
// record, losing where the first was folded: while the first borrower has
// not settled (Unborrow or Arrived), the record is kept and the second
// cannot borrow that bucket. The first's give-back then finds it, and the
// bucket is anyone's again.
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
