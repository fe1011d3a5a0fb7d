package stat

import (
	"time"

	"github.com/leapflow/leapflow/internal/clocks"
)

// Clock is the time source of an engine: Now returns nanoseconds from an
// origin of the clock's choosing. Implementations must be safe for
// simultaneous use. Engines keep their own time moving forward when a clock
// steps back (see flow.WithClock).
type Clock interface {
	Now() int64
}

// NewMonotonic returns a Clock that counts from now on Go's monotonic clock,
// immune to wall-clock steps.
func NewMonotonic() Clock { return clocks.Monotonic{Origin: time.Now()} }

// DefaultClock returns the clock engines use when given none: one coarse
// clock of 1 ms per process, started on first use and never stopped (one
// goroutine waking every millisecond). A read is an atomic load and a
// cheap random draw, and one read in 16 refreshes it from the monotonic
// clock, so it stays within a millisecond or so even when a saturated CPU
// starves its ticker. A read costs a few nanoseconds instead of the 20-45
// ns of time.Since measured on the dev machine; the price is millisecond
// RTs. Pass NewMonotonic to an engine for nanosecond RTs.
func DefaultClock() Clock { return clocks.Default() }
