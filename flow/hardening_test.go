package flow

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

func TestBadOptionsAreErrorsFromNew(t *testing.T) {
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithSampleCount(0), "WithSampleCount must divide 1s into whole nanoseconds, got 0"},
		{WithSampleCount(7), "WithSampleCount must divide 1s into whole nanoseconds, got 7"},
		{WithSampleCount(-4), "got -4"},
		{WithSleep(nil), "WithSleep: function must not be nil"},
		{WithClock(nil), "WithClock: clock must not be nil"},
		{WithMaxResources(-1), "WithMaxResources must be >= 1, got -1"},
	} {
		e, err := New(tc.opt)
		assert.Nil(t, e)
		assert.ErrorContains(t, err, tc.want)
	}
	e, err := New(nil, WithSampleCount(5), WithTokenSource(&fakeSource{}))
	require.NoError(t, err, "a nil option is ignored")
	// Rules on windows other than 1 s divide by the sample count.
	load(t, e, Rule{Resource: "a", Threshold: 10, StatInterval: 3 * time.Second}, Rule{Resource: "b", Threshold: 10, Global: true},
		Rule{Resource: "b", Threshold: 5})
}

func TestThresholdAndCountBounds(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "conc", Metric: Concurrency, Threshold: 5})
	for _, th := range []float64{1e19, math.MaxFloat64, float64(math.MaxInt64), maxThreshold * 2} {
		for _, m := range []Metric{QPS, Concurrency} {
			err := e.LoadRules([]Rule{{Resource: "conc", Metric: Concurrency, Threshold: 5}, {Resource: "conc", Metric: m, Threshold: th}})
			var re *RuleError
			require.ErrorAs(t, err, &re, "%v %g", m, th)
			assert.Equal(t, "Threshold", re.Field)
			assert.Equal(t, 1, re.Index)
		}
	}
	assert.LessOrEqual(t, perWindow(maxThreshold, time.Hour), int64(window.MaxCount), "the largest window fits a bucket's count")
	load(t, e, Rule{Resource: "max", Threshold: maxThreshold, StatInterval: time.Hour}, Rule{Resource: "conc", Metric: Concurrency, Threshold: 5})
	for range 2 {
		en, err := e.Entry("max", WithCount(maxCount))
		require.NoError(t, err, "the largest threshold is no limit to the largest batch")
		en.Exit(nil)
	}
	for range 2 {
		en, err := e.Entry("free", WithCount(maxCount))
		require.NoError(t, err)
		en.Exit(nil)
	}
	snap, _ := e.Snapshot("free")
	assert.Equal(t, float64(2*maxCount), snap.PassQPS, "no counter wraps")
	assert.Equal(t, int64(0), snap.Inflight)

	for _, n := range []int{0, -1, maxCount + 1, math.MaxInt, math.MinInt} {
		en, err := e.Entry("conc", WithCount(n))
		assert.ErrorIs(t, err, ErrInvalidOption, "count %d", n)
		assert.ErrorContains(t, err, fmt.Sprintf("got %d", n))
		en.Exit(nil)
	}
	snap, _ = e.Snapshot("conc")
	assert.Zero(t, snap.BlockQPS, "a bad count is not a block")
	assert.Zero(t, e.registry.Lookup("conc").Concurrency())
	for i := range 6 {
		_, err := e.Entry("conc")
		if i < 5 {
			assert.NoError(t, err)
		} else {
			assert.ErrorIs(t, err, ErrBlocked, "the Concurrency 5 rule still holds")
		}
	}
}

func TestThrottleRefusesBatchesItCannotPace(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	load(t, e, Rule{Resource: "slow", Threshold: minPacedRate, Behavior: Throttle, MaxQueueing: 10 * time.Minute})
	_, err := e.Entry("slow", WithCount(maxCount))
	assert.ErrorIs(t, err, ErrBlocked, "its cost overflows int64")
	_, err = e.Entry("slow")
	assert.NoError(t, err, "the slowest pace starts a single request")
	_, err = e.Entry("slow")
	assert.ErrorIs(t, err, ErrBlocked, "and the next would wait 1000 s")
	for _, r := range []Rule{
		{Resource: "slow", Threshold: 1e-9, Behavior: Throttle},
		{Resource: "slow", Threshold: 1, Behavior: Throttle, MaxQueueing: math.MaxInt64},
		{Resource: "slow", Threshold: 1, Behavior: Throttle, StatInterval: 10 * time.Second},
		{Resource: "slow", Threshold: 1, RelatedResource: "db", StatInterval: 10 * time.Second},
	} {
		assert.ErrorIs(t, e.LoadRules([]Rule{r}), ErrInvalidRule, "%+v", r)
	}
	load(t, e, Rule{Resource: "fast", Threshold: 10, Behavior: Throttle})
	_, err = e.Entry("fast", WithCount(maxCount))
	assert.NoError(t, err, "an idle pacer starts any batch")
	_, err = e.Entry("fast")
	assert.ErrorIs(t, err, ErrBlocked, "and then owes its whole cost")
}

// Copies of an Entry that holds nothing (no Concurrency rule counted it)
// each count their Exit; the same Entry exited twice counts once.
func TestCopiesOfAnEntryThatHoldsNothingEachExit(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10})
	en, err := e.Entry("api")
	require.NoError(t, err)
	cp := en
	en.Exit(nil)
	en.Exit(nil)
	snap, _ := e.Snapshot("api")
	assert.InDelta(t, 1.0, snap.SuccessQPS, 1e-9, "an Entry exits once")
	cp.Exit(errors.New("failed"))
	snap, _ = e.Snapshot("api")
	assert.InDelta(t, 2.0, snap.SuccessQPS, 1e-9, "a copy counts its own Exit")
	assert.InDelta(t, 1.0, snap.ExceptionQPS, 1e-9)
	assert.Zero(t, snap.Inflight, "the gauge never goes below 0")
}

