package keytable

import (
	"math"
	"math/bits"

	"sync"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/pace"
)

// ghosts remembers what active keys had when they were evicted, key by
// key, so that a key evicted and seen again starts from its own counts
// (Window) or timeline (Pace), and a key never seen starts from nothing,
// whatever other keys did: no key's eviction can make another key
// stricter, so a flood of keys shuts no one out.
//
// It is a hash table of buckets of ghostWays slots, a key in the emptier
// of its two buckets; a slot is a key's first hash (which no caller can
// steer) and its window, 28 bytes, the hashes of a bucket side by side so
// that a lookup reads two cache lines of them. It holds ghostsPer2Keys/2
// slots per key the table tracks at most: while at most 4 x MaxKeys active
// keys are evicted per window, their ghosts fit. It starts at an eighth of
// that and doubles whenever a ghost that matters would be forgotten, so a
// table that evicts now and then (two sets full of its four) costs little.
// A ghost whose window is over
// (or whose timeline is past by its rule's slowest slot) is free; when
// both buckets are full of live ones, the ghost whose key gains least by
// being forgotten goes, the one being put included (see worth), and is
// counted (see Table.CountForgotten): that key, seen again, starts
// afresh.
//
// A key's ghost is written when it is evicted, under the locks of the
// incoming key's sets (one of which holds the evicted key), and taken when
// it comes back, under the locks of its own two sets: both hold the lock
// of the set the key was in, so they never race for one key. Keys that
// share a bucket take its lock.
type ghosts struct {
	// grow is held to read or write buckets, and alone to replace them
	// by twice as many.
	grow    sync.RWMutex
	buckets []ghostBucket
	most    int // buckets at most
	locks   [ghostLocks]paddedMutex
}

// ghostBucket is ghostWays slots: each a key's first hash (0: free), and
// its ghost.
type ghostBucket struct {
	h [ghostWays]uint64
	x [ghostWays]ghost
}

// ghost is an evicted key's state: for Window its newest bucket's index
// (low 32 bits) and its counts by slot; for Pace its timeline head in n[0]
// and n[1]. Five 32-bit words.
type ghost struct {
	head uint32
	n    [Buckets]uint32
}

const (
	ghostWays      = 16
	ghostLocks     = 64
	ghostsPer2Keys = 11
)

// newGhosts makes the ghosts of a table of maxKeys.
func newGhosts(maxKeys int) *ghosts {
	most := maxKeys*ghostsPer2Keys/(2*ghostWays) + 4 // a little more for small tables
	return &ghosts{buckets: make([]ghostBucket, max(most/8, 4)), most: most}
}

// place returns the buckets of a key of first hash h (by bits other than
// those that chose its sets).
func (g *ghosts) place(h uint64) (a, b int) {
	h = bits.RotateLeft64(h, 17)
	n := uint64(len(g.buckets))
	return int(uint64(uint32(h)) * n >> 32), int((h >> 32) * n >> 32)
}

// lock locks buckets a and b in one order and returns the unlock.
func (g *ghosts) lock(a, b int) locked {
	la, lb := a%ghostLocks, b%ghostLocks
	if la == lb {
		g.locks[la].Lock()
		return locked{a: &g.locks[la]}
	}
	if la > lb {
		la, lb = lb, la
	}
	g.locks[la].Lock()
	g.locks[lb].Lock()
	return locked{&g.locks[la], &g.locks[lb]}
}

// life is how long after its timeline head a Pace ghost matters (ns): its
// rule's slowest slot (see Table.SetPaceLife); Window ghosts ignore it.
type life = int64

// ends is when ghost x stops mattering, in the unit of now: a Window
// ghost's bucket after its window (now is a bucket index), a Pace ghost's
// head plus its life (now in ns). At or below now, the slot is free. A
// Window ghost read more than a window ahead of now is stale (its 32-bit
// index wrapped, or a clock stepped back): free.
func ends(kind Kind, x *ghost, now int64, l life) int64 {
	if kind == Pace {
		return x.timeline() + l
	}
	h := x.headNear(now)
	if h > now+Buckets {
		return math.MinInt64
	}
	return h + Buckets
}

