package keytable

import "math"

// Buckets is the bucket count of a key's window, whatever the engine's
// sample count: any span shorter than 3/4 of the window admits at most the
// threshold, a whole window at most twice it (as a resource's default
// second window).
const Buckets = 4

// A window word is the tag of the life that wrote it (its top 8 bits, see
// Life.tag), a bucket's epoch (its index, low 24 bits) and its count (32
// bits: per-key limits fit, see carry). A word counts for a reader only
// in its own life: one of another life reads as empty.
const (
	countBits = 32
	tagBits   = 8
	countMask = 1<<countBits - 1
	epochBits = 64 - countBits - tagBits
	epochMask = 1<<epochBits - 1
)

// packBucket is bucket b's word holding count, in the life of tag (a
// Life.tag: in place above the epoch).
func packBucket(b int64, tag, count uint64) uint64 {
	return (tag|uint64(b)&epochMask)<<countBits | count
}

func epochIs(w uint64, b int64) bool { return w>>countBits&epochMask == uint64(b)&epochMask }

// ours reports whether w is bucket b's word in the life of tag.
func ours(w uint64, b int64, tag uint64) bool { return w>>countBits == tag|uint64(b)&epochMask }

// newer reports whether w holds a bucket later than b (epochs compared
// modulo 2^24, so within 2^23 buckets of each other), whatever its life.
func newer(w uint64, b int64) bool {
	d := (w>>countBits - uint64(b)) & epochMask
	return d != 0 && d < 1<<(epochBits-1)
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
	tag := st.Life().tag()
	for x := head - Buckets + 1; x <= head; x++ {
		if w := st.words[slotOf(x)].Load(); ours(w, x, tag) && w&countMask > 0 {
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
	tag := st.Life().tag()
	for j := range int64(Buckets) {
		x := head - j
		if w := st.words[slotOf(x)].Load(); ours(w, x, tag) && w&countMask != 0 {
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
	tag := st.Life().tag()
	for j := range int64(Buckets) {
		b := head - j
		if w := st.words[slotOf(b)].Load(); ours(w, b, tag) {
			c += w & countMask
		}
	}
	return c
}

// Admit counts n in a Window state found in life l, in its window at now
// (ns), if its window stays at or below limit. It returns the bucket
// counted in (for Undo), or false and the count seen. gone reports that
// the state left life l (evicted, or reused for another key): the caller
// looks the key up again.
//
// The check and the count are strict at any concurrency: the count is a
// compare-and-swap on the current bucket's word bounded by the sum of the
// window read before it, and a request that finds a newer bucket after its
// count takes it back and counts there. Only the newest bucket takes
// counts, so for any window the request counted last in it read every
// other count of that window first. A word of another life (a request
// that found the state in an earlier life wrote it, late) counts nothing
// and is written over.
func (t *Table) Admit(st *State, l Life, now, n, limit int64) (b int64, seen int64, ok, gone bool) {
	if n > limit {
		return 0, 0, false, false
	}
	tag := l.tag()
	b = max(now, 0) / t.bucketLen
	for {
		h := st.head.Load()
		if b > h {
			if !st.Alive(l) {
				return 0, 0, false, true // nor moves another life's head
			}
			if !st.head.CompareAndSwap(h, b) {
				continue
			}
			if b-h >= Buckets {
				st.clearOld(b, tag)
			}
		} else {
			b = h // behind the newest bucket: count there
		}
		slot := &st.words[slotOf(b)]
		w := slot.Load()
		if !ours(w, b, tag) {
			if !st.Alive(l) {
				return 0, 0, false, true
			}
			// A word of a later bucket means the head moved on since we
			// read it: count there. (With the head still at b, a word that
			// looks later is one so old its epoch wrapped, or one a late
			// request of an earlier life wrote.)
			if newer(w, b) && st.head.Load() != b {
				continue
			}
			if !slot.CompareAndSwap(w, packBucket(b, tag, 0)) {
				continue
			}
			w = packBucket(b, tag, 0)
		}
		sum := int64(w & countMask)
		for j := int64(1); j < Buckets; j++ {
			if x := st.words[slotOf(b-j)].Load(); ours(x, b-j, tag) {
				sum += int64(x & countMask)
			}
		}
		if sum+n > limit {
			return 0, sum, false, !st.Alive(l)
		}
		if !st.Alive(l) {
			// Left life l since its lookup: its words may be a later
			// life's of the same tag (256 lives on), not ours to count in.
			return 0, 0, false, true
		}
		if !slot.CompareAndSwap(w, w+uint64(n)) {
			continue
		}
		if st.head.Load() != b {
			// A newer bucket began: count there instead.
			st.Undo(b, l, n)
			continue
		}
		if !st.Alive(l) {
			// Evicted as we counted (its key's memory may hold the count:
			// stricter, never looser).
			st.Undo(b, l, n)
			return 0, 0, false, true
		}
		return b, 0, true, false
	}
}

// clearOld marks the buckets before b as empty ones of b's window after
// the key was idle for a window or more, so that no word older than that
// can pass for a current one (epochs are kept modulo 2^24). A word a newer
// bucket wrote meanwhile is left alone.
func (st *State) clearOld(b int64, tag uint64) {
	for j := int64(1); j < Buckets; j++ {
		e := b - j
		slot := &st.words[slotOf(e)]
		// Late (the head moved on meanwhile), leave every word alone; and
		// never touch a word of a later bucket.
		if w := slot.Load(); st.head.Load() == b && !epochIs(w, e) && !newer(w, e) {
			slot.CompareAndSwap(w, packBucket(e, tag, 0))
		}
	}
}

// Undo takes back n that Admit counted in bucket b in life l, unless the
// bucket left the window (its word holds a newer one) or the state was
// reused since (its counts are another key's).
func (st *State) Undo(b int64, l Life, n int64) {
	slot := &st.words[slotOf(b)]
	tag := l.tag()
	for {
		w := slot.Load()
		if !ours(w, b, tag) || st.Life()|dead != l|dead || slot.CompareAndSwap(w, w-uint64(n)) {
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
	tag := st.Life().tag()
	for x := head - Buckets + 1; held+n > limit && x <= head; x++ {
		if w := st.words[slotOf(x)].Load(); ours(w, x, tag) {
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

// load sets a fresh (or reused) state's window to carry c, its words in
// life l.
func (st *State) load(c carry, l Life) {
	st.head.Store(c.head)
	for x := c.head - Buckets + 1; x <= c.head; x++ {
		st.words[slotOf(x)].Store(packBucket(x, l.tag(), uint64(c.at(x))))
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
