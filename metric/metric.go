package metric

import (
	"time"

	"github.com/leapflow/leapflow/internal/window"
)

// Event is a kind of count kept per bucket: Pass, Block, Success,
// Exception, RT (response times summed, in the caller's unit) and
// OccupiedPass (admitted against a future bucket, counted as Pass too when
// it lands).
type Event = window.Event

// The events a bucket counts.
const (
	Pass         = window.Pass
	Block        = window.Block
	Success      = window.Success
	Exception    = window.Exception
	RT           = window.RT
	OccupiedPass = window.OccupiedPass
)

// Option configures a Window.
type Option = window.Option

// WithStripes sets how many stripes each bucket spreads its summed counters
// over (rounded up to a power of two, at most 64; default GOMAXPROCS). 1
// turns striping off, which suits long windows of many buckets that are
// rarely hot.
func WithStripes(n int) Option { return window.WithStripes(n) }

// Reader reads a window's counts over a span of its interval (see View);
// a Window is a Reader of its whole interval.
type Reader = window.Reader

// Window is a sliding window of event counts over the last interval, split
// into sampleCount buckets. It is safe for simultaneous use by multiple
// goroutines and must not be copied after first use. Its read methods
// (Sum, Rate, AvgRT, MinRT, MaxRate, MaxConcurrency, Interval) are its
// Reader's.
type Window window.Window

// NewWindow returns a Window of sampleCount buckets over interval. It returns
// an error naming the value when the pair is invalid (see leaparray.New) or
// an option is out of range.
func NewWindow(sampleCount int, interval time.Duration, opts ...Option) (*Window, error) {
	w, err := window.NewWindow(sampleCount, interval, opts...)
	return (*Window)(w), err
}

func (w *Window) in() *window.Window { return (*window.Window)(w) }

// BucketLen returns the length of the window's buckets, in ns.
func (w *Window) BucketLen() int64 { return w.in().BucketLen() }

// Add adds n to event e in the bucket holding now. Counts must stay
// non-negative. Every count lands exactly once, however it races a
// bucket's rotation. A Pass added here is counted without admission (for
// windows that only keep statistics); later admissions count it. A bucket
// counts at most 2^53 - 1 (about 9e15) passes on each of its stripes: more
// are dropped.
func (w *Window) Add(now int64, e Event, n int64) { w.in().Add(now, e, n) }

// Complete records n completions at now that took rt each (RT adds
// n x rt; the bucket's MinRT sees rt), failed ones as Exception too.
func (w *Window) Complete(now, n, rt int64, failed bool) { w.in().Complete(now, n, rt, failed) }

// RecordConcurrency raises the maximum concurrency of the bucket holding
// now to c if c is larger.
func (w *Window) RecordConcurrency(now, c int64) { w.in().RecordConcurrency(now, c) }

// Admit counts n passes at now if the window's passes, plus n, stay at or
// below threshold: the check and the count are one atomic step, at any
// concurrency. It returns the admission (which bucket counted it, and how
// many passes the window held) and whether it was admitted. A threshold
// above 2^53 - 1 (about 9e15) admits that many.
func (w *Window) Admit(now, n, threshold int64) (Reservation, bool) {
	r, ok := w.in().Admit(now, n, threshold)
	return Reservation(r), ok
}

// Reserve is Admit that reports only whether n was admitted.
func (w *Window) Reserve(now, n, threshold int64) bool { return w.in().Reserve(now, n, threshold) }

// RoomIn returns how long after now the window, taking no more admissions,
// first holds at most threshold - n (room for a request of n), and how
// long until everything it holds now has left it. It reports false when
// no wait gives room. It reads the buckets once and allocates nothing.
func (w *Window) RoomIn(now, n, threshold int64) (wait, reset time.Duration, ok bool) {
	return w.in().RoomIn(now, n, threshold)
}

// View returns a Reader of the window over its trailing span interval, a
// whole number of its buckets, at most its own interval.
func (w *Window) View(interval time.Duration) (*Reader, error) { return w.in().View(interval) }

// Reservation is one admission: the bucket that counted it and what the
// window held when it was admitted.
type Reservation window.Reservation

// Start returns the start of the bucket that counted the admission (the
// newest, if now was behind it); 0 when refused.
func (r Reservation) Start() int64 { return window.Reservation(r).Start() }

// Holds reports whether instant t falls in the bucket that counted the
// admission.
func (r Reservation) Holds(t int64) bool { return window.Reservation(r).Holds(t) }

// Seen returns, for a refused admission, the window's committed count that
// refused it (passes, leases not yet used, borrowed admissions); 0 for an
// admission.
func (r Reservation) Seen() int64 { return window.Reservation(r).Seen() }
