package stat

import (
	"sync"
	"time"

	"go.uber.org/atomic"
)

// Clock is the time source of an engine: Now returns nanoseconds from an
// origin of the clock's choosing and must not go backwards by much (metric
// clamps small steps back; see leaparray). Implementations must be safe for
// simultaneous use.
type Clock interface {
	Now() int64
}

// monotonic reads Go's monotonic clock.
type monotonic struct{ origin time.Time }

// NewMonotonic returns a Clock that counts from now on Go's monotonic clock,
// immune to wall-clock steps.
func NewMonotonic() Clock { return monotonic{origin: time.Now()} }

func (m monotonic) Now() int64 { return int64(time.Since(m.origin)) }

// Coarse is a Clock that a background goroutine advances every resolution;
// Now is a single atomic load. Call Stop to end the goroutine.
type Coarse struct {
	now    atomic.Int64
	origin time.Time
	stop   chan struct{}
	once   sync.Once
}

// NewCoarse starts a Coarse clock with the given resolution (at least 100µs).
func NewCoarse(resolution time.Duration) *Coarse {
	resolution = max(resolution, 100*time.Microsecond)
	c := &Coarse{origin: time.Now(), stop: make(chan struct{})}
	go c.run(resolution)
	return c
}

func (c *Coarse) run(resolution time.Duration) {
	t := time.NewTicker(resolution)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.now.Store(int64(time.Since(c.origin)))
		}
	}
}

// Now returns the time of the latest tick.
func (c *Coarse) Now() int64 { return c.now.Load() }

// Stop ends the background goroutine; Now then stays where it was.
func (c *Coarse) Stop() { c.once.Do(func() { close(c.stop) }) }
