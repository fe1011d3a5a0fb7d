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

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"

	"github.com/leapflow/leapflow/stat/stattest"
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
	_, err = r.Enter()
	require.ErrorIs(t, err, ErrReservationDone)
	r2, err := e.Reserve("api", WithCount(4))
	require.NoError(t, err)
	assert.Equal(t, 900*ms, r2.Delay(), "the cancelled one's place")
	_, err = e.Reserve("api", WithWait(500*ms))
	var be *BlockError
	require.ErrorAs(t, err, &be, "no room within its wait: blocked")
	clock.Set(time.Second)
	assert.Zero(t, r2.Delay())
	en, err := r2.Enter()
	require.NoError(t, err)
	assert.Equal(t, int64(time.Second), en.Start())
	en.Exit(nil)
	_, err = r2.Enter()
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
	en, err := r.Wait(context.Background())
	require.NoError(t, err)
	en.Exit(nil)
	r, err = e.Reserve("api")
	require.NoError(t, err)
	assert.Equal(t, time.Second, r.Delay())
	s.cancel = func() bool { return true }
	_, err = r.Wait(context.Background())
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
	en, err := r.Enter()
	require.NoError(t, err)
	en.Exit(nil)
	snap, ok := e.Snapshot("free")
	require.True(t, ok)
	assert.Equal(t, 3.0, snap.PassQPS)
	_, err = e.Reserve("free", WithCount(0))
	require.ErrorIs(t, err, ErrInvalidCount)
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
							en, err = r.Wait(context.Background())
						default:
							// Enter once the instant has come (the clock
							// moved there by someone).
							s := &clockSleeper{clock: clock}
							s.advanceTo(clock.Now() + int64(r.Delay()))
							en, err = r.Enter()
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
		en, err := rs[i].Enter()
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
