package metric

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUnborrowAfterLateFoldAndSlotReuse (found by an adversarial run): a
// borrow of the bucket at 1 s that no request made is folded late, into
// the bucket at 1.5 s. Before the waiter gives it back, another waiter
// borrows the bucket at 2 s, which reuses the same record slot. The
// give-back, 600 ms after its bucket started, then finds no record and
// leaves the pass in the bucket at 1.5 s until it leaves the window: as
// documented on Unborrow, stricter for a window, never looser.
func TestUnborrowAfterLateFoldAndSlotReuse(t *testing.T) {
	w := newWindow(t, 4, time.Second)
	require.True(t, w.Reserve(100*ms, 10, 10))
	s, _, ok := w.BorrowAt(100*ms, 1, 10, time.Second)
	require.True(t, ok)
	require.Equal(t, int64(time.Second), s)
	// No request at 1 s; the first one is at 1.6 s: the borrow folds there.
	require.True(t, w.Reserve(1600*ms, 1, 10))
	require.Equal(t, int64(2), w.Sum(1600*ms, Pass))
	// Another waiter arriving at 2.1 s borrows exactly the bucket at 2 s.
	_, s2, later, ok := w.AdmitAt(0, 1600*ms, 2100*ms, 1, 10)
	require.True(t, ok)
	require.True(t, later)
	require.Equal(t, int64(2*time.Second), s2)
	// The first waiter's context ends: it gives its pass back.
	w.Unborrow(s, 1)
	assert.Equal(t, int64(2), w.Sum(1600*ms, Pass), "the cancelled waiter's pass stays in the bucket at 1.5 s")
	assert.False(t, w.Reserve(1600*ms, 8, 10), "room: 10 - 2 passed - 1 borrowed at 2 s")
	assert.True(t, w.Reserve(1600*ms, 7, 10))
	assert.True(t, w.Reserve(2600*ms, 8, 10), "once the bucket at 1.5 s has left, the room is back")
}
