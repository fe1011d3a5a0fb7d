package metric

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The standalone surface counts, admits and reads what the engine's
// window does: it is that window, seen through fewer methods.
func TestWindowSurfaceAdmitsCountsAndReads(t *testing.T) {
	w := newWindow(t, 4, time.Second)
	ms := int64(time.Millisecond)
	for range 3 {
		r, ok := w.Admit(100*ms, 1, 3)
		require.True(t, ok)
		assert.Equal(t, int64(0), r.Start(), "counted in the first bucket")
		assert.True(t, r.Holds(200*ms))
		assert.False(t, r.Holds(250*ms))
	}
	r, ok := w.Admit(300*ms, 1, 3)
	assert.False(t, ok, "the threshold holds across buckets")
	assert.Equal(t, int64(3), r.Seen())
	assert.False(t, w.Reserve(300*ms, 1, 3))
	w.Complete(300*ms, 2, 10*ms, true)
	w.RecordConcurrency(300*ms, 7)
	assert.Equal(t, int64(3), w.Sum(300*ms, Pass))
	assert.Equal(t, int64(2), w.Sum(300*ms, Success))
	assert.Equal(t, int64(2), w.Sum(300*ms, Exception))
	assert.Zero(t, w.Sum(300*ms, Block), "a refusal writes nothing: its caller counts Block")
	assert.Equal(t, int64(7), w.MaxConcurrency(300*ms))
	assert.InDelta(t, float64(5*ms), w.AvgRT(300*ms), 0, "10 ms over 2 completions")
	half, err := w.View(500 * time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, int64(0), half.Sum(600*ms, Pass), "the first bucket has left the last 500 ms")
	wait, _, ok := w.RoomIn(300*ms, 1, 3)
	require.True(t, ok)
	assert.Equal(t, 700*time.Millisecond, wait, "room once the first bucket leaves")
}
