package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
)

// TestReserveOnAWindow: a full window's reservation is for the start of
// the next bucket with room, entered there; a cancelled one gives its
// place back to the next.
func TestReserveOnAWindow(t *testing.T) {
	e, clock, _ := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 4})
	clock.Set(100 * ms)
	for range 4 {
		en, err := e.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	r, err := e.Reserve("api")
	require.NoError(t, err)
	assert.Equal(t, 900*ms, r.Delay(), "the window frees at 1 s")
	r.Cancel()
	r.Cancel() // again: nothing
	_, err = r.Entry()
	require.ErrorIs(t, err, ErrReservationDone)
	r2, err := e.Reserve("api", WithCount(4))
	require.NoError(t, err)
	assert.Equal(t, 900*ms, r2.Delay(), "the cancelled one's place")
	_, err = e.Reserve("api", WithWait(500*ms))
	var be *BlockError
	require.ErrorAs(t, err, &be, "no room within its wait: blocked")
	clock.Set(time.Second)
	assert.Zero(t, r2.Delay())
	en, err := r2.Entry()
	require.NoError(t, err)
	assert.Equal(t, int64(time.Second), en.Start())
	en.Exit(nil)
	_, err = r2.Entry()
	require.ErrorIs(t, err, ErrReservationDone)
	r2.Cancel() // after Enter: nothing
	_, err = e.Entry("api")
	require.Error(t, err, "the reservation's 4 fill the bucket")
}

// TestReserveGCRAAsXTimeRate: reservations on a GCRA rule are
// x/time/rate's, delay for delay (to its float rounding), on the same
// instants, with the queue growing to seconds.
func TestReserveGCRAAsXTimeRate(t *testing.T) {
	e, clock, _ := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 10, Behavior: GCRA, Burst: 2})
	lim := rate.NewLimiter(10, 2)
	base := time.Unix(1_700_000_000, 0)
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Second
	for i := range 300 {
		now += time.Duration(rng.IntN(4)) * 25 * ms
		clock.Set(now)
		n := 1 + rng.IntN(2)
		want := lim.ReserveN(base.Add(now), n).DelayFrom(base.Add(now))
		r, err := e.Reserve("api", WithCount(n))
		require.NoError(t, err, "step %d", i)
		// x/time/rate keeps tokens in float64: a nanosecond apart once
		// its queue is seconds long.
		require.InDelta(t, float64(want), float64(r.Delay()), 1, "step %d", i)
	}
}

// TestReservationWaitCancelledGivesBack: a reservation whose Wait's
// context ends is cancelled, and its place goes to the next.
func TestReservationWaitCancelledGivesBack(t *testing.T) {
	e, clock, s := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 1, Behavior: GCRA, Burst: 1})
	clock.Set(time.Second)
	r, err := e.Reserve("api")
	require.NoError(t, err)
	en, err := waitReserved(r)
	require.NoError(t, err)
	en.Exit(nil)
	r, err = e.Reserve("api")
	require.NoError(t, err)
	assert.Equal(t, time.Second, r.Delay())
	s.cancel = func() bool { return true }
	_, err = waitReserved(r)
	require.ErrorIs(t, err, context.Canceled)
	s.cancel = nil
	r, err = e.Reserve("api")
	require.NoError(t, err)
	assert.Equal(t, time.Second, r.Delay(), "the cancelled one's tokens came back")
}

func TestReserveWithoutRules(t *testing.T) {
	e, _, _ := waitEngine(t)
	r, err := e.Reserve("free", WithCount(3))
	require.NoError(t, err)
	assert.Zero(t, r.Delay())
	en, err := r.Entry()
	require.NoError(t, err)
	en.Exit(nil)
	snap, ok := e.Snapshot("free")
	require.True(t, ok)
	assert.Equal(t, 3.0, snap.PassQPS)
	_, err = e.Reserve("free", WithCount(0))
	require.ErrorIs(t, err, ErrInvalidOption)
}

