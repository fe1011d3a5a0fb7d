package window

import (
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/ring"
)

// Reserve atomically admits n against threshold: it counts n as Pass in the
// current bucket if and only if the window's passes, plus everything
// borrowed and not yet folded, plus n stay at or below threshold. It never
// lets any window exceed threshold, at any concurrency; under a race it can
// only err towards refusing. The refused path writes nothing shared, but
// the sweep of unused leases (reclaim) once per spread of them.
func (w *Window) Reserve(now, n, threshold int64) bool {
	_, ok := w.AdmitOn(cpu.Pin(), max(now, 0), n, threshold)
	return ok
}

// Reservation is an admission made by Admit, or, when refused, what the
// window held.
type Reservation struct {
	w *Window
	b *ring.WindowWrap[bucket] // nil when refused
	// start is b's start when it counted the admission: b may be reused
	// later (see Generations).
	start int64
	// n is the count admitted, with the index of its stripe from bit
	// stripeShift up, or for a refusal the count seen. (Four words: a
	// larger struct is no longer kept in registers, and every admission
	// would pay for copies through memory.)
	n int64
}

// stripeShift is where a Reservation's n keeps its stripe's index: above
// any count (MaxCount), below the sign.
const stripeShift = 56

// Every stripe index fits above stripeShift, and every count below it.
var (
	_ [1<<(63-stripeShift) - cpu.MaxStripes]struct{}
	_ [1<<stripeShift - MaxCount]struct{}
)

// count returns the count r admitted.
func (r *Reservation) count() int64 { return r.n & (1<<stripeShift - 1) }

// stripe returns the stripe r counted on.
func (r *Reservation) stripe() *stripe { return &r.b.Value.stripes[r.n>>stripeShift] }

// Start returns the start of the bucket the admission was counted in. A
// caller whose now was behind the newest bucket was counted there (see
// leaparray on clamping); max(now, Start()) is when its pass happened.
// Zero when refused.
func (r Reservation) Start() int64 { return r.start }

// Holds reports whether the admission's bucket holds instant t: the
// admission counts at t in its window.
func (r Reservation) Holds(t int64) bool {
	return r.b != nil && t >= r.start && t < r.start+r.w.arr.BucketLen()
}

// Held reports whether r holds an admission (not refused, not cancelled).
func (r Reservation) Held() bool { return r.b != nil }

// Seen returns, for a refused admission, the window's committed count that
// refused it: passes, leases not yet used, and borrowed admissions. It costs
// the refusal nothing more.
func (r Reservation) Seen() int64 {
	if r.b != nil {
		return 0
	}
	return r.n
}

// Cancel gives the admission back (a later check refused the request) and
// clears r; cancelling the zero Reservation does nothing. A copy cancelled
// again would give the admission back twice: flow never copies one, and
// package metric's Reservation has no Cancel. The admission goes back to
// its bucket, for any stripe to admit against, unless a request on its
// stripe took it meanwhile: left in the stripe's lease, only that
// stripe's requests could use it, and a window of a small threshold would
// refuse callers within it. Once the bucket froze, it comes off its frozen
// count; once it retired, off its hand-over.
func (r *Reservation) Cancel() {
	if r.b == nil {
		return
	}
	n := r.count()
	// The generation of the bucket's life that counted it: a reuse hides
	// the bucket's start before it moves to the next generation, so a
	// start read after the generation that is still r's dates it.
	g := r.b.Value.gen.Load()
	if r.b.Start() != r.start {
		// Reused since: what it counted was handed over.
		r.w.corrected(r.start, n)
		*r = Reservation{}
		return
	}
	s := r.stripe()
	if r.w.takeBack(r.b, &s.c[stripeUsed], r.start, g, n) {
		unlease(r.b, s, g, n)
	}
	*r = Reservation{}
}

// unlease gives n unused tokens of stripe s's lease in generation g back
// to bucket b, unless requests on s use them meanwhile: the stripe's lease
// shrinks first, and if what its requests used no longer fits (or the
// bucket froze: its used word is sealed), it grows back and keeps them. A
// request on s that finds the lease short in between takes a lease of its
// own. Nothing is given back once the bucket was reused: its budget went
// with its generation.
func unlease(b *ring.WindowWrap[bucket], s *stripe, g, n int64) {
	taken, used := &s.c[stripeTaken], &s.c[stripeUsed]
	for {
		t := taken.Load()
		if !inGen(t, g) {
			return
		}
		if !taken.CompareAndSwap(t, t-n) {
			continue
		}
		// Both words of generation g: their values compare as counts, and
		// a sealed used word is above any lease.
		if used.Load() <= t-n {
			addIn(&b.Value.granted, g, -n)
			return
		}
		addIn(taken, g, n)
		return
	}
}