// An Entry a Concurrency rule counted, copied and exited twice, releases
// its admission once.
func TestCopiesOfAnEntryExitOnce(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 1})
	en, err := e.Entry("api")
	require.NoError(t, err)
	cp := en
	en.Exit(nil)
	cp.Exit(nil)
	cp.Exit(errors.New("again"))
	assert.Zero(t, e.registry.Lookup("api").Concurrency())
	a, err := e.Entry("api")
	require.NoError(t, err)
	_, err = e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked, "Concurrency 1 admits one")
	cp.Exit(nil) // a stale copy of an earlier admission
	_, err = e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked, "a stale copy releases nothing")
	a.Exit(nil)
	snap, _ := e.Snapshot("api")
	assert.InDelta(t, 2.0, snap.SuccessQPS, 1e-9)
	assert.Zero(t, snap.ExceptionQPS)
	assert.Zero(t, snap.Inflight)
}

// Copies exited at once from several goroutines, with more admissions in
// flight than the slot rings hold (they overflow to the shared list).
func TestCopiesExitOnceUnderHammer(t *testing.T) {
	e, _ := newEngine(t, stat.NewMonotonic())
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 1e6})
	const goroutines, held, rounds = 8, 200, 5
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				ens := make([]Entry, held)
				for i := range ens {
					ens[i], _ = e.Entry("api")
				}
				var inner sync.WaitGroup
				for _, en := range ens {
					a, b := en, en // copies, each exited on its own goroutine
					inner.Go(func() { a.Exit(nil) })
					inner.Go(func() { b.Exit(nil) })
				}
				inner.Wait()
				for i := range ens {
					ens[i].Exit(nil)
				}
			}
		})
	}
	wg.Wait()
	n := e.registry.Lookup("api")
	assert.Zero(t, n.Concurrency(), "every admission released once")
	total := int64(goroutines * held * rounds)
	now := e.timeSource().Now()
	assert.Equal(t, total, n.Minute(now, 0), "passes")
	snap := n.Snapshot(now)
	assert.Equal(t, total, snap.MinuteSuccess, "one success each")
	assert.Zero(t, snap.Inflight)
}

func TestFailedLoadCreatesNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0), WithMaxResources(4))
	load(t, e, Rule{Resource: "a", Threshold: 1})
	err := e.LoadRules([]Rule{{Resource: "a", Threshold: 2}, {Resource: "b", Threshold: 1}, {Resource: "c", Threshold: 1},
		{Resource: "d", Threshold: 1}, {Resource: "e", Threshold: 1}})
	assert.ErrorIs(t, err, stat.ErrTooManyResources)
	assert.ErrorIs(t, err, ErrInvalidRule)
	var re *RuleError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, -1, re.Index, "5 resources, more than the cap of 4: the set is refused")
	assert.Contains(t, err.Error(), "WithMaxResources 4")
	assert.Equal(t, 1, e.registry.Len(), "nothing created")
	assert.Equal(t, []Rule{{Resource: "a", Threshold: 1, StatInterval: time.Second}}, e.Rules())

	paced := []Rule{{Resource: "a", Threshold: 1}}
	for range maxPacedRules + 1 {
		paced = append(paced, Rule{Resource: "new", Threshold: float64(len(paced)), Behavior: Throttle})
	}
	assert.ErrorContains(t, e.LoadRules(paced), "exceeds 4 throttling rules")
	assert.Nil(t, e.registry.Lookup("new"), "a rule set refused for its shape creates nothing either")
	load(t, e, Rule{Resource: "b", Threshold: 1}, Rule{Resource: "c", Threshold: 1, RelatedResource: "d"})
	assert.Equal(t, 4, e.registry.Len(), "room was left for a load that fits")
}

func TestRegistryLetsIdleResourcesGo(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithMaxResources(3))
	load(t, e, Rule{Resource: "ruled", Threshold: 100})
	h, err := e.Resource("junk-0")
	require.NoError(t, err)
	en, err := h.Entry()
	require.NoError(t, err)
	en.Exit(nil)
	open, err := e.Entry("junk-1")
	require.NoError(t, err, "left in flight")
	_, err = e.Entry("junk-2")
	assert.ErrorIs(t, err, stat.ErrTooManyResources, "full, and nothing idle for a minute")

	clock.Advance(61 * time.Second)
	_, err = e.Entry("junk-2")
	require.NoError(t, err, "junk-0 was idle for a minute: it made room")
	assert.Nil(t, e.registry.Lookup("junk-0"))
	assert.NotNil(t, e.registry.Lookup("junk-1"), "in flight: kept")
	assert.NotNil(t, e.registry.Lookup("ruled"), "named by a rule: kept")

	clock.Advance(2 * time.Second) // the reclaim walk runs at most once a second
	_, err = e.Entry("junk-3")
	assert.ErrorIs(t, err, stat.ErrTooManyResources, "junk-2 is new, junk-1 busy")
	open.Exit(nil)
	clock.Advance(61 * time.Second)
	en, err = h.Entry()
	require.NoError(t, err, "the handle registers its resource again")
	en.Exit(nil)
	snap, ok := e.Snapshot("junk-0")
	require.True(t, ok)
	assert.Equal(t, 1.0, snap.PassQPS, "and counts on the new node")
}

