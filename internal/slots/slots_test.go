package slots

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/stat"
)

type owner struct{ name string }

func newNode(t testing.TB, name string) *stat.Node {
	t.Helper()
	n, err := stat.NewNode(name, stat.NodeConfig{})
	require.NoError(t, err)
	return n
}

// An admission is released once, whichever copy of its word comes first;
// the slot goes back to its ring for the next claim.
func TestReleaseOnceWhateverCopiesExit(t *testing.T) {
	o := &owner{"engine"}
	s := New(o)
	node := newNode(t, "api")
	sl, w := s.Claim(0, node, 1, false, nil, nil)
	assert.Same(t, o, sl.Owner())
	require.True(t, s.Release(sl, w, node, 1))
	assert.False(t, s.Release(sl, w, node, 1), "a copy of the Entry exits after it")
	sl2, w2 := s.Claim(0, node, 1, false, nil, nil)
	if sl2 == sl {
		assert.NotEqual(t, w, w2, "a later generation: the stale word cannot release it")
		assert.False(t, s.Release(sl, w, node, 1))
	}
	assert.True(t, s.Release(sl2, w2, node, 1))
}

// A Concurrency rule's admission (counted) gives its count back at
// release, once; a PerKey Concurrency one gives its key's back too.
func TestReleaseGivesBackWhatWasCounted(t *testing.T) {
	s := New(&owner{})
	node := newNode(t, "api")
	kt := keytable.New(keytable.Config{Kind: keytable.Conc, MaxKeys: 16, Now: func() int64 { return 0 }})
	st := kt.Get("k")
	_, ok, _ := st.Acquire(3, 10)
	require.True(t, ok)
	_, ok = node.AcquireConcurrency(3, 10)
	require.True(t, ok)
	sl, w := s.Claim(1, node, 3, true, st, kt)
	require.True(t, s.Release(sl, w, node, 3))
	assert.Zero(t, node.Concurrency())
	assert.Zero(t, st.InFlight())
	assert.False(t, s.Release(sl, w, node, 3))
	assert.Zero(t, node.Concurrency(), "not twice")
}

// When every slot near the ring's cursor is held (long admissions), claims
// come from the overflow list, and its slots are reused once released.
func TestClaimsOverflowWhenTheRingIsHeld(t *testing.T) {
	s := New(&owner{})
	node := newNode(t, "api")
	type held struct {
		sl *Slot[owner]
		w  uint64
	}
	var all []held
	for range 4 * ringSize {
		sl, w := s.Claim(0, node, 1, false, nil, nil)
		all = append(all, held{sl, w})
	}
	overflow := 0
	for _, h := range all {
		if h.sl.overflow {
			overflow++
		}
	}
	assert.Greater(t, overflow, 2*ringSize, "most claims past the ring's size overflow")
	for _, h := range all {
		require.True(t, s.Release(h.sl, h.w, node, 1))
	}
	n := len(s.all)
	for range overflow {
		sl, w := s.Claim(0, node, 1, false, nil, nil)
		defer s.Release(sl, w, node, 1)
	}
	assert.Equal(t, n, len(s.all), "overflow slots are reused, not made anew")
}

// The walk of a rule set that adds a Concurrency rule counts every
// admission in flight on its nodes once, and release gives it back.
func TestTrackCountsWhatIsInFlightOnce(t *testing.T) {
	s := New(&owner{})
	api, other := newNode(t, "api"), newNode(t, "other")
	sl, w := s.Claim(0, api, 2, false, nil, nil)
	sl2, w2 := s.Claim(1, other, 5, false, nil, nil)
	s.Track(map[*stat.Node]bool{api: true})
	s.Track(map[*stat.Node]bool{api: true})
	assert.Equal(t, int64(2), api.Concurrency(), "counted once")
	assert.Zero(t, other.Concurrency(), "not a target")
	require.True(t, s.Release(sl, w, api, 2))
	require.True(t, s.Release(sl2, w2, other, 5))
	assert.Zero(t, api.Concurrency())
	assert.Zero(t, other.Concurrency())
}

// halfClaim leaves behind a slot that an admission on prev held, then
// claims it with tag as a new holder would, before storing its node and
// count: the instant a rule load's walk can find.
func halfClaim(t *testing.T, s *Slots[owner], prev *stat.Node, tag uint64) (*Slot[owner], uint64) {
	t.Helper()
	sl, w := s.Claim(0, prev, 1, false, nil, nil)
	require.True(t, s.Release(sl, w, prev, 1)) // the slot remembers prev and a count of 1
	w = sl.word.Load()
	claimed := w&^slotFlags | slotHeld | tag<<tagShift
	require.True(t, sl.word.CompareAndSwap(w, claimed))
	return sl, claimed
}