// Admit is Reserve returning the admission: the bucket it was counted in,
// or for a refusal what the window held.
func (w *Window) Admit(now, n, threshold int64) (Reservation, bool) {
	return w.AdmitOn(cpu.Pin(), max(now, 0), n, threshold)
}

// maxLease caps one lease; leases are also at most 1/(leaseShare x stripes)
// of the room left, which bounds what idle stripes can strand in a bucket
// to 1/leaseShare of the threshold.
const (
	maxLease   = 1 << 16
	leaseShare = 16
)

// AdmitOn is Admit with a stripe hint (see AddOn), for a now of 0 or more
// (Admit and Reserve clamp it; flow's engine time never is below). It does
// the common cases straight (the stripe's lease covers n in the newest
// bucket, or no lease is left and the window refuses) and leaves every
// other to admitSlow.
func (w *Window) AdmitOn(p int, now, n, threshold int64) (Reservation, bool) {
	a := &w.arr
	b := a.Head()
	// The generation before the start: a start that is still the same
	// after a write then dates the generation written in (a reuse hides
	// the start before it moves to the next generation).
	g := b.Value.gen.Load()
	start := b.Start()
	// now in the newest bucket, or behind it (clamped to it). n > threshold refuses on the slow path; a threshold
	// above MaxCount needs no cap here, no lease being that large.
	if now < start+a.BucketLen() && n > 0 && n <= threshold {
		i := p & int(b.Value.mask)
		s := &b.Value.stripes[i]
		used, taken := &s.c[stripeUsed], &s.c[stripeTaken]
		// Admitted iff used stays within taken after our add and the
		// bucket is still the newest, in the generation we read (a
		// rotation sums this bucket's passes after publishing the next;
		// a reuse gives it a later start). A frozen bucket's used word is
		// sealed, and a reused one's of another generation: inGen fails.
		if u := used.Load(); inGen(u, g) {
			if u+n > taken.Load() {
				// The lease is short: take one, or refuse (a refusal is
				// this and no more).
				seen, ok := w.lease(b, s, start, g, n, min(threshold, MaxCount))
				if !ok {
					return Reservation{n: seen}, false
				}
			} else if used.CompareAndSwap(u, u+n) {
				if u+n <= taken.Load() && a.Newest(b) && b.Start() == start {
					return Reservation{w: w, b: b, start: start, n: n | int64(i)<<stripeShift}, true
				}
				w.takeBack(b, used, start, g, n)
			}
		}
	}
	return w.admitSlow(p, now, n, threshold)
}

// admitSlow is AdmitOn past its fast path: a rotation to make, a lease to
// take, a lost race to retry, or a refusal.
func (w *Window) admitSlow(p int, now, n, threshold int64) (Reservation, bool) {
	threshold = min(threshold, MaxCount)
	if n <= 0 || n > threshold {
		return Reservation{}, false
	}
	now = max(now, 0)
	a := &w.arr
	for {
		b, g, start := w.holding(now)
		i := p & int(b.Value.mask)
		s := &b.Value.stripes[i]
		used, taken := &s.c[stripeUsed], &s.c[stripeTaken]
		// The fast path again (see AdmitOn), retried on a lost race.
		if u := used.Load(); inGen(u, g) {
			if u+n <= taken.Load() {
				if !used.CompareAndSwap(u, u+n) {
					continue
				}
				if u+n <= taken.Load() && a.Newest(b) && b.Start() == start {
					return Reservation{w: w, b: b, start: start, n: n | int64(i)<<stripeShift}, true
				}
				w.takeBack(b, used, start, g, n)
				if !a.Newest(b) || b.Start() != start {
					continue
				}
			}
		} else if !a.Newest(b) || b.Start() != start {
			continue // frozen or reused: retry on the newest bucket
		}
		if seen, ok := w.lease(b, s, start, g, n, threshold); !ok {
			return Reservation{n: seen}, false
		}
		// The stripe holds a fresh lease; take n from it.
	}
}

