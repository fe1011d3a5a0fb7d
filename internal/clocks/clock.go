// Package clocks holds the clocks behind package stat's: Go's monotonic
// clock read from an origin, and Coarse, a cached reading of it that its
// readers help keep fresh. Only leapflow's own packages import it.
package clocks

import (
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// Monotonic reads Go's monotonic clock from Origin (stat.NewMonotonic).
type Monotonic struct{ Origin time.Time }

// Now returns the nanoseconds since Origin.
func (m Monotonic) Now() int64 { return int64(time.Since(m.Origin)) }

// Coarse is a Clock that serves a cached reading of Go's monotonic clock,
// refreshed every resolution by a background goroutine and by its readers:
// Now is an atomic load and a draw from the runtime's per-thread random
// state, and one read in 16, at random, reads the monotonic clock and moves
// the cached value forward if it is a resolution or more behind.
//
// The readers' share matters when the CPU is saturated: a goroutine woken by
// a ticker then waits behind every runnable goroutine (measured on 2 cores
// with 1024 busy goroutines: seconds), and a clock advanced only by it falls
// that far behind, so limits stop limiting. With readers refreshing, a read
// is behind the monotonic clock by at most
//
//   - a resolution, while the ticker keeps up (an idle or lightly loaded
//     process), or
//   - a resolution plus the time the process takes for about 16 reads
//     (any reader's refresh serves all; 100 reads in a row without one
//     happen with odds below 0.2%), when the ticker is late: microseconds
//     when the readers are what saturates the CPU.
//
// Once a refresh finds the value two resolutions or more behind (the ticker
// is late and reads are sparse), every read refreshes until one finds it
// fresh, so only the reads before that first refresh can lag more: when no
// goroutine reads for a while and the ticker is starved, the first reads
// after the pause can be as stale as the ticker is late. The clock never
// goes backwards: every store is a compare-and-swap maximum.
//
// Readings step by about the resolution, so RTs measured with it have that
// resolution, and a bucket edge may be seen up to a resolution late;
// admission stays exact against the clock's own readings.
type Coarse struct {
	now atomic.Int64
	// behind is set while reads refresh on every read: a refresh found the
	// value two resolutions or more behind (the ticker is late and reads
	// are sparse). It shares now's line, which every read loads anyway.
	behind atomic.Bool
	_      [cpu.CacheLine - 12]byte // read by every Now; written about once a resolution

	origin time.Time
	res    int64
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// RefreshEvery is how many reads a Coarse clock serves, on average, for
// each read of the monotonic clock (a power of two).
const RefreshEvery = 16

// NewCoarse starts a Coarse clock with the given resolution (at least
// 100µs).
func NewCoarse(resolution time.Duration) *Coarse {
	resolution = max(resolution, 100*time.Microsecond)
	c := &Coarse{
		origin: time.Now(),
		res:    int64(resolution),
		stop:   make(chan struct{}),
		done:   make(chan struct{}),
	}
	go c.run(resolution)
	return c
}

// DefaultResolution is the tick of the shared default clock.
const DefaultResolution = time.Millisecond

var (
	sharedOnce  sync.Once
	sharedClock *Coarse
)

// Default returns the process's one Coarse clock of DefaultResolution,
// started on first use and never stopped (stat.DefaultClock).
func Default() *Coarse {
	sharedOnce.Do(func() { sharedClock = NewCoarse(DefaultResolution) })
	return sharedClock
}

// Words returns the cached time and the flag that says reads must refresh
// it, for readers that spell Now's fast path out.
func (c *Coarse) Words() (*atomic.Int64, *atomic.Bool) { return &c.now, &c.behind }

func (c *Coarse) run(resolution time.Duration) {
	defer close(c.done)
	t := time.NewTicker(resolution)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
			c.advance(int64(time.Since(c.origin)))
		}
	}
}

// Now returns the cached time.
func (c *Coarse) Now() int64 {
	v := c.now.Load()
	// A random draw, not a count: a count per P costs a store, which on
	// amd64 is a locked instruction, on every read.
	if cpu.Rand()%RefreshEvery != 0 && !c.behind.Load() {
		return v
	}
	return c.Refresh(v)
}

// Refresh reads the monotonic clock for a reader that saw v (Now's slow
// path, for readers that spell its fast path out).
func (c *Coarse) Refresh(v int64) int64 {
	t := int64(time.Since(c.origin))
	lag := t - v
	if behind := lag >= 2*c.res; behind != c.behind.Load() {
		c.behind.Store(behind)
	}
	if lag < c.res {
		// Fresh enough: leave the shared line alone (a store would take it
		// from every reader's cache).
		return v
	}
	return c.advance(t)
}

// advance moves the cached time forward to t, never back, and returns the
// time it holds then.
func (c *Coarse) advance(t int64) int64 {
	for {
		cur := c.now.Load()
		if cur >= t {
			return cur // another refresh got there first
		}
		if c.now.CompareAndSwap(cur, t) {
			return t
		}
	}
}

// Stop ends the background goroutine and waits for it. Reads keep the
// clock moving on their own (see Coarse), a resolution behind at most while
// reads are frequent.
func (c *Coarse) Stop() {
	c.once.Do(func() { close(c.stop) })
	<-c.done
}