// The walk can find a slot claimed whose holder has not yet stored its own
// node and count (they are the previous holder's): its tag tells, the walk
// leaves it, and the holder, seeing the new rules, counts itself.
func TestWalkLeavesAHalfClaimedSlot(t *testing.T) {
	s := New(&owner{})
	node := newNode(t, "api")
	sl, claimed := halfClaim(t, s, node, tagOf(node, 1000)) // for a count of 1000, not stored yet
	s.Track(map[*stat.Node]bool{node: true})
	assert.Zero(t, node.Concurrency(), "the walk left the slot")
	sl.n.Store(1000)
	w := s.Count(sl, claimed, node, 1000)
	assert.Equal(t, int64(1000), node.Concurrency(), "the holder counted itself")
	_, ok := node.AcquireConcurrency(1, 1000)
	assert.False(t, ok, "1000 in flight, limit 1000")
	require.True(t, s.Release(sl, w, node, 1000))
	assert.Zero(t, node.Concurrency())
}

// Should a tag match the stale fields anyway, the walk counts the previous
// holder's count; the holder counts its own too, and release gives back
// both.
func TestWalkOverAStaleSlotWithAMatchingTag(t *testing.T) {
	s := New(&owner{})
	node := newNode(t, "api")
	sl, claimed := halfClaim(t, s, node, tagOf(node, 1)) // as if tags collided
	s.Track(map[*stat.Node]bool{node: true})
	assert.Equal(t, int64(1), node.Concurrency(), "the walk counted the stale count")
	sl.n.Store(1000)
	w := s.Count(sl, claimed, node, 1000)
	assert.Equal(t, int64(1001), node.Concurrency(), "the holder counts its own")
	require.True(t, s.Release(sl, w, node, 1000))
	assert.Zero(t, node.Concurrency(), "both given back")
}

// An admission on one node whose slot still names another is not counted
// on that other by a walk, and a later walk of its own node counts it.
func TestStaleSlotIsCountedByALaterWalk(t *testing.T) {
	s := New(&owner{})
	y, z := newNode(t, "y"), newNode(t, "z")
	sl, claimed := halfClaim(t, s, z, tagOf(y, 1)) // claimed for y, fields still z
	s.Track(map[*stat.Node]bool{z: true})
	assert.Zero(t, z.Concurrency(), "not counted on z")
	sl.node.Store(y) // the holder stores its fields; z's walk is over
	s.Track(map[*stat.Node]bool{z: true, y: true})
	assert.Equal(t, int64(1), y.Concurrency(), "the later walk counts it on y")
	require.True(t, s.Release(sl, claimed, y, 1))
	assert.Zero(t, y.Concurrency())
}

// Claims and releases from many goroutines, with walks beside them: every
// admission is released exactly once and every count given back.
func TestHammerReleasesEachAdmissionOnce(t *testing.T) {
	s := New(&owner{})
	node := newNode(t, "api")
	const g, m = 16, 2000
	var wg sync.WaitGroup
	var double, missed sync.Map
	for i := range g {
		wg.Go(func() {
			for k := range m {
				sl, w := s.Claim(i, node, 1, false, nil, nil)
				if k%7 == 0 {
					s.Track(map[*stat.Node]bool{node: true})
				}
				if !s.Release(sl, w, node, 1) {
					missed.Store(i, k)
				}
				if s.Release(sl, w, node, 1) {
					double.Store(i, k)
				}
			}
		})
	}
	wg.Wait()
	empty := func(m *sync.Map) bool {
		n := 0
		m.Range(func(any, any) bool { n++; return true })
		return n == 0
	}
	assert.True(t, empty(&missed), "every first release succeeds")
	assert.True(t, empty(&double), "no second release succeeds")
	assert.Zero(t, node.Concurrency(), "what walks counted is given back")
}

// Claim and release allocate nothing once the rings exist.
func TestClaimAndReleaseAllocateNothing(t *testing.T) {
	s := New(&owner{})
	node := newNode(t, "api")
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		sl, w := s.Claim(0, node, 1, false, nil, nil)
		s.Release(sl, w, node, 1)
	}))
}

func BenchmarkClaimRelease(b *testing.B) {
	s := New(&owner{})
	node := newNode(b, "api")
	b.ReportAllocs()
	for b.Loop() {
		sl, w := s.Claim(0, node, 1, false, nil, nil)
		s.Release(sl, w, node, 1)
	}
}