// lease moves at least n tokens from bucket b's budget to stripe s, if the
// window has room, in generation g of b (start its start then). When it has
// none it reports false and what it held.
func (w *Window) lease(b *ring.WindowWrap[bucket], s *stripe, start, g, n, threshold int64) (int64, bool) {
	// A full window's refusal first, straight: the base known, no sweep of
	// leases due (see leaseSlow).
	a := &w.arr
	if base := b.Value.base.Load(); base >= 0 {
		if gr := b.Value.granted.Load(); inGen(gr, g) {
			// The mark read after the counts, as leaseSlow does.
			if room := threshold - base - countOf(gr) - b.Value.directSum() - a.Pending(); room < n && !b.Value.spread.Load() {
				return threshold - room, !a.Newest(b) || b.Start() != start
			}
		}
	}
	return w.leaseSlow(b, s, start, g, n, threshold)
}

// leaseSlow is lease past a refusal it could make at once.
func (w *Window) leaseSlow(b *ring.WindowWrap[bucket], s *stripe, start, g, n, threshold int64) (int64, bool) {
	a := &w.arr
	for {
		base := b.Value.base.Load()
		for base < 0 {
			// First lease in this bucket: sum the rest of its window once.
			// Only for the life the caller read and only once it is the
			// newest: from then on the rest of its window gains no pass. A
			// caller that loaded the bucket before a reuse would sum the
			// next life's window while the bucket before it still admits.
			if baseStart(base) != start || !a.Newest(b) || b.Start() != start {
				return 0, true // the caller moves to the newest bucket
			}
			// Never below zero: a negative base reads as unknown (and
			// passes taken back in a later bucket than they were added
			// in can leave the rest of a window below zero).
			v := max(w.passExcept(start, b), 0)
			if b.Value.base.CompareAndSwap(base, v) {
				base = v
			} else {
				base = b.Value.base.Load()
			}
		}
		epoch := a.Epoch()
		var l int64
		for {
			gr := b.Value.granted.Load()
			if !inGen(gr, g) {
				return 0, true // reused: the caller moves to the newest bucket
			}
			room := threshold - base - countOf(gr) - b.Value.directSum() - a.Pending()
			if room < n {
				if b.Value.spread.Load() && w.reclaim(b, g) {
					continue // the leases' unused tokens are the bucket's again
				}
				// No room; unless a rotation made b old, when the caller
				// retries on the newest bucket.
				return threshold - room, !a.Newest(b) || b.Start() != start
			}
			l = min(max(n, room/(leaseShare*int64(len(b.Value.stripes)))), max(n, maxLease))
			if b.Value.granted.CompareAndSwap(gr, gr+l) {
				break
			}
			// Lost to another lease on this bucket; re-read and re-check.
		}
		// A borrow that started after our epoch load may have summed the
		// counts without our lease; a rotation may have summed this bucket
		// without it. Either way give it back and decide again.
		if a.Epoch() == epoch && a.Newest(b) && b.Start() == start {
			if !addIn(&s.c[stripeTaken], g, l) {
				return 0, true // reused meanwhile, its budget gone with it
			}
			// After the lease is the stripe's: a sweep that clears the
			// mark first sees it.
			if l > n && !b.Value.spread.Load() {
				b.Value.spread.Store(true)
			}
			return 0, true
		}
		addIn(&b.Value.granted, g, -l)
		if !a.Newest(b) || b.Start() != start {
			return 0, true // the caller moves to the newest bucket
		}
	}
}

// reclaim gives back to bucket b the tokens that stripes hold leased and
// unused in generation g, unless their requests use them meanwhile (see
// unlease), for a request that found no room: a caller whose goroutine
// moved to another P would otherwise be refused while its old P's stripe
// holds what the window has left. It reports whether it swept (once per
// spread of leases, so that a full window's refusals stay one load).
func (w *Window) reclaim(b *ring.WindowWrap[bucket], g int64) bool {
	if !b.Value.spread.CompareAndSwap(true, false) {
		return false
	}
	if b.Value.gen.Load() != g {
		// The mark was the next generation's: leave it set.
		b.Value.spread.Store(true)
		return false
	}
	for i := range b.Value.stripes {
		s := &b.Value.stripes[i]
		t, u := s.c[stripeTaken].Load(), s.c[stripeUsed].Load()
		if spare := t - u; inGen(t, g) && inGen(u, g) && spare > 0 {
			unlease(b, s, g, spare)
		}
	}
	return true
}

// passExcept sums Pass over the buckets valid at now, skipping b.
func (w *Window) passExcept(now int64, b *ring.WindowWrap[bucket]) int64 {
	var sum int64
	for x := range w.arr.Within(now, w.arr.Interval()) {
		if x != b {
			sum += x.Value.passes()
		}
	}
	return sum
}