// worth is how much ghost x's key would gain, forgotten at now: below 0
// nothing by this clock (-1: a Window ghost whose window ended within the
// last window, kept while there is room for a request whose clock reads
// behind ours; -2: nothing at all). A Window key gains at most what its
// window held, so the smallest count goes first (the earliest to end
// among equals); a Pace key gains the least the earliest its timeline
// is.
func worth(kind Kind, x *ghost, now int64, l life) int64 {
	e := ends(kind, x, now, l)
	if e <= now {
		if kind == Window && e > now-Buckets {
			return -1
		}
		return -2
	}
	if kind == Pace {
		return e - now
	}
	var sum int64
	for _, n := range x.n {
		sum += int64(n)
	}
	return sum<<8 | (e - now) // e - now is at most 2 x Buckets
}

// headNear is a Window ghost's newest bucket, from its low 32 bits and a
// bucket index within 2^31 of it.
func (x *ghost) headNear(b int64) int64 { return b - int64(int32(uint32(b)-x.head)) }

func (x *ghost) timeline() int64 { return int64(uint64(x.n[0]) | uint64(x.n[1])<<32) }

func (x *ghost) setTimeline(at int64) { x.n[0], x.n[1] = uint32(at), uint32(uint64(at)>>32) }

// put remembers x for the key of first hash h at now (a bucket index for
// Window, ns for Pace). It reports whether a ghost that still mattered was
// forgotten for it: another key's, or x itself when every ghost in its
// buckets matters more.
func (g *ghosts) put(kind Kind, h uint64, x ghost, now int64, l life) (forgot bool) {
	for {
		forgot, full := g.tryPut(kind, h, x, now, l)
		if !full || !g.double(kind, now, l) {
			return forgot
		}
	}
}

// double makes the ghosts twice as many buckets, up to most, keeping the
// ghosts that matter (load in the request path, amortised: each doubling
// moves as many ghosts as there were puts since the last); false when
// they are at their most already.
func (g *ghosts) double(kind Kind, now int64, l life) bool {
	g.grow.Lock()
	defer g.grow.Unlock()
	if len(g.buckets) >= g.most {
		return false
	}
	old := g.buckets
	g.buckets = make([]ghostBucket, min(2*len(old), g.most))
	for bi := range old {
		bk := &old[bi]
		for i := range bk.h {
			if bk.h[i] != 0 && worth(kind, &bk.x[i], now, l) > -2 {
				g.putLocked(kind, bk.h[i], bk.x[i], now, l)
			}
		}
	}
	return true
}

// tryPut is put without growing: full reports that a ghost that matters
// would have been forgotten (and was not), so that the ghosts may grow.
func (g *ghosts) tryPut(kind Kind, h uint64, x ghost, now int64, l life) (forgot, full bool) {
	g.grow.RLock()
	defer g.grow.RUnlock()
	a, b := g.place(h)
	defer g.lock(a, b).unlock()
	if len(g.buckets) < g.most && g.wouldForget(kind, a, b, h, now, l) {
		return false, true
	}
	return g.putLocked(kind, h, x, now, l), false
}

// wouldForget reports whether putting a ghost of h in buckets a and b
// would forget one that matters: neither holds h nor a slot free by now.
func (g *ghosts) wouldForget(kind Kind, a, b int, h uint64, now int64, l life) bool {
	for _, bi := range [2]int{a, b} {
		bk := &g.buckets[bi]
		for i := range bk.h {
			if bk.h[i] == h || bk.h[i] == 0 || worth(kind, &bk.x[i], now, l) < 0 {
				return false
			}
		}
	}
	return true
}

