package ring

import (
	"fmt"
	"iter"
	"math"
	"reflect"
	"sync"
	stdatomic "sync/atomic"
	"time"

	"go.uber.org/atomic"
)

// WindowWrap is one bucket of a LeapArray: the start of its time span and the
// value counted in it. The start never changes while the bucket is in the
// ring; an array that reuses buckets (see Reuse) gives a retired one a new,
// later start when it puts it back.
type WindowWrap[T any] struct {
	// start is the bucket's start; emptyStart while a reuse resets it, so
	// that no time maps to it. It only grows.
	start stdatomic.Int64
	slot  int64 // index in the ring, so Retired needs no division
	// Value is the bucket's payload. The array hands out pointers to it; the
	// value type makes its own fields safe for concurrent use.
	Value T
	// settled is set when RetireStale retired the bucket while it stayed
	// in its slot: readers of ranges skip it, and its replacement does not
	// retire it again. Last, so that the hot fields keep their lines.
	settled stdatomic.Bool
}

// Start returns the first instant (inclusive) of the bucket's span.
func (w *WindowWrap[T]) Start() int64 { return w.start.Load() }

// LeapArray is a ring of n time buckets covering interval, each interval/n
// long. The zero value is not usable; call New. A LeapArray is safe for
// simultaneous use by multiple goroutines and must not be copied after first
// use.
type LeapArray[T any] struct {
	// bucketLen and newest come first and together: every write reads both.
	bucketLen int64
	// newest is the newest bucket ever made. It only moves forward, is
	// stored under mu before the bucket goes into its slot, and is both the
	// fast path of Current (no division while time stays in it) and the
	// point every earlier time is clamped to.
	//
	// It is the standard library's pointer, not go.uber.org/atomic's: one
	// wrapper less keeps Head and the fast path of Current within the
	// inlining budget of their callers.
	newest   stdatomic.Pointer[WindowWrap[T]]
	interval int64
	n        int64
	init     func(start int64, v *T)
	// published runs under mu right after a new bucket is visible
	// (Occupiable uses it to retire the borrowed counts it folded in).
	published func()
	// superseded and retired are Hooks.Supersede and Hooks.Retire.
	superseded func(prev *WindowWrap[T])
	retired    func(old *WindowWrap[T])
	// reuse, if set, resets a retired bucket's value for a new start (see
	// Reuse); made then runs on it as on a fresh one (Occupiable folds
	// borrows in).
	reuse func(start int64, v *T)
	made  func(start int64, v *T)
	// spare is the bucket the last rotation retired, for the next to
	// reuse; guarded by mu.
	spare *WindowWrap[T]
	slots []atomic.Pointer[WindowWrap[T]]

	// mu serialises rotations: at most one fresh bucket is built per slot and
	// time, and Occupiable folds borrowed counts under it. Never taken by
	// operations that stay within a bucket.
	mu sync.Mutex
}

// Hooks are the functions a LeapArray runs as it rotates, fixed when it is
// made; each may be nil. They run under the rotation lock, one rotation at
// a time.
type Hooks[T any] struct {
	// Init prepares each freshly allocated bucket's value before it is
	// published (the zero value is used as is otherwise).
	Init func(start int64, v *T)
	// Supersede runs with every bucket that stops being the newest, after
	// the new newest bucket is visible (and before that bucket's rotation
	// retires anything). Every bucket is newest when it is made, so it sees
	// each one once, before it retires: from then on only callers that
	// raced the rotation (they loaded it, or clamped to it, just before)
	// can still reach it.
	Supersede func(prev *WindowWrap[T])
	// Retire runs with every bucket a rotation replaces, after the
	// replacement is visible: the last chance to read a bucket's final
	// counts (stat folds them into longer windows). A writer that raced
	// the rotation and redoes its write on the new bucket may also have
	// landed before Retire read the old one; a value type that must hand
	// over exactly marks its counters here so writers can tell (metric
	// seals them).
	Retire func(old *WindowWrap[T])
}