// Borrow admits n against the earliest future bucket that starts within
// maxWait of now and keeps every window containing it at or below threshold.
// It returns how long the caller must wait for that bucket to start; the
// admission is folded into the bucket as Pass and OccupiedPass when it
// becomes current.
func (w *Window) Borrow(now, n, threshold int64, maxWait time.Duration) (time.Duration, bool) {
	wait, ok := w.arr.Borrow(now, n, min(threshold, MaxCount), int64(maxWait))
	return time.Duration(wait), ok
}

// BorrowAt is Borrow that also returns the start of the bucket borrowed
// from, for Unborrow.
func (w *Window) BorrowAt(now, n, threshold int64, maxWait time.Duration) (start int64, wait time.Duration, ok bool) {
	start, d, ok := w.arr.BorrowAt(now, n, min(threshold, MaxCount), int64(maxWait))
	return start, time.Duration(d), ok
}

// AdmitAt admits n for a caller that arrives at instant at (at >= now,
// within a window of now: a caller that waits): in the bucket holding now
// if at falls in it (AdmitOn, the reservation returned), else against the
// later bucket holding at and no other (a borrow of that bucket, whose
// start is returned for Unborrow). Either way the admission is counted in
// the bucket of its arrival.
func (w *Window) AdmitAt(p int, now, at, n, threshold int64) (r Reservation, start int64, borrowed, ok bool) {
	now = max(now, 0)
	threshold = min(threshold, MaxCount)
	a := &w.arr
	bl := a.BucketLen()
	for range 2 {
		cur := a.Clamp(now)
		cur -= cur % bl
		if at < cur+bl {
			r, ok = w.AdmitOn(p, now, n, threshold)
			return r, 0, false, ok
		}
		s := at - at%bl
		start, _, ok = a.BorrowFrom(now, s, n, threshold, s-now)
		if !ok || start == s {
			return Reservation{}, s, true, ok
		}
		// Bucket s was made meanwhile (the borrow went past it): give
		// that one back and admit in s, now current.
		w.Unborrow(start, n)
	}
	return Reservation{}, 0, false, false
}

// Unborrow gives back n admissions that BorrowAt granted from the bucket
// starting at start (the caller stopped waiting): taken out of what is
// borrowed if no bucket at or after start has been made, else out of the
// passes and occupied passes of the bucket the borrow was folded into
// (the bucket at start, or the next one made if no request made that
// one); once that bucket has left the ring, the correction follows its
// handed-over counts. The record of a grant is kept until its borrower
// settles (Unborrow or Arrived), so a later borrow of a bucket a window on
// cannot take it meanwhile. Each grant must be settled exactly once. It
// reports whether the borrow had been folded (counted in the window's
// passes until now).
func (w *Window) Unborrow(start, n int64) (folded bool) {
	s, folded, ok := w.arr.Unborrow(start, n)
	if !ok || !folded {
		return false
	}
	var into *ring.WindowWrap[bucket]
	for b := range w.arr.Buckets(s, s+1) {
		into = b
	}
	var g int64
	if into != nil {
		g = into.Value.gen.Load()
		if into.Start() != s {
			into = nil // reused since: its counts were handed over
		}
	}
	if into == nil {
		// The bucket left the ring, its counts handed over: the
		// correction follows them.
		if w.handover != nil {
			w.handover(s, Counts{Pass: -n, Occupied: -n, MinRT: -1})
		}
		return true
	}
	// Folded on stripe 0 (see NewWindow's fold), which took a lease of n
	// and used it: undo all three. The lease first, so that no admission
	// on the stripe takes the pass's place in it meanwhile; then the pass
	// (out of the frozen passes if a newer bucket froze this one); then
	// the grant, so the room is the bucket's again, not the stripe's.
	// Each in the generation read: once the bucket is reused, what it
	// counted was handed over, and the correction follows.
	s0 := &into.Value.stripes[0]
	addIn(&s0.c[stripeTaken], g, -n)
	w.takeBack(into, &s0.c[stripeUsed], s, g, n)
	addIn(&into.Value.granted, g, -n)
	if !addIn(&into.Value.occupied, g, -n) && w.handover != nil {
		// Already handed over: the correction follows it.
		w.handover(s, Counts{Occupied: -n, MinRT: -1})
	}
	return true
}

// Land makes the bucket holding now, if it is not made, folding into it
// every borrow due by then. A request that waited for the bucket it
// borrowed from calls it on arrival, so that its admission counts in its
// own bucket (statistics, and the windows holding it), not late in the
// next bucket some other request makes.
func (w *Window) Land(now int64) {
	if a := &w.arr; now >= a.Head().Start()+a.BucketLen() {
		a.Current(now)
	}
}

