// Package stattest has helpers for testing code that uses leapflow: a manual
// clock to drive engines with synthetic time.
package stattest

import (
	"time"

	"go.uber.org/atomic"
)

// Clock is a stat.Clock that moves only when told. The zero value reads 0
// and is ready to use; it is safe for simultaneous use.
type Clock struct{ now atomic.Int64 }

// NewClock returns a Clock reading start.
func NewClock(start time.Duration) *Clock {
	c := &Clock{}
	c.now.Store(int64(start))
	return c
}

// Now returns the current reading in nanoseconds.
func (c *Clock) Now() int64 { return c.now.Load() }

// Set moves the clock to t, forwards or backwards.
func (c *Clock) Set(t time.Duration) { c.now.Store(int64(t)) }

// Advance moves the clock by d (negative d steps it back) and returns the
// new reading.
func (c *Clock) Advance(d time.Duration) time.Duration { return time.Duration(c.now.Add(int64(d))) }