func TestNamesAreBounded(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	huge := strings.Repeat("x", 10<<20)
	for _, name := range []string{"", huge, strings.Repeat("y", stat.MaxNameLen+1)} {
		_, err := e.Entry(name)
		assert.ErrorIs(t, err, stat.ErrInvalidName)
		assert.Less(t, len(err.Error()), 300)
		_, err = e.Resource(name)
		assert.ErrorIs(t, err, stat.ErrInvalidName)
		err = e.LoadRules([]Rule{{Resource: name, Threshold: 1}})
		assert.ErrorIs(t, err, ErrInvalidRule)
		assert.Less(t, len(err.Error()), 300)
		if name != "" {
			err = e.LoadRules([]Rule{{ID: name + "id", Resource: "api", Threshold: 1, RelatedResource: name + "rel"}})
			assert.ErrorIs(t, err, ErrInvalidRule)
			assert.Less(t, len(err.Error()), 300)
		}
	}
	assert.Zero(t, e.registry.Len())
	long := strings.Repeat("z", stat.MaxNameLen)
	load(t, e, Rule{Resource: long})
	_, err := e.Entry(long)
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Less(t, len(be.Error()), 3*stat.MaxNameLen)
}

func TestFieldsThatDoNothingAreRefused(t *testing.T) {
	for _, tc := range []struct {
		rule  Rule
		field string
	}{
		{Rule{Resource: "a", MaxQueueing: ms}, "MaxQueueing"},
		{Rule{Resource: "a", WarmUpPeriod: time.Second}, "WarmUpPeriod"},
		{Rule{Resource: "a", ColdFactor: 2}, "ColdFactor"},
		{Rule{Resource: "a", Behavior: Throttle, WarmUpPeriod: time.Second}, "WarmUpPeriod"},
		{Rule{Resource: "a", Behavior: WarmUp, WarmUpPeriod: time.Second, MaxQueueing: ms}, "MaxQueueing"},
		{Rule{Resource: "a", Metric: Concurrency, MaxQueueing: ms}, "MaxQueueing"},
		{Rule{Resource: "a", Fallback: FallbackOpen}, "Fallback"},
		{Rule{Resource: "a", LocalShare: 0.5}, "LocalShare"},
		{Rule{Resource: "a", Global: true, Fallback: FallbackClosed, LocalShare: 0.5}, "LocalShare"},
	} {
		e, _ := newEngine(t, stattest.NewClock(0), WithTokenSource(&fakeSource{}))
		var re *RuleError
		require.ErrorAs(t, e.LoadRules([]Rule{tc.rule}), &re, "%+v", tc.rule)
		assert.Equal(t, tc.field, re.Field, "%+v", tc.rule)
	}
	// What the engine fills in itself loads again unchanged.
	e, _ := newEngine(t, stattest.NewClock(0), WithTokenSource(&fakeSource{}))
	load(t, e,
		Rule{Resource: "a", Threshold: 1},
		Rule{Resource: "a", Threshold: 1, Behavior: WarmUp, WarmUpPeriod: time.Second},
		Rule{Resource: "a", Threshold: 1, Behavior: WarmUpThrottle, WarmUpPeriod: time.Second, MaxQueueing: ms},
		Rule{Resource: "a", Threshold: 1, Behavior: Throttle, MaxQueueing: ms},
		Rule{Resource: "a", Metric: Concurrency, Threshold: 1},
		Rule{Resource: "b", Threshold: 1, Global: true},
		Rule{Resource: "b", Threshold: 1, Global: true, Fallback: FallbackOpen},
		Rule{Resource: "c", Threshold: 1, RelatedResource: "a"},
	)
	rules := e.Rules()
	require.NoError(t, e.LoadRules(rules))
	assert.Equal(t, rules, e.Rules())
}

// A clock stepped back continues from where engine time was: admission
// neither stalls for the step nor gets a fresh window.
func TestClockStepsBackUnderLoad(t *testing.T) {
	clock := stattest.NewClock(5 * time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10})
	count := func() (n int) {
		for range 20 {
			if en, err := e.Entry("api"); err == nil {
				n++
				en.Exit(nil)
			}
		}
		return n
	}
	require.Equal(t, 10, count())
	clock.Advance(-3 * time.Second)
	assert.Zero(t, count(), "no window holds more than the threshold")
	clock.Advance(time.Second)
	assert.Equal(t, 10, count(), "a second later the next window opens, not 4 s later")

	clock.Advance(10 * time.Second)
	assert.Equal(t, 10, count())
	clock.Advance(-10 * time.Second)
	assert.Zero(t, count())
	clock.Advance(time.Second)
	assert.Equal(t, 10, count(), "forward and back: one second, not eleven")
}

func TestClockReadingsFarBelowZero(t *testing.T) {
	for _, start := range []int64{math.MinInt64, -5e18, -time.Hour.Nanoseconds()} {
		clock := stattest.NewClock(time.Duration(start))
		e, _ := newEngine(t, clock)
		load(t, e, Rule{Resource: "api", Threshold: 2})
		for i := range 3 {
			_, err := e.Entry("api")
			assert.Equal(t, i < 2, err == nil, "start %d, request %d", start, i)
		}
		clock.Advance(time.Second)
		_, err := e.Entry("api")
		assert.NoError(t, err, "start %d: time moves on from 0", start)
	}
}

type panicSource struct{}