// putLocked is put with the buckets' locks (or grow alone) held.
func (g *ghosts) putLocked(kind Kind, h uint64, x ghost, now int64, l life) (forgot bool) {
	a, b := g.place(h)
	free := [2]int{}
	for k, bi := range [2]int{a, b} {
		bk := &g.buckets[bi]
		for i := range bk.h {
			if bk.h[i] == h {
				bk.x[i] = x // the key's own, older
				return false
			}
			if bk.h[i] == 0 || ends(kind, &bk.x[i], now, l) <= now {
				free[k]++
			}
		}
	}
	// The emptier bucket; in it, a free slot, else the ghost whose key
	// gains least.
	bk := &g.buckets[a]
	if free[1] > free[0] {
		bk = &g.buckets[b]
	}
	victim, best := 0, int64(math.MaxInt64)
	for i := range bk.h {
		w := int64(-3)
		if bk.h[i] != 0 {
			w = worth(kind, &bk.x[i], now, l)
		}
		if w < best {
			victim, best = i, w
		}
	}
	if best >= 0 {
		if wx := worth(kind, &x, now, l); wx <= best {
			return wx >= 0 // x gains least: it goes
		}
	}
	bk.h[victim], bk.x[victim] = h, x
	return best >= 0
}

// take removes the ghost of the key of first hash h and returns it.
func (g *ghosts) take(h uint64) (ghost, bool) {
	g.grow.RLock()
	defer g.grow.RUnlock()
	a, b := g.place(h)
	defer g.lock(a, b).unlock()
	for _, bi := range [2]int{a, b} {
		bk := &g.buckets[bi]
		for i := range bk.h {
			if bk.h[i] == h {
				x := bk.x[i]
				bk.h[i], bk.x[i] = 0, ghost{}
				return x, true
			}
		}
	}
	return ghost{}, false
}

// each calls fn with every slot in use, under its bucket's lock (load
// time); fn may clear it (drop).
func (g *ghosts) each(fn func(h uint64, x *ghost) (drop bool)) {
	g.grow.RLock()
	defer g.grow.RUnlock()
	for bi := range g.buckets {
		held := g.lock(bi, bi)
		bk := &g.buckets[bi]
		for i := range bk.h {
			if bk.h[i] != 0 && fn(bk.h[i], &bk.x[i]) {
				bk.h[i], bk.x[i] = 0, ghost{}
			}
		}
		held.unlock()
	}
}

// ghostOf is the ghost of carry c.
func ghostOf(c carry) ghost {
	return ghost{head: uint32(c.head), n: c.counts}
}

// carryAt is a Window ghost's carry for the window whose newest bucket is
// b, or its own newest if later (a ghost written on a clock read a little
// ahead of ours).
func (x *ghost) carryAt(b int64) carry {
	c := carry{head: x.headNear(b), counts: x.n}
	if b <= c.head {
		return c
	}
	out := carry{head: b}
	for y := b - Buckets + 1; y <= c.head; y++ {
		out.counts[slotOf(y)] = c.at(y)
	}
	return out
}

// moveFrom moves the ghosts of old into g (load time): conv, if not nil,
// turns each into g's table's window; those that no longer matter at now
// are dropped. It returns how many that still mattered g forgot.
func (g *ghosts) moveFrom(old *ghosts, kind Kind, now int64, l life, conv func(ghost) ghost) (forgot int) {
	old.each(func(h uint64, x *ghost) bool {
		y := *x
		if conv != nil {
			y = conv(y)
		}
		if worth(kind, &y, now, l) > -2 && g.put(kind, h, y, now, l) {
			forgot++
		}
		return true
	})
	return forgot
}

// rescaleTimelines rescales every Pace ghost's timeline (see pace.Rescale).
func (g *ghosts) rescaleTimelines(now int64, ratio float64) {
	g.each(func(_ uint64, x *ghost) bool {
		head := atomic.NewInt64(x.timeline())
		pace.Rescale(head, now, ratio)
		x.setTimeline(head.Load())
		return false
	})
}
