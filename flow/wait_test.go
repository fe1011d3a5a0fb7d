package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
	"golang.org/x/time/rate"
)

// clockSleeper sleeps by moving a fake clock to at least now+d, unless
// cancel says this wait is cut short: then it returns context.Canceled at
// once, the clock moved by cutAt of d first.
type clockSleeper struct {
	clock  *stattest.Clock
	mu     sync.Mutex
	cancel func() bool
	cutAt  float64
	waits  []time.Duration
}

func (s *clockSleeper) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	cut := s.cancel != nil && s.cancel()
	s.mu.Unlock()
	if cut {
		s.advanceTo(s.clock.Now() + int64(float64(d)*s.cutAt))
		return context.Canceled
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.advanceTo(s.clock.Now() + int64(d))
	return nil
}

// advanceTo moves the clock forward to t, never back (waiters overlap).
func (s *clockSleeper) advanceTo(t int64) {
	for {
		now := s.clock.Now()
		if t <= now {
			return
		}
		if s.clock.Advance(time.Duration(t-now)) >= time.Duration(t) {
			return
		}
	}
}

// drain admits on res, at the clock's instant, until refused, and
// returns how many it admitted.
func drain(e *Engine, res string) int {
	n := 0
	for {
		en, err := e.Entry(res)
		if err != nil {
			return n
		}
		en.Exit(nil)
		n++
	}
}

func waitEngine(t *testing.T, opts ...Option) (*Engine, *stattest.Clock, *clockSleeper) {
	t.Helper()
	clock := stattest.NewClock(0)
	s := &clockSleeper{clock: clock}
	e, err := New(append([]Option{WithClock(clock), WithSleep(s.sleep)}, opts...)...)
	require.NoError(t, err)
	return e, clock, s
}

func TestWithWaitIsValidated(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 1})
	for _, d := range []time.Duration{-1, longestWait + 1} {
		_, err := e.Entry("api", WithWait(d))
		require.ErrorIs(t, err, ErrInvalidOption)
		assert.Contains(t, err.Error(), d.String())
	}
	snap, _ := e.Snapshot("api")
	assert.Zero(t, snap.PassQPS+snap.BlockQPS, "neither admitted nor blocked")
}

// TestWaitOnAWindow: a full window's waiter is admitted against the next
// bucket with room and waits exactly until it starts; one with no room
// within its wait is blocked at once, having waited for nothing.
func TestWaitOnAWindow(t *testing.T) {
	e, clock, s := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 4})
	clock.Set(100 * ms)
	for range 4 {
		en, err := e.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	_, err := e.Entry("api")
	require.Error(t, err)
	// The window (4 buckets of 250 ms) frees at 1 s.
	_, err = e.Entry("api", WithWait(800*ms))
	require.Error(t, err, "1 s is 900 ms away")
	assert.Empty(t, s.waits)
	en, err := e.Entry("api", WithWait(900*ms))
	require.NoError(t, err)
	assert.Equal(t, []time.Duration{900 * ms}, s.waits)
	assert.Equal(t, int64(time.Second), en.Start())
	en.Exit(nil)
	// The borrow counted in its bucket: 3 more fit there, not 4.
	for range 3 {
		en, err := e.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	_, err = e.Entry("api")
	require.Error(t, err)
}

// TestWaitCancelGivesBack, for every rate rule: a waiter whose context
// ends gives back what it took, so the next waiter gets the same slot.
func TestWaitCancelGivesBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		rule Rule
	}{
		{"reject", Rule{Resource: "api", Threshold: 4}},
		{"span-exact", Rule{Resource: "api", Threshold: 4, SpanExact: true}},
		{"gcra", Rule{Resource: "api", Threshold: 4, Behavior: GCRA, Burst: 4}},
		{"throttle", Rule{Resource: "api", Threshold: 4, Behavior: Throttle, MaxQueueing: 10 * ms}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clock, s := waitEngine(t)
			load(t, e, tc.rule)
			clock.Set(100 * ms)
			for {
				en, err := e.Entry("api")
				if err != nil {
					break
				}
				en.Exit(nil)
			}
			cut := true
			s.cancel = func() bool { return cut }
			_, err := e.Entry("api", WithWait(2*time.Second))
			require.ErrorIs(t, err, context.Canceled)
			require.Len(t, s.waits, 1)
			first := s.waits[0]
			cut = false
			en, err := e.Entry("api", WithWait(2*time.Second))
			require.NoError(t, err)
			en.Exit(nil)
			require.Len(t, s.waits, 2)
			assert.Equal(t, first, s.waits[1], "the same slot: the first one gave it back")
		})
	}
}

