package keytable

import (
	"math"
	"math/bits"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/pace"
)

// ghosts remembers what active keys had when they were evicted, key by
// key, so that a key evicted and seen again starts from its own counts
// (Window) or timeline (Pace), and a key never seen starts from nothing,
// whatever other keys did: no key's eviction can make another key
// stricter, so a flood of keys shuts no one out.
//
// It is a hash table of ghostWays-slot buckets, a key in the emptier of
// its two; a slot is a key's first hash (which no caller can steer) and
// its window, 28 bytes. It holds ghostsPer2Keys/2 slots per key the table
// tracks: while at most 4 x MaxKeys active keys are evicted per window,
// their ghosts fit. A ghost whose window is over (or whose timeline is a
// second past) is free; when both buckets are full of live ones, the one
// whose key gains least by it goes (see worth), and is counted (see
// Table.CountForgotten): that key, seen again, starts afresh.
//
// A key's ghost is written when it is evicted and taken when it comes
// back, both under the locks of the key's two sets, so they never race
// for one key; keys that share a bucket take its lock.
type ghosts struct {
	slots   []ghost // buckets x ghostWays
	buckets uint64
	locks   [ghostLocks]paddedMutex
}

// ghost is an evicted key's state: its first hash (0: free), and for
// Window its newest bucket's index (low 32 bits) and counts by slot; for
// Pace its timeline head in n[0] and n[1]. Seven 32-bit words.
type ghost struct {
	hlo, hhi uint32
	head     uint32
	n        [Buckets]uint32
}

const (
	ghostWays      = 8
	ghostLocks     = 64
	ghostsPer2Keys = 11
)

// newGhosts sizes the ghosts for a table of maxKeys.
func newGhosts(maxKeys int) *ghosts {
	nb := uint64(max(maxKeys*ghostsPer2Keys/(2*ghostWays), 8))
	return &ghosts{slots: make([]ghost, nb*ghostWays), buckets: nb}
}

func (x *ghost) hash() uint64 { return uint64(x.hlo) | uint64(x.hhi)<<32 }

// place returns the buckets of a key of first hash h (by bits other than
// those that chose its sets).
func (g *ghosts) place(h uint64) (a, b uint64) {
	h = bits.RotateLeft64(h, 17)
	return uint64(uint32(h)) * g.buckets >> 32, (h >> 32) * g.buckets >> 32
}

// lock locks buckets a and b in one order and returns the unlock.
func (g *ghosts) lock(a, b uint64) func() {
	la, lb := a%ghostLocks, b%ghostLocks
	if la == lb {
		g.locks[la].Lock()
		return g.locks[la].Unlock
	}
	if la > lb {
		la, lb = lb, la
	}
	g.locks[la].Lock()
	g.locks[lb].Lock()
	return func() {
		g.locks[lb].Unlock()
		g.locks[la].Unlock()
	}
}

func (g *ghosts) bucket(i uint64) []ghost { return g.slots[i*ghostWays : (i+1)*ghostWays] }

// ends is when ghost x stops mattering, in the unit of now: a Window
// ghost's bucket after its window (now is a bucket index), a Pace ghost's
// head plus a second (now in ns). At or below now, the slot is free.
func ends(kind Kind, x *ghost, now int64) int64 {
	if x.hlo|x.hhi == 0 {
		return math.MinInt64
	}
	if kind == Pace {
		return x.timeline() + int64(time.Second)
	}
	return x.headNear(now) + Buckets
}

// worth is how much ghost x's key would gain, forgotten at now: below 0
// nothing (free, or no longer mattering). A Window key gains at most
// what its window held, so the smallest count goes first (the earliest
// to end among equals); a Pace key gains the least the earliest its
// timeline is.
func worth(kind Kind, x *ghost, now int64) int64 {
	e := ends(kind, x, now)
	if e <= now {
		return -1
	}
	if kind == Pace {
		return e - now
	}
	var sum int64
	for _, n := range x.n {
		sum += int64(n)
	}
	return sum<<8 | (e - now) // e - now is at most Buckets
}

// headNear is a Window ghost's newest bucket, from its low 32 bits and a
// bucket index within 2^31 of it.
func (x *ghost) headNear(b int64) int64 { return b - int64(int32(uint32(b)-x.head)) }