// New returns a LeapArray of sampleCount buckets covering interval, running
// hooks as it rotates. It returns an error naming the value when
// sampleCount or interval is not positive or interval does not split into
// sampleCount equal whole-nanosecond buckets.
func New[T any](sampleCount int, interval time.Duration, hooks Hooks[T]) (*LeapArray[T], error) {
	a := &LeapArray[T]{}
	if err := a.setup(sampleCount, interval, hooks); err != nil {
		return nil, err
	}
	return a, nil
}

// setup prepares a zero LeapArray in place (see New).
func (a *LeapArray[T]) setup(sampleCount int, interval time.Duration, hooks Hooks[T]) error {
	if sampleCount <= 0 {
		return fmt.Errorf("leaparray: sampleCount must be > 0, got %d", sampleCount)
	}
	if interval <= 0 {
		return fmt.Errorf("leaparray: interval must be > 0, got %v", interval)
	}
	if int64(interval)%int64(sampleCount) != 0 {
		return fmt.Errorf("leaparray: interval %v does not divide into %d equal buckets", interval, sampleCount)
	}
	a.bucketLen = int64(interval) / int64(sampleCount)
	a.interval = int64(interval)
	a.n = int64(sampleCount)
	a.init, a.superseded, a.retired = hooks.Init, hooks.Supersede, hooks.Retire
	a.slots = make([]atomic.Pointer[WindowWrap[T]], sampleCount)
	// Every slot starts with a placeholder that is never valid and is older
	// than any real bucket, so no path needs a nil check.
	empty := placeholder[T]()
	for i := range a.slots {
		a.slots[i].Store(empty)
	}
	a.newest.Store(empty)
	return nil
}

// emptyStart is the start of the placeholder bucket: far enough below any
// real time that now-start never fits in an interval, without overflowing.
const emptyStart = math.MinInt64 / 2

// placeholders holds one placeholder bucket per value type, shared by every
// array of that type: it is never handed out for writing (no time maps to
// its start), so sharing it saves a bucket per array.
var placeholders sync.Map // reflect.Type -> *WindowWrap[T]

func placeholder[T any]() *WindowWrap[T] {
	key := reflect.TypeFor[T]()
	if p, ok := placeholders.Load(key); ok {
		return p.(*WindowWrap[T])
	}
	w := &WindowWrap[T]{}
	w.start.Store(emptyStart)
	p, _ := placeholders.LoadOrStore(key, w)
	return p.(*WindowWrap[T])
}

// sampleCount returns the number of buckets in the ring.
func (a *LeapArray[T]) sampleCount() int { return int(a.n) }

// BucketLen returns the span of one bucket in nanoseconds.
func (a *LeapArray[T]) BucketLen() int64 { return a.bucketLen }

// Interval returns the span of the whole ring in nanoseconds.
func (a *LeapArray[T]) Interval() int64 { return a.interval }

// startOf returns the start of the bucket that holds now: now - now%len.
func (a *LeapArray[T]) startOf(now int64) int64 { return now - now%a.bucketLen }

// indexOf returns the slot that holds now: (now/len) % n.
func (a *LeapArray[T]) indexOf(now int64) int { return int((now / a.bucketLen) % a.n) }

// Clamp returns now, or the start of the newest bucket if now is behind it.
// Negative times clamp to 0.
func (a *LeapArray[T]) Clamp(now int64) int64 {
	if l := a.newest.Load().Start(); now < l {
		return l
	}
	return max(now, 0)
}