func (panicSource) Acquire(context.Context, GlobalRequest) (bool, error) { panic("source bug") }

func TestPanickingCallbacksDoNotCrash(t *testing.T) {
	e, err := New(WithClock(stattest.NewClock(0)), WithTokenSource(panicSource{}),
		WithSleep(func(context.Context, time.Duration) error { panic("sleep bug") }))
	require.NoError(t, err)
	load(t, e,
		Rule{Resource: "open", Threshold: 10, Global: true, Fallback: FallbackOpen},
		Rule{Resource: "closed", Threshold: 10, Global: true, Fallback: FallbackClosed},
		Rule{Resource: "paced", Threshold: 10, Behavior: Throttle, MaxQueueing: time.Second},
	)
	_, err = e.Entry("open")
	assert.NoError(t, err, "a panic is a failure of the source: the fallback applies")
	_, err = e.Entry("closed")
	assert.ErrorIs(t, err, ErrBlocked)
	snap, _ := e.Snapshot("open")
	assert.Equal(t, int64(1), snap.Fallbacks)

	_, err = e.Entry("paced")
	require.NoError(t, err, "the first needs no wait")
	_, err = e.Entry("paced")
	assert.ErrorContains(t, err, "sleep function panicked")
	_, err = e.Entry("paced")
	assert.ErrorContains(t, err, "sleep function panicked", "the slot was given back: the next waits as long")
}

// A Concurrency rule loaded while requests are in flight counts them.
func TestConcurrencyRuleCountsWhatIsInFlight(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 100})
	open := make([]Entry, 5)
	for i := range open {
		var err error
		open[i], err = e.Entry("api")
		require.NoError(t, err)
	}
	load(t, e, Rule{Resource: "api", Threshold: 100}, Rule{Resource: "api", Metric: Concurrency, Threshold: 2})
	assert.Equal(t, int64(5), e.registry.Lookup("api").Concurrency())
	_, err := e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked, "5 in flight, limit 2")
	for i := range 3 {
		open[i].Exit(nil)
		open[i].Exit(nil) // the same Entry again: nothing
	}
	_, err = e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked, "2 in flight")
	open[3].Exit(nil)
	en, err := e.Entry("api")
	require.NoError(t, err, "1 in flight")
	_, err = e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked)
	// Removed and added again while requests are in flight: each is
	// counted once, and released once.
	load(t, e)
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 2})
	assert.Equal(t, int64(2), e.registry.Lookup("api").Concurrency())
	open[4].Exit(nil)
	en.Exit(nil)
	assert.Zero(t, e.registry.Lookup("api").Concurrency())
}

// Rule loads that add and remove a Concurrency rule race requests that
// enter under either rule set: every admission is counted at most once and
// released exactly once.
func TestConcurrencyReloadHammer(t *testing.T) {
	e, _ := newEngine(t, stat.NewMonotonic())
	var wg sync.WaitGroup
	done := make(chan struct{})
	for range 8 {
		wg.Go(func() {
			held := make([]Entry, 0, 100)
			for i := 0; ; i++ {
				select {
				case <-done:
					for _, en := range held {
						en.Exit(nil)
					}
					return
				default:
				}
				if en, err := e.Entry("api"); err == nil {
					held = append(held, en)
				}
				if len(held) == cap(held) || i%7 == 0 {
					for _, en := range held {
						en.Exit(nil)
					}
					held = held[:0]
				}
			}
		})
	}
	for i := range 200 {
		if i%2 == 0 {
			load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 50})
		} else {
			load(t, e)
		}
	}
	close(done)
	wg.Wait()
	n := e.registry.Lookup("api")
	assert.Zero(t, n.Concurrency(), "released exactly what was counted")
	assert.Zero(t, n.Inflight())
}

// jitterClock reads a base time give or take up to 2 ms, at random.
type jitterClock struct {
	base *stattest.Clock
	rng  *rand.Rand
	mu   sync.Mutex
}

func (j *jitterClock) Now() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.base.Now() + j.rng.Int64N(int64(4*time.Millisecond)) - int64(2*time.Millisecond)
}

// A clock whose readings jitter (steps back smaller than the tolerance)
// does not ratchet engine time ahead of it.
func TestJitteryClockDoesNotRatchet(t *testing.T) {
	base := stattest.NewClock(time.Second)
	clock := &jitterClock{base: base, rng: rand.New(rand.NewPCG(1, 2))}
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 100})
	admitted := 0
	for range 1000 {
		base.Advance(time.Millisecond)
		for range 10 {
			if en, err := e.Entry("api"); err == nil {
				admitted++
				en.Exit(nil)
			}
		}
	}
	assert.InDelta(t, base.Now(), e.timeSource().Now(), float64(10*time.Millisecond), "engine time stays with the clock")
	assert.LessOrEqual(t, admitted, 200, "1 s of clock time, 100/s: two windows at most")
}

// Identical rules keep state of their own, also when loaded again.
func TestIdenticalRulesKeepTheirOwnState(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	rules := []Rule{{Resource: "api", Threshold: 10, Behavior: Throttle}, {Resource: "api", Threshold: 10, Behavior: Throttle}}
	load(t, e, rules...)
	count := func() (n int) {
		for range 10 {
			clock.Advance(100 * time.Millisecond)
			if en, err := e.Entry("api"); err == nil {
				n++
				en.Exit(nil)
			}
		}
		return n
	}
	require.Equal(t, 10, count(), "two timelines at 10/s: one request per 100 ms passes both")
	load(t, e, rules...)
	assert.Equal(t, 10, count(), "loaded again: still two timelines, not one paced twice")
}

