package ring

import (
	"time"

	"go.uber.org/atomic"
)

// Occupiable is a LeapArray whose future buckets can be borrowed from: a
// request blocked in the current window may be admitted now against a
// bucket that has not started, if every window containing that bucket stays
// within the threshold. When the main array creates a bucket, every borrowed
// count due by its start is folded into it (see the fold function given to
// Init); a borrow whose own bucket never got created (no traffic at
// that time) folds into the next bucket made, late but never lost, unless
// that bucket is a whole interval or more past it: then no window holds
// both, and the borrow lapses instead (see Init's lapse), charged to no
// later window.
//
// Borrowing is the slow path (the caller is about to wait), so it runs under
// the array's rotation lock; folding runs under the same lock, which makes the
// hand-over exact. Pending is lock-free, for admission checks on the hot path.
type Occupiable[T any] struct {
	LeapArray[T] // by value: one pointer less to chase per operation
	count        func(v *T) int64
	fold         func(v *T, n int64)
	lapse        func(start, n int64)
	future       []borrowed // ring keyed by start, guarded by mu; made on the first Borrow

	// pending is the total borrowed and not yet folded. It is raised before a
	// borrow reads any count and lowered only after the bucket holding the
	// folded count is published, so a reader that sums the main array and
	// adds pending may count a borrow twice, never zero times.
	pending atomic.Int64
	// epoch counts borrow attempts. It rises before a borrow reads any count,
	// so a lock-free admission that sees it unchanged across its write knows
	// no borrow missed that write.
	epoch  atomic.Int64
	folded int64 // folded by the rotation in progress; guarded by mu
}

// borrowed is what is borrowed from the bucket starting at start: n not
// folded yet, and folded, what was folded into the bucket starting at
// into (the first made at or after start), or lapsed, what lapsed (see
// Init), for Unborrow.
type borrowed struct {
	start  int64
	n      int64
	folded int64
	into   int64
	lapsed int64
	// claims is what borrowers that will settle (BorrowAt's: Unborrow or
	// Arrived) have not settled yet: the record is not reused for a later
	// bucket while any is out, so a late Unborrow still finds it.
	claims int64
}

// Init prepares a zero Occupiable in place (it is used by value, embedded
// in the type that counts with it): sampleCount, interval and hooks are
// New's; count reads the admitted count of a bucket (what a threshold
// limits); fold adds n borrowed admissions to a freshly made bucket before
// it is published. lapse (nil: dropped) takes instead the n borrowed from
// the bucket starting at start when the first bucket made at or after it
// starts a whole interval or more later: its borrower went without making
// it (a sleep that returned early, a clock that stepped), and charging it
// to that later bucket would shut out a window's worth of callers who
// never shared a window with it. lapse runs under the rotation lock, as
// fold does. It must be called once, before the array is shared.
func (o *Occupiable[T]) Init(sampleCount int, interval time.Duration, hooks Hooks[T],
	count func(v *T) int64, fold func(v *T, n int64), lapse func(start, n int64)) error {
	if err := o.setup(sampleCount, interval, hooks); err != nil {
		return err
	}
	o.made = o.foldDue
	o.published = o.retireFolded
	o.count, o.fold, o.lapse = count, fold, lapse
	return nil
}

// foldDue runs under mu for every new or reused bucket, after its init:
// the fold of every borrow due by start (or its lapse, a whole interval
// late).
func (o *Occupiable[T]) foldDue(start int64, v *T) {
	for i := range o.future {
		f := &o.future[i]
		if f.n <= 0 || f.start > start {
			continue
		}
		if start-f.start >= o.interval {
			if o.lapse != nil {
				o.lapse(f.start, f.n)
			}
			f.lapsed += f.n
		} else {
			o.fold(v, f.n)
			f.folded += f.n
			f.into = start
		}
		o.folded += f.n
		f.n = 0
	}
}

func (o *Occupiable[T]) retireFolded() {
	if o.folded != 0 {
		o.pending.Sub(o.folded)
		o.folded = 0
	}
}

// DueBorrow returns the earliest start, at or before now, of a bucket that
// was borrowed from and not made yet: making it (Current) folds the borrow
// in. A reader that needs every count by time (internal/window's Settle) makes it.
func (o *Occupiable[T]) DueBorrow(now int64) (int64, bool) {
	if o.pending.Load() == 0 {
		return 0, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	best, ok := int64(0), false
	for _, f := range o.future {
		if f.n > 0 && f.start <= now && (!ok || f.start < best) {
			best, ok = f.start, true
		}
	}
	return best, ok
}

// Borrows calls fn with every count borrowed and not folded yet, and the
// start of the bucket it was borrowed from. fn must not call o.
func (o *Occupiable[T]) Borrows(fn func(start, n int64)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range o.future {
		if f.n > 0 {
			fn(f.start, f.n)
		}
	}
}

// Lend records n as borrowed from the bucket holding at, checking no
// window: a count another array admitted that this one must hold where it
// lands. It folds into that bucket when it is made, as a borrow does. It
// reports false, recording nothing, when that bucket is made already or
// its record holds an older borrow (the caller counts n otherwise).
func (o *Occupiable[T]) Lend(at, n int64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.startOf(at)
	if n <= 0 || s <= o.Head().Start() {
		return false
	}
	if o.future == nil {
		o.future = make([]borrowed, o.n)
	}
	f := o.record(s)
	if f == nil {
		return false
	}
	f.n += n
	o.pending.Add(n)
	o.epoch.Inc()
	return true
}

// free reports whether the record slot of bucket s can be taken for it.
// Called with mu held.
func (o *Occupiable[T]) free(s int64) bool {
	f := &o.future[o.indexOf(s)]
	return f.start == s || (f.n == 0 && f.claims == 0)
}

// record returns the record of future bucket s, made fresh if it held
// another bucket's, or nil while it holds another bucket's unfolded
// borrow or unsettled claims. Called with mu held.
func (o *Occupiable[T]) record(s int64) *borrowed {
	if !o.free(s) {
		return nil
	}
	f := &o.future[o.indexOf(s)]
	if f.start != s {
		*f = borrowed{start: s}
	}
	return f
}

// Arrived settles n that BorrowAt borrowed from the bucket starting at
// start: the borrower went (its count stays, folded or to fold).
func (o *Occupiable[T]) Arrived(start, n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.future == nil {
		return
	}
	if f := &o.future[o.indexOf(start)]; f.start == start {
		f.claims = max(f.claims-n, 0)
	}
}

// Pending returns the total borrowed from buckets that have not been made
// current yet.
func (o *Occupiable[T]) Pending() int64 { return o.pending.Load() }

// Epoch returns the number of Borrow calls that have started. An admission
// that writes a count without the lock loads it before and after the write;
// if it changed, a borrow may have read the counts without that write.
func (o *Occupiable[T]) Epoch() int64 { return o.epoch.Load() }

// pendingAt returns how much is borrowed from the future bucket that starts
// at start (0 once it has been folded).
func (o *Occupiable[T]) pendingAt(start int64) int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.future == nil {
		return 0
	}
	f := o.future[o.indexOf(start)]
	if f.start != start {
		return 0
	}
	return f.n
}