func (x *ghost) timeline() int64 { return int64(uint64(x.n[0]) | uint64(x.n[1])<<32) }

func (x *ghost) setTimeline(at int64) { x.n[0], x.n[1] = uint32(at), uint32(uint64(at)>>32) }

// put remembers x for the key of first hash h at now (a bucket index for
// Window, ns for Pace). It reports whether it forgot a live ghost of
// another key to make room.
func (g *ghosts) put(kind Kind, h uint64, x ghost, now int64) (forgot bool) {
	a, b := g.place(h)
	x.hlo, x.hhi = uint32(h), uint32(h>>32)
	defer g.lock(a, b)()
	free := [2]int{}
	for k, bi := range [2]uint64{a, b} {
		for i := range g.bucket(bi) {
			s := &g.bucket(bi)[i]
			if s.hash() == h {
				*s = x // the key's own, older
				return false
			}
			if ends(kind, s, now) <= now {
				free[k]++
			}
		}
	}
	// The emptier bucket; in it, a free slot, else the ghost whose key
	// gains least.
	bi := a
	if free[1] > free[0] {
		bi = b
	}
	var victim *ghost
	best := int64(math.MaxInt64)
	for i := range g.bucket(bi) {
		s := &g.bucket(bi)[i]
		if w := worth(kind, s, now); w < best {
			victim, best = s, w
		}
	}
	*victim = x
	return best >= 0
}

// take removes the ghost of the key of first hash h and returns it.
func (g *ghosts) take(h uint64) (ghost, bool) {
	a, b := g.place(h)
	defer g.lock(a, b)()
	for _, bi := range [2]uint64{a, b} {
		for i := range g.bucket(bi) {
			if s := &g.bucket(bi)[i]; s.hash() == h {
				x := *s
				*s = ghost{}
				return x, true
			}
		}
	}
	return ghost{}, false
}

// each calls fn with every slot in use, under its bucket's lock (load
// time).
func (g *ghosts) each(fn func(x *ghost)) {
	for bi := range g.buckets {
		unlock := g.lock(bi, bi)
		for i := range g.bucket(bi) {
			if s := &g.bucket(bi)[i]; s.hlo|s.hhi != 0 {
				fn(s)
			}
		}
		unlock()
	}
}

// ghostOf is the ghost of carry c.
func ghostOf(c carry) ghost {
	x := ghost{head: uint32(c.head)}
	for s := range Buckets {
		x.n[s] = c.counts[s]
	}
	return x
}

// carryAt is a Window ghost's carry for the window whose newest bucket is
// b, or its own newest if later (a ghost written on a clock read a little
// ahead of ours).
func (x *ghost) carryAt(b int64) carry {
	head := x.headNear(b)
	c := carry{head: head}
	for s := range Buckets {
		c.counts[s] = x.n[s]
	}
	if b <= head {
		return c
	}
	out := carry{head: b}
	for y := b - Buckets + 1; y <= head; y++ {
		out.counts[slotOf(y)] = c.at(y)
	}
	return out
}

// moveFrom moves the ghosts of old, a table's that t replaces, into g
// (load time): conv, if not nil, turns each into the new table's window.
// Ghosts that no longer matter at now are left behind.
func (g *ghosts) moveFrom(old *ghosts, kind Kind, now int64, conv func(ghost) ghost) {
	old.each(func(x *ghost) {
		y := *x
		if conv != nil {
			y = conv(y)
		}
		if ends(kind, &y, now) > now {
			g.put(kind, x.hash(), y, now)
		}
		*x = ghost{}
	})
}

// copy is a copy of g (load time).
func (g *ghosts) copy() *ghosts {
	out := &ghosts{slots: make([]ghost, len(g.slots)), buckets: g.buckets}
	for bi := range g.buckets {
		unlock := g.lock(bi, bi)
		copy(out.bucket(bi), g.bucket(bi))
		unlock()
	}
	return out
}

// rescaleTimelines rescales every Pace ghost's timeline (see pace.Rescale).
func (g *ghosts) rescaleTimelines(now int64, ratio float64) {
	g.each(func(x *ghost) {
		head := atomic.NewInt64(x.timeline())
		pace.Rescale(head, now, ratio)
		x.setTimeline(head.Load())
	})
}
