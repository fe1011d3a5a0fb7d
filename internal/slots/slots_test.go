package slots

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/keytable"
)

type owner struct{ name string }

// An admission is released once, whichever copy of its word comes first;
// the slot goes back to its ring for the next claim.
func TestReleaseOnceWhateverCopiesExit(t *testing.T) {
	o := &owner{"engine"}
	s := New(o)
	sl, w := s.Claim(0, 1, false, nil, nil, nil)
	assert.Same(t, o, sl.Owner())
	assert.Equal(t, uint64(1), w&1, "a claim's word is odd")
	_, _, ok := s.Release(sl, w)
	require.True(t, ok)
	_, _, ok = s.Release(sl, w)
	assert.False(t, ok, "a copy of the Entry exits after it")
	sl2, w2 := s.Claim(0, 1, false, nil, nil, nil)
	if sl2 == sl {
		assert.NotEqual(t, w, w2, "a later generation: the stale word cannot release it")
		_, _, ok = s.Release(sl, w)
		assert.False(t, ok)
	}
	_, _, ok = s.Release(sl2, w2)
	assert.True(t, ok)
	assert.Same(t, o, Sentinel(o).Owner(), "a sentinel names its owner too")
}

// The word says whether the admission was counted in its node's
// concurrency, and the release returns the key state it was counted in,
// once.
func TestReleaseReturnsWhatWasCounted(t *testing.T) {
	s := New(&owner{})
	kt := keytable.New(keytable.Config{Kind: keytable.Conc, MaxKeys: 16, Now: func() int64 { return 0 }})
	st, _ := kt.Get("k")
	sl, w := s.Claim(1, 3, true, st, kt, nil)
	assert.True(t, Counted(w))
	n, p := sl.Holder()
	assert.Equal(t, [2]int32{3, 1}, [2]int32{n, p}, "the holder's count and stripe")
	kc, gotKt, ok := s.Release(sl, w)
	require.True(t, ok)
	assert.Same(t, st, kc)
	assert.Same(t, kt, gotKt)
	_, _, ok = s.Release(sl, w)
	assert.False(t, ok, "not twice")
	sl, w = s.Claim(1, 1, false, nil, nil, nil)
	assert.False(t, Counted(w))
	kc, _, ok = s.Release(sl, w)
	require.True(t, ok)
	assert.Nil(t, kc, "the next holder of a slot does not inherit its key")
}

// When every slot near the ring's cursor is held (long admissions), claims
// come from the overflow list, and its slots are reused once released.
func TestClaimsOverflowWhenTheRingIsHeld(t *testing.T) {
	s := New(&owner{})
	type held struct {
		sl *Slot[owner]
		w  uint64
	}
	var all []held
	for range 4 * ringSize {
		sl, w := s.Claim(0, 1, false, nil, nil, nil)
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
		_, _, ok := s.Release(h.sl, h.w)
		require.True(t, ok)
	}
	n := len(s.all)
	for range overflow {
		sl, w := s.Claim(0, 1, false, nil, nil, nil)
		defer s.Release(sl, w)
	}
	assert.Equal(t, n, len(s.all), "overflow slots are reused, not made anew")
}

// Claims and releases from many goroutines, each word released by two
// goroutines at once: every admission is released exactly once.
func TestHammerReleasesEachAdmissionOnce(t *testing.T) {
	s := New(&owner{})
	const g, m = 16, 2000
	var wg sync.WaitGroup
	var released, claims atomic.Int64
	for i := range g {
		wg.Go(func() {
			for range m {
				sl, w := s.Claim(i, 1, i%2 == 0, nil, nil, nil)
				claims.Add(1)
				var inner sync.WaitGroup
				for range 2 {
					inner.Go(func() {
						if _, _, ok := s.Release(sl, w); ok {
							released.Add(1)
						}
					})
				}
				inner.Wait()
			}
		})
	}
	wg.Wait()
	assert.Equal(t, claims.Load(), released.Load(), "one release per claim")
}

// Claim and release allocate nothing once the rings exist.
func TestClaimAndReleaseAllocateNothing(t *testing.T) {
	s := New(&owner{})
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		sl, w := s.Claim(0, 1, false, nil, nil, nil)
		s.Release(sl, w)
	}))
}

func BenchmarkClaimRelease(b *testing.B) {
	s := New(&owner{})
	b.ReportAllocs()
	for b.Loop() {
		sl, w := s.Claim(0, 1, false, nil, nil, nil)
		s.Release(sl, w)
	}
}