// TestWaitCancelAfterItsBucketStarted: a wait cut short after its bucket
// started (the borrow was folded into the bucket by other traffic) takes
// its pass back out of the bucket.
func TestWaitCancelAfterItsBucketStarted(t *testing.T) {
	e, clock, s := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 4})
	clock.Set(100 * ms)
	for range 4 {
		en, err := e.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	s.cancel = func() bool {
		// The bucket starts, and another request makes it (folding the
		// borrow in) before the waiter's context ends.
		clock.Set(time.Second)
		_, _ = e.Entry("other")
		_, err := e.Entry("api", WithWait(0)) // makes the bucket
		assert.NoError(t, err, "3 of 4 left in the new bucket")
		return true
	}
	_, err := e.Entry("api", WithWait(time.Second))
	require.ErrorIs(t, err, context.Canceled)
	s.cancel = nil
	// 4 in the bucket: the canceled one's pass went back, 1 taken.
	assert.Equal(t, 3, drain(e, "api"))
}

// TestEngineWaitFollowsTheDeadline: Wait waits up to ctx's deadline and
// no further; a WithWait among its options can only shorten that.
func TestEngineWaitFollowsTheDeadline(t *testing.T) {
	e, clock, s := waitEngine(t)
	load(t, e, Rule{Resource: "api", Threshold: 1, Behavior: GCRA, Burst: 1})
	clock.Set(time.Second)
	en, err := e.Wait(context.Background(), "api")
	require.NoError(t, err)
	en.Exit(nil)
	assert.Empty(t, s.waits, "a full bucket: no wait")
	ctx, cancel := context.WithTimeout(context.Background(), 500*ms)
	defer cancel()
	_, err = e.Wait(ctx, "api")
	require.Error(t, err, "the next token is 1 s away, the deadline 500 ms")
	var be *BlockError
	require.ErrorAs(t, err, &be)
	en, err = e.Wait(context.Background(), "api", WithWait(2*time.Second))
	require.NoError(t, err)
	en.Exit(nil)
	assert.Equal(t, []time.Duration{time.Second}, s.waits)
	_, err = e.Wait(context.Background(), "api", WithWait(500*ms))
	require.Error(t, err, "its own WithWait is shorter than the wait")
	r, err := e.Resource("api")
	require.NoError(t, err)
	en, err = r.Wait(context.Background())
	require.NoError(t, err)
	en.Exit(nil)
	assert.Equal(t, []time.Duration{time.Second, time.Second}, s.waits)
}

// TestGCRAWaitsAsXTimeRateReserves: on the same monotonic sequence, the
// wait a GCRA rule gives (and whether it admits within the wait allowed)
// is x/time/rate's reservation delay.
func TestGCRAWaitsAsXTimeRateReserves(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 5))
		r := []float64{1, 4, 10, 250, 1000}[rng.IntN(5)]
		burst := 1 + rng.IntN(6)
		e, clock, s := waitEngine(t)
		load(t, e, Rule{Resource: "api", Threshold: r, Behavior: GCRA, Burst: burst})
		lim := rate.NewLimiter(rate.Limit(r), burst)
		base := time.Unix(1_700_000_000, 0)
		interval := time.Duration(1e9 / r)
		now := time.Second
		for i := range 1000 {
			now = max(now, time.Duration(clock.Now())) + time.Duration(rng.IntN(12))*interval/8
			clock.Set(now)
			n := 1 + rng.IntN(burst)
			maxWait := time.Duration(rng.IntN(4*burst)) * interval / 2
			xr := lim.ReserveN(base.Add(now), n)
			want := xr.OK() && xr.DelayFrom(base.Add(now)) <= maxWait
			wantDelay := xr.DelayFrom(base.Add(now))
			if !want {
				xr.CancelAt(base.Add(now))
			}
			s.waits = s.waits[:0]
			en, err := e.Entry("api", WithCount(n), WithWait(maxWait))
			got := err == nil
			require.Equal(t, want, got, "seed %d step %d", seed, i)
			if got {
				en.Exit(nil)
				var d time.Duration
				if len(s.waits) > 0 {
					d = s.waits[0]
				}
				require.Equal(t, wantDelay, d, "seed %d step %d", seed, i)
				// Both move on to when the request went.
				now += d
			}
		}
	}
}

