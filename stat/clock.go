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
//
// Its readings are multiples of the tick (give or take scheduling), so RTs
// measured with it have that resolution, and a bucket edge may be seen up to
// a tick late; admission stays exact against the clock's own readings.
type Coarse struct {
	now    atomic.Int64
	origin time.Time
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// NewCoarse starts a Coarse clock with the given resolution (at least 100µs).
func NewCoarse(resolution time.Duration) *Coarse {
	resolution = max(resolution, 100*time.Microsecond)
	c := &Coarse{origin: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go c.run(resolution)
	return c
}

// DefaultResolution is the tick of the shared default clock.
const DefaultResolution = time.Millisecond

var (
	sharedOnce  sync.Once
	sharedClock *Coarse
)

// DefaultClock returns the clock engines use when given none: one Coarse
// clock of DefaultResolution per process, started on first use and never
// stopped (one goroutine waking every millisecond). A read costs an atomic
// load instead of the 25-45 ns of time.Since measured on the dev machine;
// the price is millisecond RTs. Pass NewMonotonic to an engine for
// nanosecond RTs.
func DefaultClock() Clock {
	sharedOnce.Do(func() { sharedClock = NewCoarse(DefaultResolution) })
	return sharedClock
}

func (c *Coarse) run(resolution time.Duration) {
	defer close(c.done)
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

// Stop ends the background goroutine and waits for it; Now then stays where
// it was.
func (c *Coarse) Stop() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}
