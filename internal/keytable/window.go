package keytable

import "math"

// Buckets is the bucket count of a key's window, whatever the engine's
// sample count: any span shorter than 3/4 of the window admits at most the
// threshold, a whole window at most twice it (as a resource's default
// second window).
const Buckets = 4

// A window word is a bucket's epoch (its index, low bits above countBits)
// above its count.
const (
	countBits = 40
	countMask = 1<<countBits - 1
	epochMask = 1<<(64-countBits) - 1
)

func packBucket(b int64, count uint64) uint64 {
	return uint64(b)&epochMask<<countBits | count
}

func epochIs(w uint64, b int64) bool { return w>>countBits == uint64(b)&epochMask }

// newer reports whether w holds a bucket later than b (epochs compared
// modulo 2^24, so within 2^23 buckets of each other).
func newer(w uint64, b int64) bool {
	d := (w>>countBits - uint64(b)) & epochMask
	return d != 0 && d < 1<<(63-countBits)
}

// slotOf is bucket b's word (b may be negative: a clock near its origin).
func slotOf(b int64) int { return int(uint64(b) % Buckets) }

// carry is what the state's window holds at bucket now, bucket by bucket;
// false if nothing.
func (st *State) carry(now int64) (carry, bool) {
	head := st.head.Load()
	if head == noBucket || head+Buckets <= now {
		return carry{}, false
	}
	c := carry{head: head}
	var any bool
	for x := head - Buckets + 1; x <= head; x++ {
		if w := st.words[slotOf(x)].Load(); epochIs(w, x) && w&countMask > 0 {
			c.counts[slotOf(x)] = uint32(min(w&countMask, math.MaxUint32))
			any = true
		}
	}
	return c, any
}

// Held returns what a Window state's window holds at now and how long
// (ns) until all of it has left.
func (t *Table) Held(st *State, now int64) (held, reset int64) {
	head := st.head.Load()
	if head == noBucket {
		return 0, 0
	}
	b := max(now, 0) / t.bucketLen
	head = max(head, b)
	for j := range int64(Buckets) {
		x := head - j
		if w := st.words[slotOf(x)].Load(); epochIs(w, x) && w&countMask != 0 {
			if held == 0 {
				reset = max((x+Buckets)*t.bucketLen-now, 0)
			}
			held += int64(w & countMask)
		}
	}
	return held, reset
}

// sum is the count of the window whose newest bucket is head.
func (st *State) sum(head int64) uint64 {
	var c uint64
	if head == noBucket {
		return 0
	}
	for j := range int64(Buckets) {
		b := head - j
		if w := st.words[slotOf(b)].Load(); epochIs(w, b) {
			c += w & countMask
		}
	}
	return c
}

// Admit counts n in a Window state's window at now (ns) if its window
// stays at or below limit. It returns the bucket counted in (for Undo), or
// false and the count seen. dead reports that the state left the table:
// the caller looks the key up again.
//
// The check and the count are strict at any concurrency: the count is a
// compare-and-swap on the current bucket's word bounded by the sum of the
// window read before it, and a request that finds a newer bucket after its
// count takes it back and counts there. Only the newest bucket takes
// counts, so for any window the request counted last in it read every
// other count of that window first.
func (t *Table) Admit(st *State, now, n, limit int64) (b int64, seen int64, ok, dead bool) {
	if n > limit {
		return 0, 0, false, false
	}
	b = max(now, 0) / t.bucketLen
	for {
		h := st.head.Load()
		if b > h {
			if !st.head.CompareAndSwap(h, b) {
				continue
			}
			if b-h >= Buckets {
				st.clearOld(b)
			}
		} else {
			b = h // behind the newest bucket: count there
		}
		slot := &st.words[slotOf(b)]
		w := slot.Load()
		if !epochIs(w, b) {
			// A word of a later bucket means the head moved on since we
			// read it: count there. (With the head still at b, a word that
			// looks later is one so old its epoch wrapped.)
			if newer(w, b) && st.head.Load() != b {
				continue
			}
			if !slot.CompareAndSwap(w, packBucket(b, 0)) {
				continue
			}
			w = packBucket(b, 0)
		}
		sum := int64(w & countMask)
		for j := int64(1); j < Buckets; j++ {
			if x := st.words[slotOf(b-j)].Load(); epochIs(x, b-j) {
				sum += int64(x & countMask)
			}
		}
		if sum+n > limit {
			return 0, sum, false, st.dead.Load()
		}
		if !slot.CompareAndSwap(w, w+uint64(n)) {
			continue
		}
		if st.head.Load() != b {
			// A newer bucket began: count there instead.
			st.Undo(b, n)
			continue
		}
		if st.dead.Load() {
			st.Undo(b, n)
			return 0, 0, false, true
		}
		return b, 0, true, false
	}
}