// TestWaitHammer: goroutines Wait with random waits on a window, a
// span-exact window, a GCRA rule and a resource with all three (each rule
// must count a request at the instant it goes, whichever rule made it
// wait), a third of their waits cut short,
// on a fake clock that the waits move. No threshold is ever exceeded in
// the stamps the engine gave, and nothing cut short is lost: afterwards
// every window admits its whole threshold again.
func TestWaitHammer(t *testing.T) {
	const threshold = 20
	for _, g := range goroutineCounts() {
		t.Run(fmt.Sprintf("goroutines=%d", g), func(t *testing.T) {
			e, clock, s := waitEngine(t)
			var rmu sync.Mutex
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			s.cancel = func() bool {
				rmu.Lock()
				defer rmu.Unlock()
				return rng.IntN(3) == 0
			}
			s.cutAt = 0.5
			load(t, e,
				Rule{Resource: "reject", Threshold: threshold},
				Rule{Resource: "span", Threshold: threshold, SpanExact: true},
				Rule{Resource: "gcra", Threshold: threshold, Behavior: GCRA, Burst: 5},
				Rule{Resource: "combo", Threshold: threshold},
				Rule{Resource: "combo", Threshold: threshold - 5, SpanExact: true},
				Rule{Resource: "combo", Threshold: threshold, Behavior: GCRA, Burst: 5})
			res := []string{"reject", "span", "gcra", "combo"}
			stamps := make([][4][]stamp, g)
			tries := max(10, 3000/g)
			var wg sync.WaitGroup
			for i := range g {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(i), 10))
					for k := range tries {
						j := k % 4
						clock.Advance(time.Duration(r.Int64N(int64(2 * ms))))
						en, err := e.Entry(res[j], WithWait(time.Duration(r.Int64N(int64(1500*ms)))))
						if err == nil {
							stamps[i][j] = append(stamps[i][j], stamp{en.Start(), 1})
							en.Exit(nil)
						} else if !errors.Is(err, context.Canceled) && !errors.As(err, new(*BlockError)) {
							t.Errorf("unexpected error: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			all := func(j int) []stamp {
				var out []stamp
				for i := range stamps {
					out = append(out, stamps[i][j]...)
				}
				return out
			}
			for _, c := range []struct {
				j                  int
				window, span, gcra int64 // 0: no such rule
			}{{0, threshold, 0, 0}, {1, 0, threshold, 0}, {2, 0, 0, 5}, {3, threshold, threshold - 5, 5}} {
				st := all(c.j)
				require.NotEmpty(t, st, res[c.j])
				if c.window > 0 {
					// Every window of four 250 ms buckets.
					own := map[int64]int64{}
					for _, x := range st {
						own[x.t/int64(250*ms)]++
					}
					for b := range own {
						sum := own[b] + own[b-1] + own[b-2] + own[b-3]
						assert.LessOrEqual(t, sum, c.window, "%s: window ending at bucket %d", res[c.j], b)
					}
				}
				if c.span > 0 {
					assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), c.span, "%s: span-exact", res[c.j])
				}
				if c.gcra > 0 {
					// Any span L holds at most Burst + L x rate.
					for _, l := range []int64{int64(100 * ms), int64(time.Second), int64(3 * time.Second)} {
						assert.LessOrEqual(t, mostInSpan(st, l), c.gcra+l*threshold/int64(time.Second)+1, "%s: gcra span %d", res[c.j], l)
					}
				}
			}
			// Every wait slept until its instant, never more than its
			// WithWait from when it slept: the clock moved by the
			// goroutines' steps and waits, far from engineLimit.
			assert.Less(t, clock.Now(), int64(time.Hour), "engine time at the hammer's end")
			// Nothing stranded: once every wait is over and the windows
			// have emptied, each admits its whole threshold again.
			s.cancel = nil
			clock.Advance(5 * time.Second)
			for j, want := range []int{threshold, threshold, 5, 5} {
				assert.Equal(t, want, drain(e, res[j]), res[j])
			}
		})
	}
}

func TestWaitAllocatesNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 1e12})
	ctx := context.Background()
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		en, err := e.Wait(ctx, "api")
		if err == nil {
			en.Exit(nil)
		}
	}))
}

// staleClock is a fake clock whose next reading, once armed, moves it
// on by lag after it is read: the reader's value is stale by lag before it
// uses it (a goroutine descheduled right after reading the clock).
type staleClock struct {
	*stattest.Clock
	lag atomic.Int64
}

func (c *staleClock) Now() int64 {
	t := c.Clock.Now()
	if lag := c.lag.Swap(0); lag != 0 {
		c.Advance(time.Duration(lag))
	}
	return t
}

// A wait is slept until the request's instant (its now plus the wait the
// rules gave it), not for the wait from whenever the sleep starts: a
// request whose clock reading went stale before it slept sleeps only the
// rest, never more than WithWait.
func TestWaitSleepsUntilTheInstantNotPastIt(t *testing.T) {
	clock := &staleClock{Clock: stattest.NewClock(0)}
	s := &clockSleeper{clock: clock.Clock}
	e, err := New(WithClock(clock), WithSleep(s.sleep))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Threshold: 4})
	require.Equal(t, 4, drain(e, "api")) // the window's first bucket is full
	// The request reads the clock at 0 and borrows the bucket at 1 s (the
	// first whose window drops the full one); 300 ms pass before it
	// sleeps.
	clock.lag.Store(int64(300 * ms))
	en, err := e.Entry("api", WithWait(time.Second))
	require.NoError(t, err)
	assert.Equal(t, int64(time.Second), en.Start(), "admitted at the borrowed bucket's start")
	en.Exit(nil)
	assert.Equal(t, []time.Duration{700 * ms}, s.waits, "only the rest of the wait, not 1 s from 300 ms")
	assert.Equal(t, int64(time.Second), clock.Now(), "woke at the instant")

	// A request whose instant has passed by the time it would sleep does
	// not sleep, but a context already ended still cancels it.
	clock.Advance(time.Second)
	require.Equal(t, 4, drain(e, "api"))
	clock.lag.Store(int64(2 * time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = e.Entry("api", WithWait(time.Second), WithContext(ctx))
	assert.ErrorIs(t, err, context.Canceled)
	assert.Len(t, s.waits, 1, "no sleep for an instant already past")
}

// A borrowed admission whose borrower went without its bucket being made
// (a sleep that returned before the instant, or engine time re-based past
// engineLimit by a runaway clock) is charged to no window it never shared:
// once a whole window has passed, the resource admits its whole threshold
// again. It still counts in the statistics, at its own instant.
func TestBorrowOfAnUnmadeBucketLapsesAfterItsWindow(t *testing.T) {
	for _, c := range []struct {
		name  string
		sleep func(clock *stattest.Clock) func(context.Context, time.Duration) error
	}{
		{"engine time re-based", func(clock *stattest.Clock) func(context.Context, time.Duration) error {
			return func(_ context.Context, d time.Duration) error {
				clock.Advance(d)                          // this waiter's own wait
				clock.Advance(time.Duration(engineLimit)) // another's runaway wait
				return nil
			}
		}},
		{"sleep returned early", func(*stattest.Clock) func(context.Context, time.Duration) error {
			return func(context.Context, time.Duration) error { return nil }
		}},
	} {
		for _, span := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/spanExact=%v", c.name, span), func(t *testing.T) {
				clock := stattest.NewClock(10 * time.Second)
				e, err := New(WithClock(clock), WithSleep(c.sleep(clock)))
				require.NoError(t, err)
				load(t, e, Rule{Resource: "api", Threshold: 20, SpanExact: span})
				require.Equal(t, 20, drain(e, "api"))
				en, err := e.Entry("api", WithWait(1500*ms))
				require.NoError(t, err)
				en.Exit(nil)
				clock.Advance(5 * time.Second)
				assert.Equal(t, 20, drain(e, "api"), "5 s later")
				snap, ok := e.Snapshot("api")
				require.True(t, ok)
				assert.Equal(t, int64(20+1+20), snap.MinutePass, "every pass counted once")
				clock.Advance(60 * time.Second)
				assert.Equal(t, 20, drain(e, "api"), "65 s later")
			})
		}
	}
}

