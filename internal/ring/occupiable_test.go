package ring

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

type passes struct{ pass, occupied atomic.Int64 }

// lapses records what newOccupiable's arrays let lapse, by bucket start.
type lapses map[int64]int64

func newOccupiable(t *testing.T, n int, interval time.Duration) *Occupiable[passes] {
	o, _ := newLapsing(t, n, interval)
	return o
}

// newLapsing is newOccupiable that also returns what lapsed (read it only
// after the rotations, from the goroutine that made them).
func newLapsing(t *testing.T, n int, interval time.Duration) (*Occupiable[passes], lapses) {
	t.Helper()
	o, lapsed := &Occupiable[passes]{}, lapses{}
	err := o.Init(n, interval, Hooks[passes]{},
		func(v *passes) int64 { return v.pass.Load() },
		func(v *passes, n int64) { v.pass.Add(n); v.occupied.Add(n) },
		func(start, n int64) { lapsed[start] += n })
	require.NoError(t, err)
	return o, lapsed
}

func TestNewOccupiableRejectsBadShape(t *testing.T) {
	err := new(Occupiable[passes]).Init(0, time.Second, Hooks[passes]{}, nil, nil, nil)
	assert.ErrorContains(t, err, "sampleCount must be > 0, got 0")
}

func TestBorrowFoldsIntoTheNextBucket(t *testing.T) {
	o := newOccupiable(t, 2, time.Second) // 500ms buckets, threshold 10
	bl := o.BucketLen()
	now := bl + bl/5 // 600ms
	o.Current(now).Value.pass.Add(4)
	// Window at 1000ms holds the 500ms bucket (4); 6 more fit there.
	wait, ok := o.Borrow(now, 6, 10, int64(time.Second))
	require.True(t, ok)
	assert.Equal(t, 2*bl-now, wait)
	assert.Equal(t, int64(6), o.Pending())
	assert.Equal(t, int64(6), o.pendingAt(2*bl))
	_, ok = o.Borrow(now, 1, 10, int64(time.Second))
	assert.True(t, ok, "one more fits in the bucket after (the 500ms bucket leaves its window)")
	_, ok = o.Borrow(now, 5, 10, int64(time.Second))
	assert.False(t, ok, "no window may exceed the threshold")

	w := o.Current(2 * bl)
	assert.Equal(t, int64(6), w.Value.pass.Load(), "folded as pass")
	assert.Equal(t, int64(6), w.Value.occupied.Load(), "and as occupied pass")
	assert.Equal(t, int64(1), o.Pending(), "the later borrow is still pending")
	assert.Zero(t, o.pendingAt(2*bl))
}

func TestBorrowRespectsMaxWaitAndThreshold(t *testing.T) {
	o := newOccupiable(t, 4, time.Second) // 250ms buckets
	bl := o.BucketLen()
	now := bl / 2
	_, ok := o.Borrow(now, 1, 10, bl/4)
	assert.False(t, ok, "the next bucket starts after maxWait")
	_, ok = o.Borrow(now, 11, 10, int64(time.Second))
	assert.False(t, ok, "a batch above the threshold never fits")
	_, ok = o.Borrow(now, 0, 10, int64(time.Second))
	assert.False(t, ok)
	assert.Zero(t, o.Pending(), "refused borrows leave nothing behind")
	o.Current(now).Value.pass.Add(10)
	_, ok = o.Borrow(now, 1, 10, bl)
	assert.False(t, ok, "the current bucket stays in the next bucket's window")
	wait, ok := o.Borrow(now, 1, 10, int64(time.Second))
	require.True(t, ok, "the first bucket whose window drops the full one")
	assert.Equal(t, 4*bl-now, wait)
}

func TestLateBorrowFoldsIntoNextBucketMadeWithinItsWindow(t *testing.T) {
	o, lapsed := newLapsing(t, 2, time.Second)
	bl := o.BucketLen()
	_, ok := o.Borrow(0, 3, 10, bl)
	require.True(t, ok)
	// No traffic at bl; the next bucket made is the one after, which
	// shares a window with it.
	w := o.Current(2*bl + 1)
	assert.Equal(t, int64(3), w.Value.pass.Load())
	assert.Zero(t, o.Pending())
	assert.Empty(t, lapsed)
}

func TestBorrowLapsesWhenNoWindowHoldsItAndTheNextBucket(t *testing.T) {
	o, lapsed := newLapsing(t, 2, time.Second)
	bl := o.BucketLen()
	s, _, ok := o.BorrowAt(0, 3, 10, bl)
	require.True(t, ok)
	require.Equal(t, bl, s)
	// No traffic at bl; the next bucket made is a whole interval later:
	// no window holds both, so the borrow is charged to none.
	w := o.Current(3*bl + 1)
	assert.Zero(t, w.Value.pass.Load(), "a window later is not charged")
	assert.Equal(t, lapses{bl: 3}, lapsed, "handed to lapse at its own start")
	assert.Zero(t, o.Pending())
	into, folded, ok := o.Unborrow(s, 3)
	assert.True(t, ok && folded, "a lapsed borrow is still known to Unborrow")
	assert.Equal(t, s, into, "reported at its own start, a bucket never made")
	_, _, ok = o.Unborrow(s, 1)
	assert.False(t, ok, "and settled once")
}