// clearOld marks the buckets before b as empty ones of b's window after
// the key was idle for a window or more, so that no word older than that
// can pass for a current one (epochs are kept modulo 2^24). A word a newer
// bucket wrote meanwhile is left alone.
func (st *State) clearOld(b int64) {
	for j := int64(1); j < Buckets; j++ {
		e := b - j
		slot := &st.words[slotOf(e)]
		// Late (the head moved on meanwhile), leave every word alone; and
		// never touch a word of a later bucket.
		if w := slot.Load(); st.head.Load() == b && !epochIs(w, e) && !newer(w, e) {
			slot.CompareAndSwap(w, packBucket(e, 0))
		}
	}
}

// Undo takes back n that Admit counted in bucket b, unless the bucket
// left the window (its word holds a newer one).
func (st *State) Undo(b, n int64) {
	slot := &st.words[slotOf(b)]
	for {
		w := slot.Load()
		if !epochIs(w, b) || slot.CompareAndSwap(w, w-uint64(n)) {
			return
		}
	}
}

// RoomIn is a Window state's metric.Window.RoomIn: how long from now (ns)
// until it has room for n under limit, taking no more admissions, and
// until its newest bucket (now's, if later) has left it, when it is empty
// at the latest; both -1 when it never has room (n over limit).
func (t *Table) RoomIn(st *State, now, n, limit int64) (retry, reset int64) {
	if n > limit {
		return -1, -1
	}
	head := st.head.Load()
	if head == noBucket {
		return 0, 0
	}
	b := max(now, 0) / t.bucketLen
	head = max(head, b)
	held := int64(st.sum(head))
	reset = max((head+Buckets)*t.bucketLen-now, 0)
	// Oldest bucket first: each leaves the window Buckets after it.
	for x := head - Buckets + 1; held+n > limit && x <= head; x++ {
		if w := st.words[slotOf(x)].Load(); epochIs(w, x) {
			held -= int64(w & countMask)
		}
		retry = max((x+Buckets)*t.bucketLen-now, 0)
	}
	return retry, reset
}

// rebucket is carry c, of buckets of length from, as a carry of buckets of
// length to whose newest bucket is now's (see Table.Rewindow).
func rebucket(c carry, from, to, now int64) carry {
	nb := max(now, 0) / to
	if c.head*from > now {
		// Counted on a clock ahead of now (a small step back): its newest
		// bucket stays the newest, its counts as long as they would have.
		nb = ((c.head+1)*from - 1) / to
	}
	out := carry{head: nb}
	for x := c.head - Buckets + 1; x <= c.head; x++ {
		n := c.at(x)
		if n == 0 {
			continue
		}
		y := min(((x+1)*from-1)/to, nb)
		if y <= nb-Buckets {
			continue // the whole bucket is before the new window
		}
		s := &out.counts[slotOf(y)]
		*s = uint32(min(uint64(*s)+uint64(n), math.MaxUint32))
	}
	return out
}

// load sets a fresh state's window to carry c.
func (st *State) load(c carry) {
	st.head.Store(c.head)
	for x := c.head - Buckets + 1; x <= c.head; x++ {
		st.words[slotOf(x)].Store(packBucket(x, uint64(c.at(x))))
	}
}

// carry is a key's window at some bucket: counts by bucket slot for the
// buckets head-Buckets+1 to head.
type carry struct {
	head   int64
	counts [Buckets]uint32 // per-key limits fit: flow's maxKeyWindowCount
}

// at is the count carried in bucket x (0 outside the carry's window).
func (c *carry) at(x int64) uint32 {
	if x > c.head || x <= c.head-Buckets {
		return 0
	}
	return c.counts[slotOf(x)]
}
