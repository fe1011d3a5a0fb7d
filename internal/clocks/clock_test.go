package clocks

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

func TestMonotonicNeverGoesBack(t *testing.T) {
	c := Monotonic{Origin: time.Now()}
	prev := c.Now()
	for range 10000 {
		now := c.Now()
		require.GreaterOrEqual(t, now, prev)
		prev = now
	}
}

func TestCoarseAdvancesAndStops(t *testing.T) {
	c := NewCoarse(time.Millisecond)
	defer c.Stop()
	first := c.Now()
	require.Eventually(t, func() bool { return c.Now() > first }, 2*time.Second, time.Millisecond)
	c.Stop()
	c.Stop() // idempotent
	select {
	case <-c.done:
	default:
		t.Fatal("Stop returned with the ticker goroutine running")
	}
}

// With the ticker stopped, reads alone keep the clock near the monotonic
// clock: one read in RefreshEvery, at random, refreshes it.
func TestCoarseReadsAdvanceTheClock(t *testing.T) {
	c := NewCoarse(time.Millisecond)
	c.Stop()
	before := c.Now()
	time.Sleep(20 * time.Millisecond)
	// One read in 16 refreshes, at random: 2000 reads without one happen
	// with odds of (15/16)^2000, never.
	var last int64
	for range 2000 {
		now := c.Now()
		require.GreaterOrEqual(t, now, last, "never backwards")
		last = now
	}
	assert.GreaterOrEqual(t, last-before, int64(20*time.Millisecond), "the reads moved the clock")
	assert.LessOrEqual(t, int64(time.Since(c.origin))-last, int64(time.Second), "and near the monotonic clock")
}

// Once a refresh finds the value two resolutions behind, every read
// refreshes until one finds it fresh.
func TestCoarseEagerWhileBehind(t *testing.T) {
	c := NewCoarse(time.Millisecond)
	c.Stop()
	time.Sleep(5 * time.Millisecond)
	c.Refresh(c.now.Load())
	require.True(t, c.behind.Load(), "5 ms behind a 1 ms clock")
	time.Sleep(5 * time.Millisecond)
	before := c.now.Load()
	got := c.Now() // refreshes, whatever the draw: behind
	assert.GreaterOrEqual(t, got-before, int64(5*time.Millisecond))
	// Fresh after a read that finds it so (a read descheduled for two
	// resolutions finds it behind again and refreshes once more): back to
	// one read in 16.
	for i := 0; c.behind.Load() && i < 1000; i++ {
		c.Now()
	}
	assert.False(t, c.behind.Load())
}

// A saturated CPU can starve the ticker goroutine (measured: seconds behind
// with 1024 busy goroutines and one sleeper on 2 cores, in some runs);
// reads keep the clock up.
func TestCoarseKeepsUpUnderSaturation(t *testing.T) {
	c := NewCoarse(time.Millisecond)
	defer c.Stop()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 256 {
		wg.Go(func() {
			for !stop.Load() {
				for range 100 {
					c.Now()
				}
			}
		})
	}
	wg.Go(func() { // a goroutine on timers, as every service has
		for !stop.Load() {
			time.Sleep(5 * time.Millisecond)
		}
	})
	var maxLag int64
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		for range 100 {
			maxLag = max(maxLag, int64(time.Since(c.origin))-c.Now())
		}
		runtime.Gosched()
	}
	stop.Store(true)
	wg.Wait()
	// Far looser than the bound (a resolution plus 16 reads), for a loaded
	// CI machine: the test goroutine itself can be preempted between its
	// two reads.
	assert.Less(t, time.Duration(maxLag), 300*time.Millisecond, "the clock fell behind")
}