type panicBinder struct{ fakeSource }

func (*panicBinder) Bind(GlobalRequest) BoundSource { panic("bind bug") }

func TestPanickingBindRefusesTheRuleSet(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0), WithTokenSource(&panicBinder{}))
	load(t, e, Rule{Resource: "api", Threshold: 1})
	err := e.LoadRules([]Rule{{Resource: "new", Threshold: 5, Global: true}})
	assert.ErrorIs(t, err, ErrInvalidRule)
	assert.ErrorContains(t, err, "Bind panicked: bind bug")
	assert.Nil(t, e.registry.Lookup("new"), "nothing created")
	assert.Len(t, e.Rules(), 1, "the rules in force stay")
}

func TestBlockErrorMessagesAreBounded(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	name := strings.Repeat("\xff", stat.MaxNameLen)
	load(t, e, Rule{ID: name, Resource: name})
	_, err := e.Entry(name)
	require.ErrorIs(t, err, ErrBlocked)
	assert.Less(t, len(err.Error()), 800)
}

// A request that reads the new rule set while the load still counts what
// is in flight waits for the count: a new Concurrency 1 rule admits nothing
// while 100 requests are in flight, however long the walk over the slots
// (here 20,000 more admissions on another resource).
func TestNewConcurrencyRuleWaitsForTheCount(t *testing.T) {
	e, _ := newEngine(t, stat.NewMonotonic())
	open := make([]Entry, 0, 20100)
	for range 20000 {
		en, _ := e.Entry("other")
		open = append(open, en)
	}
	for range 100 {
		en, err := e.Entry("api")
		require.NoError(t, err)
		open = append(open, en)
	}
	var stop atomic.Bool
	var admitted, tries atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for !stop.Load() {
				if rr := e.rules.Load().byResource["api"]; rr == nil {
					continue // not loaded yet
				}
				tries.Add(1)
				if en, err := e.Entry("api"); err == nil {
					admitted.Add(1)
					en.Exit(nil)
				}
			}
		})
	}
	time.Sleep(5 * time.Millisecond)
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 1})
	for tries.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	stop.Store(true)
	wg.Wait()
	assert.Zero(t, admitted.Load(), "100 in flight, limit 1")
	for i := range open {
		open[i].Exit(nil)
	}
	assert.Zero(t, e.registry.Lookup("api").Concurrency())
}

// Resources are let go and registered again while requests count on them,
// through names and handles, and rule loads pin and unpin them: every
// admitted request is counted once, on the node the registry holds.
func TestReclaimLosesAndRepeatsNothing(t *testing.T) {
	var now atomic.Int64
	now.Store(int64(time.Hour))
	e, _ := newEngine(t, clockFunc(now.Load), WithMaxResources(3))
	names := []string{"r0", "r1", "r2", "r3", "r4", "r5"}
	handles := make([]*Resource, len(names))
	phases := 150
	if testing.Short() {
		phases = 30
	}
	for phase := range phases {
		now.Add(int64(62 * time.Second)) // every node of the last phase is idle
		var sent [6]atomic.Int64
		var unexpected atomic.Int64
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(phase), uint64(g)))
				for k := range 100 {
					i := rng.IntN(len(names))
					var en Entry
					var err error
					if h := handles[i]; h != nil && k%2 == 0 {
						en, err = h.Entry()
					} else {
						en, err = e.Entry(names[i])
					}
					switch {
					case err == nil:
						sent[i].Add(1)
						en.Exit(nil)
					case !errors.Is(err, stat.ErrTooManyResources):
						unexpected.Add(1)
					}
				}
			})
		}
		wg.Go(func() {
			for k := range 10 {
				_ = e.LoadRules([]Rule{{Resource: names[k%2], Threshold: 1e9}})
			}
		})
		wg.Wait()
		require.Zero(t, unexpected.Load(), "phase %d", phase)
		for i, name := range names {
			snap, ok := e.Snapshot(name)
			if n := sent[i].Load(); n > 0 {
				require.True(t, ok, "phase %d %s: sent %d, no node", phase, name, n)
				require.Equal(t, n, snap.MinutePass, "phase %d %s", phase, name)
				require.Zero(t, snap.Inflight, "phase %d %s", phase, name)
			}
		}
		if phase == 0 {
			for i, name := range names {
				handles[i], _ = e.Resource(name)
			}
		}
	}
}

// Neither a handle coming back nor a rule load passes the registry's cap.
func TestRegistryCapHoldsForHandlesAndLoads(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithMaxResources(2))
	a, err := e.Resource("a")
	require.NoError(t, err)
	_, err = e.Resource("b")
	require.NoError(t, err)
	clock.Advance(61 * time.Second)
	_, err = e.Entry("x")
	require.NoError(t, err, "a and b idle for a minute: dropped for x")
	_, err = e.Entry("y")
	require.NoError(t, err)
	_, err = a.Entry()
	assert.ErrorIs(t, err, stat.ErrTooManyResources, "x and y are new: no room for a again")
	assert.LessOrEqual(t, e.registry.Len(), e.registry.Cap())

	clock.Advance(61 * time.Second)
	e2, _ := newEngine(t, clock, WithMaxResources(3))
	_, err = e2.Entry("r0")
	require.NoError(t, err)
	clock.Advance(61 * time.Second)
	busyA, err := e2.Entry("a")
	require.NoError(t, err)
	busyB, err := e2.Entry("b")
	require.NoError(t, err)
	err = e2.LoadRules([]Rule{{Resource: "r0", Threshold: 1}, {Resource: "x", Threshold: 1}})
	assert.ErrorIs(t, err, stat.ErrTooManyResources, "r0 is named: it is not the room for x")
	assert.Equal(t, 3, e2.registry.Len())
	busyA.Exit(nil)
	busyB.Exit(nil)
}