// Borrow tries to admit n against the earliest future bucket that starts no
// later than now+maxWait and keeps every window containing it at or below
// threshold, counting what the main array holds and everything borrowed
// already. On success it records the borrow and returns how long the caller
// must wait for that bucket to start.
func (o *Occupiable[T]) Borrow(now, n, threshold, maxWait int64) (wait int64, ok bool) {
	_, wait, ok = o.borrow(now, 0, n, threshold, maxWait, false)
	return wait, ok
}

// BorrowAt is Borrow that also returns the start of the bucket borrowed
// from. The borrower settles the borrow later, with that start: Unborrow
// (it did not go), or Arrived (it went).
func (o *Occupiable[T]) BorrowAt(now, n, threshold, maxWait int64) (start, wait int64, ok bool) {
	return o.BorrowFrom(now, 0, n, threshold, maxWait)
}

// BorrowFrom is BorrowAt among the future buckets that start at or after
// from only.
func (o *Occupiable[T]) BorrowFrom(now, from, n, threshold, maxWait int64) (start, wait int64, ok bool) {
	return o.borrow(now, from, n, threshold, maxWait, true)
}

func (o *Occupiable[T]) borrow(now, from, n, threshold, maxWait int64, claim bool) (start, wait int64, ok bool) {
	if n <= 0 || n > threshold {
		return 0, 0, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.future == nil {
		o.future = make([]borrowed, o.n) // most arrays never borrow
	}
	now = o.Clamp(now)
	// Raise pending before reading any count: a concurrent lock-free admission
	// (which reads pending after its own write) then sees this borrow, or this
	// borrow sees its write.
	o.pending.Add(n)
	o.epoch.Inc()
	cur := o.startOf(now)
	for k := int64(1); k <= o.n; k++ {
		s := cur + k*o.bucketLen
		if s-now > maxWait {
			break
		}
		if s < from {
			continue
		}
		if !o.free(s) {
			continue // the slot still holds an older borrow, or its claims
		}
		if o.fits(s, n, threshold) {
			f := o.record(s)
			f.n += n
			if claim {
				f.claims += n
			}
			return s, s - now, true
		}
	}
	o.pending.Sub(n)
	return 0, 0, false
}

// Unborrow gives back n that BorrowAt borrowed from the bucket starting at
// start. If no bucket at or after start has been made, the count leaves
// pending (every later admission or borrow may use it) and Unborrow
// reports ok and not folded. If the borrow was folded into a bucket, it
// reports that bucket's start (the caller takes the count out of it); if
// it lapsed, it reports start itself, a bucket never made (the caller
// corrects what lapse was given).
// It reports not ok for a borrow it does not know (not BorrowAt's: only
// those keep their record until settled).
func (o *Occupiable[T]) Unborrow(start, n int64) (into int64, folded, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.future == nil {
		return 0, false, false
	}
	f := &o.future[o.indexOf(start)]
	if f.start != start {
		return 0, false, false
	}
	f.claims = max(f.claims-n, 0)
	switch {
	case f.n >= n: // folding moves a slot's whole count at once
		f.n -= n
		o.pending.Sub(n)
		return 0, false, true
	case f.folded >= n:
		f.folded -= n
		return f.into, true, true
	case f.lapsed >= n:
		f.lapsed -= n
		return f.start, true, true
	}
	return 0, false, false
}

// fits reports whether adding n at future bucket s keeps every window that
// contains s within threshold. Windows are checked at each bucket start from
// s on; within a bucket the set of buckets in the window does not change.
// Called with mu held.
func (o *Occupiable[T]) fits(s, n, threshold int64) bool {
	for j := int64(0); j < o.n; j++ {
		t := s + j*o.bucketLen
		total := n
		for w := range o.Within(t, o.interval) {
			total += o.count(&w.Value)
		}
		// Every unfolded borrow due by t counts: it lands in a bucket at or
		// before t (late ones fold into the next bucket made).
		for _, f := range o.future {
			if f.n > 0 && f.start <= t {
				total += f.n
			}
		}
		if total > threshold {
			return false
		}
	}
	return true
}
