package baseline

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

func TestRealClocks(t *testing.T) {
	assert.True(t, NewFixedWindow(1, time.Second, RealClock()).Allow())
	assert.True(t, NewSlidingLog(1, time.Second, RealClock()).Allow())
	assert.True(t, NewSlidingWindow(1, time.Second, 2, RealClock()).Allow())
}