// A throttled request whose rules are replaced during its wait, and whose
// resource is let go meanwhile, counts its pass on the live node.
func TestPassAfterAWaitLandsOnTheLiveNode(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	var e *Engine
	e, err := New(WithClock(clock), WithMaxResources(2), WithSleep(func(ctx context.Context, d time.Duration) error {
		// During the wait: the rule goes, the resource idles a minute and
		// a new one takes its room.
		if err := e.LoadRules(nil); err != nil {
			return err
		}
		clock.Advance(62 * time.Second)
		if _, err := e.Entry("other-1"); err != nil {
			return err
		}
		_, err := e.Entry("other-2")
		return err
	}))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "x", Threshold: 1, Behavior: Throttle, MaxQueueing: 10 * time.Minute})
	first, err := e.Entry("x")
	require.NoError(t, err)
	first.Exit(nil)
	en, err := e.Entry("x") // waits a second
	require.NoError(t, err)
	node := e.registry.Lookup("x")
	require.NotNil(t, node)
	assert.Same(t, node, en.node, "the admission is on the live node")
	assert.Equal(t, int64(1), node.Inflight(), "and its pass with it")
	en.Exit(nil)
	assert.Zero(t, node.Inflight())
}

func TestWarmUpTokensAreBounded(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	err := e.LoadRules([]Rule{{Resource: "api", Threshold: 1000, Behavior: WarmUp, WarmUpPeriod: 24 * time.Hour, ColdFactor: 1 + 8.64e-12}})
	var re *RuleError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, "ColdFactor", re.Field)
	load(t, e, Rule{Resource: "api", Threshold: 1000, Behavior: WarmUp, WarmUpPeriod: 24 * time.Hour, ColdFactor: 1.1})
}

// A clock of Unix nanoseconds (about 2^60.6 today) runs an engine.
func TestUnixNanoClock(t *testing.T) {
	clock := stattest.NewClock(time.Duration(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()))
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10})
	admitted := 0
	for range 4 {
		for range 20 {
			if en, err := e.Entry("api"); err == nil {
				admitted++
				en.Exit(nil)
			}
		}
		clock.Advance(time.Second)
	}
	assert.Equal(t, 40, admitted)
	assert.Equal(t, clock.Now(), e.timeSource().Now())
}

// Rule loads that add and drop a Concurrency rule on z race requests on z
// and y that share the slot rings; a rule on y loaded after them counts
// every y request still in flight, and all is released once.
func TestLaterRuleCountsEverythingInFlight(t *testing.T) {
	// More Ps than cores: goroutines are preempted between a claim and its
	// stores more often.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8))
	e, _ := newEngine(t, stat.NewMonotonic())
	y, err := e.registry.Node("y")
	require.NoError(t, err)
	phases := 100
	if testing.Short() {
		phases = 10
	}
	for phase := range phases {
		var stop atomic.Bool
		var wg sync.WaitGroup
		var heldY atomic.Int64
		held := make([][]Entry, 4)
		for g := range 4 {
			wg.Go(func() {
				for k := 0; !stop.Load(); k++ {
					name := "z"
					if k%2 == 1 {
						name = "y"
					}
					en, err := e.Entry(name)
					if err != nil {
						continue
					}
					if name == "y" && k%16 == 1 {
						held[g] = append(held[g], en)
						heldY.Inc()
						continue
					}
					en.Exit(nil)
				}
			})
		}
		for range 100 {
			load(t, e, Rule{Resource: "z", Metric: Concurrency, Threshold: 1e6})
			load(t, e)
		}
		stop.Store(true)
		wg.Wait()
		load(t, e, Rule{Resource: "y", Metric: Concurrency, Threshold: 1e6})
		assert.Equal(t, heldY.Load(), y.Concurrency(), "phase %d: every y request in flight counted", phase)
		load(t, e)
		for _, h := range held {
			for i := range h {
				h[i].Exit(nil)
			}
		}
		require.Zero(t, y.Concurrency(), "phase %d", phase)
		require.Zero(t, e.registry.Lookup("z").Concurrency(), "phase %d", phase)
	}
}

// A Concurrency rule loaded long after requests were admitted (their
// buckets long retired) still counts them, and their Exits end the count.
func TestConcurrencyRuleCountsRequestsAdmittedLongBefore(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	open := make([]Entry, 3)
	for i := range open {
		var err error
		open[i], err = e.Entry("api")
		require.NoError(t, err)
	}
	clock.Advance(2 * time.Minute)
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 3})
	_, err := e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked, "3 in flight, limit 3")
	open[0].Exit(nil)
	en, err := e.Entry("api")
	require.NoError(t, err, "2 in flight")
	_, err = e.Entry("api")
	assert.ErrorIs(t, err, ErrBlocked)
	open[1].Exit(nil)
	open[2].Exit(nil)
	en.Exit(nil)
	assert.Zero(t, e.registry.Lookup("api").Concurrency(), "every count ended")
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 3}, Rule{Resource: "api", Threshold: 100})
	assert.Zero(t, e.registry.Lookup("api").Concurrency(), "a rule kept adopts nothing again")
}