// mostInAlignedWindow is the most stamps in any window of four 250 ms
// buckets (the 1 s window a Reject rule limits).
func mostInAlignedWindow(st []stamp) int64 {
	own := map[int64]int64{}
	for _, x := range st {
		own[x.t/int64(250*ms)] += x.n
	}
	var best int64
	for b := range own {
		best = max(best, own[b]+own[b-1]+own[b-2]+own[b-3])
	}
	return best
}

func admitAll(t *testing.T, e *Engine, clock *stattest.Clock, at time.Duration, k int, opts func(i int) []EntryOption) []stamp {
	t.Helper()
	clock.Set(at)
	var st []stamp
	for i := range k {
		en, err := e.Entry("api", opts(i)...)
		if err != nil {
			continue
		}
		st = append(st, stamp{en.Start(), 1})
		en.Exit(nil)
	}
	return st
}

// A Reject rule whose window also holds a WarmUp rule, on a resource where
// a Throttle rule makes requests wait: each request is counted in the
// bucket of the instant it goes, so the Reject threshold holds on the
// engine's own stamps (a control without the WarmUp rule holds as well).
func TestWaitCountsAtTheInstantItGoesBesideAWarmUpRule(t *testing.T) {
	for _, withWarm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warmup=%v", withWarm), func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock)
			rules := []Rule{
				{Resource: "api", Threshold: 10},
				{Resource: "api", Threshold: 20, Behavior: Throttle, MaxQueueing: 2 * time.Second},
			}
			if withWarm {
				// Cold rate 1000/3 per second: never the tighter limit.
				rules = append(rules, Rule{Resource: "api", Threshold: 1000, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second})
			}
			load(t, e, rules...)
			none := func(int) []EntryOption { return nil }
			st := admitAll(t, e, clock, 990*ms, 20, none)
			st = append(st, admitAll(t, e, clock, 1750*ms, 20, none)...)
			assert.LessOrEqual(t, mostInAlignedWindow(st), int64(10), "Reject 10/s on the stamps %v", st)
		})
	}
}

// A PerKey Throttle rule makes requests wait; a Reject rule on the same
// resource counts each request at the instant it goes, so the Reject
// threshold holds on the engine's own stamps.
func TestWaitCountsAtTheInstantItGoesUnderAPerKeyThrottle(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "api", Threshold: 10},
		Rule{Resource: "api", Threshold: 1, Behavior: Throttle, PerKey: true, MaxQueueing: 2 * time.Second})
	// Five keys, twice each at 0.9 s: the second of each goes at 1.9 s, all
	// ten counted in the bucket of 0.9 s.
	st := admitAll(t, e, clock, 900*ms, 10, func(i int) []EntryOption { return []EntryOption{WithKey(fmt.Sprint("k", i%5))} })
	require.Len(t, st, 10)
	// At 1.9 s that bucket has left the window: ten new keys pass too.
	st = append(st, admitAll(t, e, clock, 1900*ms, 10, func(i int) []EntryOption { return []EntryOption{WithKey(fmt.Sprint("n", i))} })...)
	assert.LessOrEqual(t, mostInAlignedWindow(st), int64(10), "Reject 10/s on the stamps %v", st)
}

// gatedSleeper hands every wait to the test, which decides when it ends
// and how (nil: the wait ran its course; an error: the context ended).
// It never moves the clock: a waiter's Entry.Start is now + its wait.
type gatedSleeper struct{ calls chan gatedWait }

type gatedWait struct {
	d   time.Duration
	end chan error
}

func (s *gatedSleeper) sleep(ctx context.Context, d time.Duration) error {
	w := gatedWait{d: d, end: make(chan error)}
	s.calls <- w
	return <-w.end
}

type enterResult struct {
	en  Entry
	err error
}

// startWaiter runs one Entry with a long wait in a goroutine and returns
// its sleep call (so the request holds what it took) and its result.
func startWaiter(e *Engine, s *gatedSleeper, res string) (gatedWait, chan enterResult) {
	out := make(chan enterResult, 1)
	go func() {
		en, err := e.Entry(res, WithWait(time.Hour))
		out <- enterResult{en, err}
	}()
	return <-s.calls, out
}

