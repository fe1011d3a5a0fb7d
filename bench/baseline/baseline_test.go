package baseline

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const ms = int64(time.Millisecond)

func count(allow func(int64) bool, at int64, n int) int {
	c := 0
	for range n {
		if allow(at) {
			c++
		}
	}
	return c
}

// The seeds' boundary example: T at 0.9W, T more at 1.0W.
func TestBoundaryBurst(t *testing.T) {
	const T = 100
	f := NewFixedWindow(T, time.Second, nil)
	assert.Equal(t, T, count(f.AllowAt, 900*ms, 2*T))
	assert.Equal(t, T, count(f.AllowAt, 1000*ms, 2*T), "the fixed window's double burst")

	l := NewSlidingLog(T, time.Second, nil)
	assert.Equal(t, T, count(l.AllowAt, 900*ms, 2*T))
	assert.Equal(t, 0, count(l.AllowAt, 1000*ms, 2*T), "the log is exact")
	assert.Equal(t, T, count(l.AllowAt, 1900*ms, 2*T))

	s := NewSlidingWindow(T, time.Second, 10, nil)
	assert.Equal(t, T, count(s.AllowAt, 900*ms, 2*T))
	assert.Equal(t, 0, count(s.AllowAt, 1000*ms, 2*T))
	assert.Equal(t, 0, count(s.AllowAt, 1899*ms, 2*T))
	assert.Equal(t, T, count(s.AllowAt, 1900*ms, 2*T), "the 900ms slot left the ring")
	assert.Equal(t, 0, count(s.AllowAt, 5000*ms, 0))
	assert.Equal(t, T, count(s.AllowAt, 5000*ms, 2*T), "a long gap clears the ring")
}

// TestRealClocks runs each limiter on its real clock with one admission
// per 50ms window: a second request right after the first is refused, and
// a request is admitted again once the window has passed, not before.
func TestRealClocks(t *testing.T) {
	const window = 50 * time.Millisecond
	type limiter interface{ AllowTimed() (bool, int64) }
	for _, tc := range []struct {
		name string
		make func() limiter
	}{
		{"fixed window", func() limiter { return NewFixedWindow(1, window, RealClock()) }},
		{"sliding log", func() limiter { return NewSlidingLog(1, window, RealClock()) }},
		{"sliding window", func() limiter { return NewSlidingWindow(1, window, 2, RealClock()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A fresh limiter's clock starts at 0, so two requests read
			// before window/2 share a window (and, for the sliding window,
			// its first slot) however each limiter splits time. A machine
			// that stalls longer than that between them gets another try.
			var l limiter
			for try := 0; ; try++ {
				require.Less(t, try, 20, "never two requests within %v of each other", window/2)
				l = tc.make()
				ok, _ := l.AllowTimed()
				require.True(t, ok, "the first request is admitted")
				ok, again := l.AllowTimed()
				if again >= int64(window/2) {
					continue
				}
				require.False(t, ok, "a second request in the same window is refused")
				break
			}
			// Eventually calls its condition on another goroutine: the
			// reading is passed back through an atomic.
			var readmitted atomic.Int64
			require.Eventually(t, func() bool {
				ok, now := l.AllowTimed()
				if ok {
					readmitted.Store(now)
				}
				return ok
			}, 10*time.Second, 5*time.Millisecond, "admits again once the window has passed")
			// The first admission was in [0, window/2): every limiter keeps
			// it until its clock reads at least window.
			assert.GreaterOrEqual(t, readmitted.Load(), int64(window),
				"not readmitted while the first admission is still in its window")
		})
	}
}