// TestReserveHammer: goroutines reserve on a span-exact rule and a GCRA
// rule, then enter, wait or cancel, while the clock moves; every entered
// request's stamp keeps each rule's bound, and nothing is stranded.
func TestReserveHammer(t *testing.T) {
	const threshold = 20
	for _, g := range goroutineCounts() {
		t.Run(fmt.Sprintf("goroutines=%d", g), func(t *testing.T) {
			e, clock, _ := waitEngine(t)
			load(t, e,
				Rule{Resource: "span", Threshold: threshold, SpanExact: true},
				Rule{Resource: "gcra", Threshold: threshold, Behavior: GCRA, Burst: 5})
			res := []string{"span", "gcra"}
			stamps := make([][2][]stamp, g)
			tries := max(10, 2000/g)
			var wg sync.WaitGroup
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(i), 11))
					for k := range tries {
						j := k % 2
						clock.Advance(time.Duration(rng.Int64N(int64(3 * ms))))
						r, err := e.Reserve(res[j], WithWait(time.Duration(rng.Int64N(int64(2*time.Second)))))
						if err != nil {
							if !errors.As(err, new(*BlockError)) {
								t.Errorf("unexpected error: %v", err)
								return
							}
							continue
						}
						var en Entry
						switch rng.IntN(3) {
						case 0:
							r.Cancel()
							continue
						case 1:
							en, err = waitReserved(r)
						default:
							// Enter once the instant has come (the clock
							// moved there by someone).
							s := &clockSleeper{clock: clock}
							s.advanceTo(clock.Now() + int64(r.Delay()))
							en, err = r.Entry()
						}
						if err != nil {
							t.Errorf("unexpected error: %v", err)
							return
						}
						stamps[i][j] = append(stamps[i][j], stamp{en.Start(), 1})
						en.Exit(nil)
					}
				}()
			}
			wg.Wait()
			var span, gc []stamp
			for i := range stamps {
				span = append(span, stamps[i][0]...)
				gc = append(gc, stamps[i][1]...)
			}
			require.NotEmpty(t, span)
			require.NotEmpty(t, gc)
			assert.LessOrEqual(t, mostInSpan(span, int64(time.Second)), int64(threshold))
			for _, l := range []int64{int64(100 * ms), int64(time.Second)} {
				assert.LessOrEqual(t, mostInSpan(gc, l), 5+l*threshold/int64(time.Second)+1, "gcra span %d", l)
			}
			clock.Advance(10 * time.Second)
			for j, want := range []int{threshold, 5} {
				assert.Equal(t, want, drain(e, res[j]), res[j])
			}
		})
	}
}

func TestReservationEnterAllocatesNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 1e12, SpanExact: true})
	rs := make([]*Reservation, 1100)
	for i := range rs {
		r, err := e.Reserve("api")
		require.NoError(t, err)
		rs[i] = r
	}
	i := 0
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		en, err := rs[i].Entry()
		i++
		if err == nil {
			en.Exit(nil)
		}
	}))
}

// TestDroppedReservationIsCancelled: a reservation neither entered nor
// cancelled gives its Concurrency slot back once it is collected.
func TestDroppedReservationIsCancelled(t *testing.T) {
	e, _, _ := waitEngine(t)
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 1})
	func() {
		r, err := e.Reserve("api")
		require.NoError(t, err)
		require.NotNil(t, r)
	}()
	_, err := e.Entry("api")
	require.Error(t, err, "the reservation holds the one slot")
	admitted := false
	for range 100 {
		runtime.GC()
		time.Sleep(time.Millisecond)
		if en, err := e.Entry("api"); err == nil {
			en.Exit(nil)
			admitted = true
			break
		}
	}
	assert.True(t, admitted, "the dropped reservation's slot came back")
}