// An Entry never exited retains nothing when its admission holds nothing:
// a million of them leave the heap where it was.
func TestUnexitedEntriesRetainNoMemory(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 1e12})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 1_000_000 {
		if _, err := e.Entry("api"); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	assert.Less(t, int64(after.HeapAlloc)-int64(before.HeapAlloc), int64(1<<20), "under 1 MiB for a million Entries never exited")
}

// A request whose window admission counted its pass, then gave it back
// (its wait was cancelled), ends its part of a count that a Concurrency
// rule loaded in between adopted: the count returns to 0.
func TestAdoptedPassGivenBackEndsItsCount(t *testing.T) {
	clock := stattest.NewClock(0)
	entered := make(chan struct{}, 1)
	release := make(chan struct{})
	e, err := New(WithClock(clock), WithSleep(func(ctx context.Context, d time.Duration) error {
		entered <- struct{}{}
		<-release
		return context.Canceled
	}))
	require.NoError(t, err)
	old := []Rule{{Resource: "api", Threshold: 1000}, {Resource: "api", Behavior: Throttle, Threshold: 10, MaxQueueing: time.Second}}
	load(t, e, old...)
	en, err := e.Entry("api")
	require.NoError(t, err)
	en.Exit(nil)
	done := make(chan error)
	go func() {
		_, err := e.Entry("api") // queued 100 ms behind the first
		done <- err
	}()
	<-entered
	node := e.registry.Lookup("api")
	require.Equal(t, int64(1), node.Inflight(), "its pass is counted while it waits")
	load(t, e, append(old, Rule{Resource: "api", Metric: Concurrency, Threshold: 1})...)
	assert.Equal(t, int64(1), node.Concurrency(), "adopted")
	close(release)
	assert.ErrorIs(t, <-done, context.Canceled)
	assert.Zero(t, node.Inflight())
	assert.Zero(t, node.Concurrency(), "nothing in flight")
	assert.Zero(t, e.adopting.Load(), "no node holds adopted requests")
}

// Exits racing the count a Concurrency rule adopts end exactly what it
// counted: once every request exited, nothing is left.
func TestExitsRacingAnAdoptionLeaveNothing(t *testing.T) {
	e, _ := newEngine(t, stat.NewMonotonic())
	rounds := 300
	if testing.Short() {
		rounds = 50
	}
	for round := range rounds {
		name := fmt.Sprintf("r%d", round)
		ens := make([]Entry, 8)
		for i := range ens {
			var err error
			ens[i], err = e.Entry(name)
			require.NoError(t, err)
		}
		var wg sync.WaitGroup
		for i := range ens {
			wg.Go(func() { ens[i].Exit(nil) })
		}
		load(t, e, Rule{Resource: name, Metric: Concurrency, Threshold: 100})
		wg.Wait()
		require.Zero(t, e.registry.Lookup(name).Concurrency(), "round %d: nothing in flight", round)
	}
	assert.Zero(t, e.adopting.Load(), "no node holds adopted requests")
}

// A request whose node the registry lets go while it is admitted (a reload
// removed its rule and a new resource needed the room) counts its pass and
// its concurrency on the live node, where its Exit gives them back: no node
// is left counting a request that exited.
func TestConcurrencyFollowsARecountedPass(t *testing.T) {
	for _, rules := range [][]Rule{
		{{Resource: "r", Threshold: 5, Metric: Concurrency}},
		{{Resource: "r", Threshold: 5, Metric: Concurrency}, {Resource: "r", Threshold: 100}},
	} {
		now := int64(time.Hour)
		var hook func()
		e, err := New(WithMaxResources(1), WithClock(clockFunc(func() int64 {
			if h := hook; h != nil {
				hook = nil
				h()
			}
			return now
		})))
		require.NoError(t, err)
		load(t, e, rules...)
		now += int64(2 * time.Minute)
		hook = func() { // while r's request is being admitted
			require.NoError(t, e.LoadRules(nil))
			y, err := e.Entry("y") // r's idle node goes for y
			require.NoError(t, err)
			y.Exit(nil)
		}
		en, err := e.Entry("r", WithCount(1))
		require.NoError(t, err)
		en.Exit(nil)
		n := e.registry.Lookup("r")
		require.NotNil(t, n)
		assert.Zero(t, n.Concurrency(), "%v", rules)
		assert.Zero(t, n.Inflight(), "%v", rules)
	}
}

// A reservation whose borrowed bucket was folded into the resource's
// window before a Concurrency rule adopted what was in flight, then
// cancelled, ends its part of the adopted count: the rule admits its whole
// threshold again once nothing is in flight.
func TestCancelledBorrowEndsItsAdoptedCount(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, err := New(WithClock(clock), WithSleep(func(ctx context.Context, _ time.Duration) error { return ctx.Err() }))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "r", Threshold: 1})
	en, err := e.Entry("r")
	require.NoError(t, err)
	en.Exit(nil)
	res, err := e.Reserve("r", WithWait(2*time.Second))
	require.NoError(t, err)
	clock.Advance(res.Delay())
	_, err = e.Allow("r") // makes the borrowed bucket: the borrow folds in
	require.ErrorIs(t, err, ErrBlocked)
	require.Equal(t, int64(1), e.registry.Lookup("r").Inflight(), "the folded borrow is in flight")
	load(t, e, Rule{Resource: "r", Threshold: 1}, Rule{Resource: "r", Threshold: 2, Metric: Concurrency})
	res.Cancel()
	n := e.registry.Lookup("r")
	assert.Zero(t, n.Inflight())
	assert.Zero(t, n.Concurrency(), "the adopted count ended with the cancel")
	clock.Advance(time.Hour)
	en, err = e.Entry("r")
	require.NoError(t, err)
	en.Exit(nil)
}