// Arrived settles n admissions BorrowAt granted from the bucket starting
// at start, once the borrower went: every BorrowAt grant ends in Unborrow
// or Arrived.
func (w *Window) Arrived(start, n int64) { w.arr.Arrived(start, n) }

// Borrows calls fn with every count borrowed and not yet folded into its
// bucket, and that bucket's start.
func (w *Window) Borrows(fn func(start, n int64)) { w.arr.Borrows(fn) }

// Lend records n passes that another window admitted for instant at, a
// later bucket of this one, as borrowed from it: they fold into it when it
// is made, and every admission counts them until then (as borrowed). It
// reports false when that bucket is made already or its record is taken:
// the caller counts them otherwise.
func (w *Window) Lend(at, n int64) bool { return w.arr.Lend(at, n) }

// Borrowed returns the count borrowed from future buckets and not yet folded
// into a current one.
func (w *Window) Borrowed() int64 { return w.arr.Pending() }

// RoomIn returns how long after now the window, taking no more admissions,
// first holds at most threshold - n (room for a request of n), and how
// long until everything it holds now has left it. It reports false when
// no wait gives room: n is over the threshold, or borrowed admissions
// alone fill it. It reads the buckets once and allocates nothing.
func (w *Window) RoomIn(now, n, threshold int64) (wait, reset time.Duration, ok bool) {
	a := &w.arr
	real := max(now, 0) // waits run from here, even behind the newest bucket
	now = a.Clamp(real)
	span := a.Interval()
	// The buckets in the window, oldest first: at most the sample count.
	var starts, counts [maxRoomBuckets]int64
	k := 0
	var total int64
	for x := range a.WithinOldestFirst(now) {
		if k == len(starts) {
			// More buckets than this reads: the wait until all of them
			// have left is an upper bound.
			all := time.Duration(max(a.Head().Start()+span-real, 0))
			return all, all, n <= threshold && a.Pending()+n <= threshold
		}
		// A live bucket's passes are at most what it committed (leases
		// cover every admission): reading that, one shared word, keeps
		// the block path off the stripes the other cores write.
		c := x.Value.committed()
		if x.Value.frozen.Load() {
			c = max(x.Value.passes(), c)
		}
		starts[k], counts[k] = x.Start(), c
		total += c
		k++
	}
	pending := a.Pending()
	if n > threshold || pending+n > threshold {
		return 0, 0, false
	}
	if k > 0 {
		reset = time.Duration(starts[k-1] + span - real)
	}
	held := total + pending
	for i := 0; held+n > threshold && i < k; i++ {
		held -= counts[i]
		wait = time.Duration(starts[i] + span - real)
	}
	return max(wait, 0), max(reset, 0), true
}

// Held returns what the window holds at now (the passes in it and what
// waiting requests borrowed), and how long until all of it has left the
// window. Leases a stripe took and has not used are not held: admissions
// count them until a request that finds no room takes them back
// (reclaim), so Held may be below what refuses for an instant. It reads the buckets and their stripes once and
// allocates nothing.
func (w *Window) Held(now int64) (held int64, reset time.Duration) {
	a := &w.arr
	real := max(now, 0)
	now = a.Clamp(real)
	span := a.Interval()
	newest := int64(math.MinInt64)
	for x := range a.Within(now, span) {
		c := x.Value.passes()
		held += c
		if c > 0 {
			newest = max(newest, x.Start())
		}
	}
	if newest != math.MinInt64 {
		reset = time.Duration(max(newest+span-real, 0))
	}
	return held + a.Pending(), reset
}

// maxRoomBuckets bounds the buckets RoomIn sorts on the stack; a window of
// more answers with the time until all have left.
const maxRoomBuckets = 64

// RoomSince is RoomIn for a refusal at now, asked later: the same answer
// while no bucket newer than now's has been made (the buckets RoomIn read
// then are all still here, holding at least what they held). Once one has,
// the oldest may be gone, and it answers with the time from now until the
// newest bucket has left, for both: never shorter than RoomIn's answer at
// now. Borrowed admissions are read as they are when asked.
func (w *Window) RoomSince(now, n, threshold int64) (wait, reset time.Duration, ok bool) {
	a := &w.arr
	real := max(now, 0)
	if h := a.Head().Start(); h > real {
		all := time.Duration(max(h+a.Interval()-real, 0))
		return all, all, n <= threshold && a.Pending()+n <= threshold
	}
	return w.RoomIn(now, n, threshold)
}