// Reservations that are only ever cancelled (each within a few ms of its
// reserved instant), under concurrency, on a QPS window plus a GCRA rule
// (the align path): once they are all cancelled, the resource's statistics
// hold no pass and nothing in flight.
func TestCancelledReservationsLeaveNoPass(t *testing.T) {
	sets := map[string][]Rule{
		"qps+gcra": {{Resource: "r", Threshold: 20}, {Resource: "r", Threshold: 10, Behavior: GCRA, Burst: 3}},
	}
	for name, rules := range sets {
		t.Run(name, func(t *testing.T) {
			bad := 0
			for round := range 10 {
				e, clock, _ := waitEngine(t)
				load(t, e, rules...)
				var wg sync.WaitGroup
				var mu sync.Mutex
				var maxGap int64
				for i := range 32 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewPCG(uint64(i), uint64(round)))
						for range 50 {
							clock.Advance(time.Duration(rng.Int64N(int64(5 * ms))))
							r, err := e.Reserve("r", WithWait(time.Duration(rng.Int64N(int64(3*time.Second)))))
							if err != nil {
								if !errors.As(err, new(*BlockError)) {
									t.Errorf("reserve: %v", err)
								}
								continue
							}
							t0 := clock.Now()
							d := r.Delay()
							r.Cancel()
							if gap := clock.Now() - t0 - int64(d); gap > 0 {
								mu.Lock()
								maxGap = max(maxGap, gap)
								mu.Unlock()
							}
						}
					}()
				}
				wg.Wait()
				clock.Advance(20 * time.Second)
				snap, _ := e.Snapshot("r")
				if snap.MinutePass != 0 || snap.Inflight != 0 {
					bad++
					t.Logf("round %d: nothing entered, yet MinutePass %d Inflight %d; most the clock passed a reservation's instant before its Cancel: %v", round, snap.MinutePass, snap.Inflight, time.Duration(maxGap))
				}
			}
			if bad > 0 {
				t.Errorf("%s: %d of 10 rounds count cancelled reservations as passes", name, bad)
			}
		})
	}
	_ = fmt.Sprint
}

// A reservation cancelled after its instant has passed (never entered) is
// not in flight, and every pass counted was entered and exited.
func TestLateCancelledReservationIsNotInFlight(t *testing.T) {
	for _, cancelAt := range []time.Duration{1200 * ms, 1700 * ms, 2600 * ms, 5 * time.Second} {
		t.Run(cancelAt.String(), func(t *testing.T) {
			e, clock, _ := waitEngine(t)
			load(t, e, Rule{Resource: "api", Threshold: 4})
			clock.Set(100 * ms)
			for range 4 {
				en, err := e.Entry("api")
				require.NoError(t, err)
				en.Exit(nil)
			}
			r, err := e.Reserve("api")
			require.NoError(t, err)
			require.Equal(t, 900*ms, r.Delay())
			// Traffic goes on; the reservation is never entered.
			for now := 1100 * ms; now <= cancelAt; now += 100 * ms {
				clock.Set(now)
				if en, err := e.Entry("api"); err == nil {
					en.Exit(nil)
				}
			}
			clock.Set(cancelAt)
			r.Cancel()
			clock.Set(10 * time.Second)
			snap, _ := e.Snapshot("api")
			assert.Equal(t, int64(0), snap.Inflight, "a cancelled reservation is not in flight")
			assert.Equal(t, snap.MinuteSuccess, snap.MinutePass, "every pass counted was entered and exited")
		})
	}
}

// A reservation neither entered nor cancelled, on a resource with a
// Concurrency rule, holds the concurrency slot only for a while, not
// forever.
func TestAbandonedReservationReleasesConcurrency(t *testing.T) {
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

// WithWait(0) given explicitly means no wait, for Entry and for Reserve
// alike.
func TestReserveWithWaitZeroDoesNotWait(t *testing.T) {
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

// Entering a reservation early, on a resource whose rules do not count on
// the node's second window (GCRA only), is stamped at its instant but
// counted in the statistics when it ran, not in a bucket far ahead that
// later requests would clamp into.
func TestEarlyEnteredReservationCountsInThePresent(t *testing.T) {
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
	en, err = last.Entry() // early: its rule counted it at 11 s
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

// waitReserved sleeps until r's instant on its engine's sleep (a fake
// clock's in these tests), then enters it.
func waitReserved(r *Reservation) (Entry, error) {
	if d := r.Delay(); d > 0 {
		if err := r.e.wait(context.Background(), d); err != nil {
			r.Cancel()
			return Entry{}, err
		}
	}
	return r.Entry()
}