// Current returns the bucket that holds now (after Clamp), creating it if its
// slot is empty or holds an older bucket. Exactly one bucket is ever
// published for a given slot and start.
func (a *LeapArray[T]) Current(now int64) *WindowWrap[T] {
	// Below 0 nothing maps (the placeholder's start is far below 0, and a
	// time below it would reach the placeholder).
	now = max(now, 0)
	// Fast path: now is in the newest bucket, or behind it (clamped to it).
	if w := a.newest.Load(); now < w.Start()+a.bucketLen {
		return w
	}
	for {
		now = a.Clamp(now)
		q := now / a.bucketLen
		start := q * a.bucketLen
		slot := &a.slots[q%a.n]
		w := slot.Load()
		ws := w.Start()
		if ws == start {
			return w
		}
		if ws > start {
			// A rotation we did not see yet moved newest past now between our
			// Clamp and this load; clamp again.
			continue
		}
		a.rotate(slot, start)
	}
}

// rotate publishes a fresh bucket for start in slot unless another goroutine
// did first or a newer bucket made start stale.
func (a *LeapArray[T]) rotate(slot *atomic.Pointer[WindowWrap[T]], start int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	// Re-check under the lock: the slot may have been filled while we waited.
	old := slot.Load()
	if old.Start() >= start {
		return
	}
	if start < a.newest.Load().Start() {
		return // the caller re-clamps and lands in the newest bucket
	}
	prev := a.newest.Load()
	w := a.spare
	if w != nil {
		// Reuse the bucket the previous rotation retired: it is in no
		// slot and in no window. Hide it from callers that still hold it
		// (its start), reset it, then give it its new start and slot.
		a.spare = nil
		w.start.Store(emptyStart)
		a.reuse(start, &w.Value)
		w.settled.Store(false)
		w.slot = (start / a.bucketLen) % a.n
	} else {
		w = &WindowWrap[T]{slot: (start / a.bucketLen) % a.n}
		if a.init != nil {
			a.init(start, &w.Value)
		}
	}
	if a.made != nil {
		a.made(start, &w.Value)
	}
	w.start.Store(start)
	// store-release of newest before the slot: anyone who finds the bucket in
	// its slot also finds it (or a newer one) as newest, which is what
	// admissions check after writing (see Newest).
	a.newest.Store(w)
	slot.Store(w)
	if a.published != nil {
		a.published()
	}
	if a.superseded != nil && prev.Start() != emptyStart {
		a.superseded(prev)
	}
	if old.Start() != emptyStart {
		if a.retired != nil && !old.settled.Load() {
			a.retired(old)
		}
		if a.reuse != nil {
			// The next rotation resets it: by then it is in no window
			// (now it still is in the windows of times before the new
			// bucket, which readers may be summing).
			a.spare = old
		}
	}
}

// Reuse makes the array reuse retired buckets instead of making fresh
// ones: each rotation keeps the bucket it retires aside, and the next one
// resets it with fn (under the rotation lock, the bucket in no slot) and
// publishes it for its start, so that an array of n slots holds n+1
// buckets and steady rotation allocates nothing. Nothing stops a caller
// that loaded the bucket before from writing to it after: the value type
// must tell such writes apart (internal/window tags its words with a
// generation), and its start changes with every reuse. Call it before the
// array is shared.
func (a *LeapArray[T]) Reuse(fn func(start int64, v *T)) { a.reuse = fn }

// RetireStale retires, as a rotation would, every bucket that left the
// window a bucket or more before now (start + interval + bucket length <=
// now) but still sits in its slot because no later write reused the slot,
// except the newest bucket, which no rotation retires. Each bucket is
// retired once: RetireStale marks it settled, Buckets skips it from then
// on, and the rotation that later replaces it does not retire it again.
// It is for readers that need every bucket of a past span handed over by
// time, not by the next write (stat's completed seconds); it never
// creates a bucket.
func (a *LeapArray[T]) RetireStale(now int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	newest := a.newest.Load()
	for i := range a.slots {
		w := a.slots[i].Load()
		ws := w.Start()
		if ws == emptyStart || w == newest || w.settled.Load() || ws > now-a.interval-a.bucketLen {
			continue
		}
		w.settled.Store(true)
		if a.retired != nil {
			a.retired(w)
		}
	}
}