// TestNilAndZeroEnginesSaySo: every method of a nil or zero Engine panics
// with a message that says to call New, not with a nil dereference.
func TestNilAndZeroEnginesSaySo(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for name, e := range map[string]*Engine{"nil": nil, "zero": new(Engine)} {
		calls := map[string]func(){
			"Entry":      func() { _, _ = e.Entry("r") },
			"Allow":      func() { _, _ = e.Allow("r") },
			"Wait":       func() { _, _ = e.Wait(context.Background(), "r") },
			"Wait ended": func() { _, _ = e.Wait(ended, "r") },
			"Reserve":    func() { _, _ = e.Reserve("r") },
			"Resource":   func() { _, _ = e.Resource("r") },
			"LoadRules":  func() { _ = e.LoadRules(nil) },
			"CheckRules": func() { _, _ = e.CheckRules(nil) },
			"Rules":      func() { _ = e.Rules() },
			"Snapshot":   func() { _, _ = e.Snapshot("r") },
			"Policy":     func() { _, _, _, _ = e.Policy("r") },
			"DryRuns":    func() { _ = e.DryRuns() },
			"Feed":       func() { _ = e.Feed() },
		}
		for call, fn := range calls {
			assert.PanicsWithValue(t, errNoEngine, fn, "%s engine, %s", name, call)
		}
	}
}

// TestFractionalThresholdsOfWindowsAreRefused: a window rule whose
// threshold is not a whole number of requests per window (0.5/s and
// 2.5/s over 1 s) is refused, naming the field and saying how to write it
// (a longer window, or GCRA); a whole count per window (0.5/s over 2 s,
// 0.29/s over 100 s despite floating point) and rate rules (GCRA,
// Throttle) with fractions load.
func TestFractionalThresholdsOfWindowsAreRefused(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	for _, tc := range []struct {
		r     Rule
		field string
		hint  string
	}{
		{Rule{Resource: "a", Threshold: 0.5}, "Threshold", "StatInterval 2s (1 per 2s)"},
		{Rule{Resource: "a", Threshold: 2.5}, "Threshold", "StatInterval 2s (5 per 2s)"},
		{Rule{Resource: "a", Threshold: 2.5, Behavior: WarmUp, WarmUpPeriod: time.Second}, "Threshold", "StatInterval 2s"},
		{Rule{Resource: "a", Threshold: 0.5, PerKey: true}, "Threshold", "StatInterval 2s"},
		{Rule{Resource: "a", Threshold: 0.5, Global: true}, "Threshold", "StatInterval 2s"},
		{Rule{Resource: "a", Threshold: 2, PerKey: true, Keys: []KeyLimit{{Key: "k", Threshold: 0.5}}}, "Keys[0].Threshold", "StatInterval 2s"},
		{Rule{Resource: "a", Threshold: 3, StatInterval: 500 * time.Millisecond}, "Threshold", "StatInterval 1s (3 per 1s)"},
	} {
		err := e.LoadRules([]Rule{tc.r})
		var re *RuleError
		require.ErrorAs(t, err, &re, "%+v", tc.r)
		assert.Equal(t, tc.field, re.Field, "%+v", tc.r)
		assert.Contains(t, err.Error(), tc.hint)
		assert.Contains(t, err.Error(), "GCRA")
	}
	load(t, e,
		Rule{Resource: "half", Threshold: 0.5, StatInterval: 2 * time.Second},
		Rule{Resource: "odd", Threshold: 0.29, StatInterval: 100 * time.Second},
		Rule{Resource: "gcra", Threshold: 0.5, Behavior: GCRA, Burst: 1},
		Rule{Resource: "paced", Threshold: 2.5, Behavior: Throttle},
	)
	quota, _ := mustBE(t, e, "odd").Quota()
	assert.Equal(t, int64(29), quota, "0.29 x 100 s is 29, not 28")
	assert.True(t, try(e, "half"))
	assert.False(t, try(e, "half"), "1 per 2 s")
}

// mustBE is the BlockError of resource's first window group.
func mustBE(t *testing.T, e *Engine, resource string) *BlockError {
	t.Helper()
	rr := e.rules.Load().byResource[resource]
	require.NotNil(t, rr)
	require.NotEmpty(t, rr.groups)
	return rr.groups[0].staticBE
}

// TestCheckAndLoadRefuseTooManyResourcesAlike: a rule set naming more
// resources than the engine holds is refused by CheckRules as by
// LoadRules, with an error that names the cap, not a rule.
func TestCheckAndLoadRefuseTooManyResourcesAlike(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0), WithMaxResources(10))
	var rules []Rule
	for i := range 12 {
		rules = append(rules, Rule{Resource: fmt.Sprint("r", i), Threshold: 5})
	}
	for name, fn := range map[string]func() error{
		"CheckRules": func() error { _, err := e.CheckRules(rules); return err },
		"LoadRules":  func() error { return e.LoadRules(rules) },
	} {
		err := fn()
		require.ErrorIs(t, err, stat.ErrTooManyResources, name)
		assert.Contains(t, err.Error(), "names 12 resources, more than the engine holds (WithMaxResources 10)", name)
		assert.NotContains(t, err.Error(), "r0", name)
	}
	_, err := e.CheckRules(rules[:10])
	assert.NoError(t, err)
}