// giveBackScenario: k waiters take slots 1..k ahead, m more take k+1..k+m
// and go, then the first k cancel; m new waiters follow. Returns the
// stamps of every admitted request.
func giveBackScenario(t *testing.T, rule Rule, k, m int) []stamp {
	clock := stattest.NewClock(0)
	s := &gatedSleeper{calls: make(chan gatedWait)}
	e, err := New(WithClock(clock), WithSleep(s.sleep))
	require.NoError(t, err)
	load(t, e, rule)
	var st []stamp
	// A: the burst, at once.
	en, err := e.Entry("api")
	require.NoError(t, err)
	st = append(st, stamp{en.Start(), 1})
	en.Exit(nil)
	// B1..Bk wait (and will cancel).
	var bw []gatedWait
	var bo []chan enterResult
	for range k {
		w, o := startWaiter(e, s, "api")
		bw, bo = append(bw, w), append(bo, o)
	}
	// C1..Cm wait and go.
	for range m {
		w, o := startWaiter(e, s, "api")
		w.end <- nil
		r := <-o
		require.NoError(t, r.err)
		st = append(st, stamp{r.en.Start(), 1})
		r.en.Exit(nil)
	}
	// B1..Bk's contexts end: they give back what they took.
	for i := range k {
		bw[i].end <- context.Canceled
		r := <-bo[i]
		require.ErrorIs(t, r.err, context.Canceled)
	}
	// D1..Dm wait and go.
	for range m {
		w, o := startWaiter(e, s, "api")
		w.end <- nil
		r := <-o
		require.NoError(t, r.err)
		st = append(st, stamp{r.en.Start(), 1})
		r.en.Exit(nil)
	}
	return st
}

// A GCRA waiter whose context ends gives back only what no later request
// reserved behind it: new requests are scheduled after the survivors, and
// the rule never admits more than its rate.
func TestCancelledGCRAWaitNeverOverAdmits(t *testing.T) {
	const k, m = 10, 10
	st := giveBackScenario(t, Rule{Resource: "api", Threshold: 1, Behavior: GCRA, Burst: 1}, k, m)
	// At 1/s with Burst 1, a span of L seconds holds at most 1 + L (+1).
	l := int64(m) * int64(time.Second)
	assert.LessOrEqual(t, mostInSpan(st, l), int64(1+m+1), "GCRA 1/s burst 1: stamps %v", st)
}

// The same for a Throttle rule: cancelled slots are given back only where
// no one holds a slot behind them, so no two requests get the same slot.
func TestCancelledThrottleWaitNeverOverAdmits(t *testing.T) {
	const k, m = 10, 10
	st := giveBackScenario(t, Rule{Resource: "api", Threshold: 1, Behavior: Throttle, MaxQueueing: time.Millisecond}, k, m)
	// Throttle at 1/s: consecutive stamps at least 1 s apart.
	l := int64(m) * int64(time.Second)
	assert.LessOrEqual(t, mostInSpan(st, l), int64(m), "Throttle 1/s: stamps %v", st)
}

// TestWaitWithAnEndedContextAdmitsNothing: Wait with a context already
// cancelled (or past its deadline) returns the context's error at once, as
// x/time/rate's Wait does, on a resource with rules and one without,
// through the engine and a handle, and counts nothing.
func TestWaitWithAnEndedContextAdmitsNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "r", Threshold: 100})
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	past, cancel2 := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel2()
	h, err := e.Resource("r")
	require.NoError(t, err)
	for _, ctx := range []context.Context{cancelled, past} {
		for _, res := range []string{"r", "free"} {
			en, err := e.Wait(ctx, res)
			assert.ErrorIs(t, err, ctx.Err(), res)
			assert.Zero(t, en.Start(), res)
		}
		_, err := h.Wait(ctx)
		assert.ErrorIs(t, err, ctx.Err())
	}
	s, _ := e.Snapshot("r")
	assert.Zero(t, s.PassQPS+s.BlockQPS, "nothing counted")
	en, err := e.Wait(context.Background(), "r")
	require.NoError(t, err, "a live context is admitted")
	en.Exit(nil)
}
