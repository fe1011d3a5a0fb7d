package flow

import (
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An abandoned reservation (neither entered nor cancelled) on a resource
// with a Concurrency rule keeps its concurrency count forever.
func TestRegressAbandonedReservationLeaksConcurrency(t *testing.T) {
	e, clock, _ := waitEngine(t)
	load(t, e,
		Rule{Resource: "api", Metric: Concurrency, Threshold: 1},
		Rule{Resource: "api", Threshold: 100})
	func() {
		_, err := e.Reserve("api")
		require.NoError(t, err)
		// dropped on the floor
	}()
	clock.Advance(2 * time.Hour)
	// Cleanups run on their own goroutine after a collection: give them
	// a few rounds.
	var err error
	for range 100 {
		runtime.GC()
		time.Sleep(time.Millisecond)
		var en Entry
		if en, err = e.Entry("api"); err == nil {
			en.Exit(nil)
			break
		}
	}
	assert.NoError(t, err, "an abandoned reservation should only cost capacity for a while, not hold the concurrency slot forever")
}

// WithWait(0) given explicitly means "no wait" for Entry; Reserve treats it
// as MaxWait.
func TestRegressReserveExplicitZeroWait(t *testing.T) {
	e, clock, _ := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 1})
	clock.Set(100 * ms)
	en, err := e.Entry("api")
	require.NoError(t, err)
	en.Exit(nil)
	_, err = e.Entry("api", WithWait(0))
	require.Error(t, err, "Entry with WithWait(0) does not wait")
	r, err := e.Reserve("api", WithWait(0))
	if err == nil {
		t.Errorf("Reserve with WithWait(0) reserved with delay %v; want blocked", r.Delay())
		r.Cancel()
	}
	var be *BlockError
	_ = errors.As(err, &be)
}

// Entering a reservation early on a resource whose rules do not count on
// the node's second window (GCRA only) counts its pass at its instant by
// writing a bucket that far ahead into the node's statistics window: every
// request after it, for as long as that, is clamped into that future
// bucket, and the present's statistics read the future.
func TestRegressEarlyEnterShiftsStatsIntoTheFuture(t *testing.T) {
	e, clock, _ := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 100, Behavior: GCRA, Burst: 100})
	clock.Set(time.Second)
	en, err := e.Entry("api", WithCount(100)) // the burst, now
	require.NoError(t, err)
	en.Exit(nil)
	var last *Reservation
	for range 10 {
		r, err := e.Reserve("api", WithCount(100))
		require.NoError(t, err)
		last = r
	}
	require.Equal(t, 10*time.Second, last.Delay())
	before, _ := e.Snapshot("api")
	require.Equal(t, 100.0, before.PassQPS)
	en, err = last.Enter() // early: its rule counted it at 11 s
	require.NoError(t, err)
	assert.Equal(t, int64(11*time.Second), en.Start(), "stamped at its instant")
	en.Exit(nil)
	after, _ := e.Snapshot("api")
	assert.Equal(t, before.PassQPS+100, after.PassQPS, "the statistics count it when it ran, not in a bucket 10 s ahead")
	// Traffic over the next seconds: blocked at 3 s, read at 4.5 s.
	clock.Set(3 * time.Second)
	for range 7 {
		_, err := e.Entry("api")
		require.Error(t, err)
	}
	clock.Set(3*time.Second + 200*ms)
	s3, _ := e.Snapshot("api")
	clock.Set(4*time.Second + 500*ms)
	s4, _ := e.Snapshot("api")
	t.Logf("at 3.2s: %+v", s3)
	t.Logf("at 4.5s: %+v", s4)
	assert.Equal(t, 7.0, s3.BlockQPS)
	assert.Equal(t, 0.0, s4.BlockQPS, "blocks at 3 s are not in the last second at 4.5 s")
	assert.Equal(t, int64(7), s4.PrevBlock, "the 7 blocks are in second 3..4")
}
