package leaparray

import (
	"iter"
	"time"

	"github.com/leapflow/leapflow/internal/ring"
)

// WindowWrap is one bucket of a LeapArray: the start of its time span and the
// value counted in it (Value). The start never changes once the bucket is
// published.
type WindowWrap[T any] = ring.WindowWrap[T]

// Hooks are the functions a LeapArray runs as it rotates, fixed when it is
// made; each may be nil. They run under the rotation lock, one rotation at
// a time: Init prepares each fresh bucket's value before it is published,
// Supersede sees every bucket that stops being the newest, and Retire every
// bucket a rotation replaces (the last chance to read its final counts).
type Hooks[T any] = ring.Hooks[T]

// LeapArray is a ring of n time buckets covering interval, each interval/n
// long. The zero value is not usable; call New. A LeapArray is safe for
// simultaneous use by multiple goroutines and must not be copied after first
// use.
type LeapArray[T any] ring.LeapArray[T]

// New returns a LeapArray of sampleCount buckets covering interval, running
// hooks as it rotates. It returns an error naming the value when
// sampleCount or interval is not positive or interval does not split into
// sampleCount equal whole-nanosecond buckets.
func New[T any](sampleCount int, interval time.Duration, hooks Hooks[T]) (*LeapArray[T], error) {
	a, err := ring.New(sampleCount, interval, hooks)
	return (*LeapArray[T])(a), err
}

func (a *LeapArray[T]) r() *ring.LeapArray[T] { return (*ring.LeapArray[T])(a) }

// BucketLen returns the length of one bucket, in ns.
func (a *LeapArray[T]) BucketLen() int64 { return a.r().BucketLen() }

// Interval returns the span the ring covers, in ns.
func (a *LeapArray[T]) Interval() int64 { return a.r().Interval() }

// Clamp returns now, or the start of the newest bucket ever made if now is
// behind it: every operation counts a time behind the window there (see
// "Time going backwards").
func (a *LeapArray[T]) Clamp(now int64) int64 { return a.r().Clamp(now) }

// Current returns the bucket holding now (clamped), creating it, or
// replacing the older bucket in its slot, if needed.
func (a *LeapArray[T]) Current(now int64) *WindowWrap[T] { return a.r().Current(now) }

// Within yields the buckets valid at now over the trailing span, in slot
// order. now should come from Clamp. It never creates a bucket and, used in
// a range loop, allocates nothing.
func (a *LeapArray[T]) Within(now, span int64) iter.Seq[*WindowWrap[T]] {
	return a.r().Within(now, span)
}

// Previous returns the bucket just before the one holding now, if it is
// still valid, else nil. It never creates a bucket.
func (a *LeapArray[T]) Previous(now int64) *WindowWrap[T] { return a.r().Previous(now) }

// Buckets yields every bucket in the ring whose start is in [lo, hi),
// valid or not, in slot order. It never creates a bucket.
func (a *LeapArray[T]) Buckets(lo, hi int64) iter.Seq[*WindowWrap[T]] { return a.r().Buckets(lo, hi) }