// Locked runs fn under the rotation lock: no bucket is made or retired
// while it runs (writes within buckets go on).
func (a *LeapArray[T]) Locked(fn func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	fn()
}

// Buckets yields every real bucket in the ring whose start is in [lo, hi),
// valid or not, in slot order, except those RetireStale retired. It never
// creates a bucket.
func (a *LeapArray[T]) Buckets(lo, hi int64) iter.Seq[*WindowWrap[T]] {
	return func(yield func(*WindowWrap[T]) bool) {
		for i := range a.slots {
			w := a.slots[i].Load()
			if ws := w.Start(); ws != emptyStart && ws >= lo && ws < hi && !w.settled.Load() && !yield(w) {
				return
			}
		}
	}
}

// valid reports whether w is valid at now over the trailing span:
// start <= now and now-start < span (half-open: a bucket is stale exactly
// when now-start >= span).
func valid[T any](w *WindowWrap[T], now, span int64) bool {
	// One unsigned compare covers both bounds: a start after now wraps to a
	// huge difference.
	return uint64(now-w.Start()) < uint64(span)
}

// Within yields the buckets valid at now over the trailing span, in slot
// order. now should come from Clamp. It never creates a bucket and, used in
// a range loop, compiles to a plain loop without allocation.
func (a *LeapArray[T]) Within(now, span int64) iter.Seq[*WindowWrap[T]] {
	return func(yield func(*WindowWrap[T]) bool) {
		for i := range a.slots {
			if w := a.slots[i].Load(); valid(w, now, span) && !yield(w) {
				return
			}
		}
	}
}

// WithinOldestFirst is Within in order of start, oldest first, over a
// span of the whole ring (Interval): slots hold consecutive starts, the
// oldest in the slot after now's.
func (a *LeapArray[T]) WithinOldestFirst(now int64) iter.Seq[*WindowWrap[T]] {
	return func(yield func(*WindowWrap[T]) bool) {
		n := len(a.slots)
		i := a.indexOf(max(now, 0))
		for range n {
			if i++; i == n {
				i = 0
			}
			if w := a.slots[i].Load(); valid(w, now, a.interval) && !yield(w) {
				return
			}
		}
	}
}

// Previous returns the bucket just before the one holding now, if it is
// still valid, else nil. It never creates a bucket.
func (a *LeapArray[T]) Previous(now int64) *WindowWrap[T] {
	now = a.Clamp(now)
	prev := now - a.bucketLen
	if prev < 0 {
		return nil
	}
	w := a.slots[a.indexOf(prev)].Load()
	if w.Start() != a.startOf(prev) {
		return nil
	}
	return w
}

// retiredFrom reports whether w has been replaced in its slot by a newer bucket.
// A writer that raced a rotation checks it after writing and redoes the write
// on Current if it is true.
//
// It compares starts, not just pointers: a rotation publishes the new bucket
// as newest before it stores it in its slot, so for that instant Current
// already hands out a bucket its slot does not hold yet. That bucket is not
// retired; a pointer test would say it is and send its writers round a redo
// loop, writing again on every turn, until the slot store lands.
func (a *LeapArray[T]) retiredFrom(w *WindowWrap[T]) bool {
	s := a.slots[w.slot].Load()
	return s != w && s.Start() > w.Start()
}

// Head returns the newest bucket ever made, or a placeholder whose start no
// time reaches when none was. It never creates a bucket.
func (a *LeapArray[T]) Head() *WindowWrap[T] { return a.newest.Load() }

// Newest reports whether w is still the newest bucket of the array. An
// admission that must be seen by every later window (flow's Reserve) checks
// it after its write: once a newer bucket exists, a rotation may already have
// summed w without the write.
func (a *LeapArray[T]) Newest(w *WindowWrap[T]) bool {
	return a.newest.Load() == w
}
