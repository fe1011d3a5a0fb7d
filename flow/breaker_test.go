package flow

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat/stattest"
)

var errDependency = errors.New("dependency failed")

// changes records what a breaker listener is told.
type changes struct {
	mu  sync.Mutex
	all []BreakerChange
}

func (c *changes) add(ch BreakerChange) {
	c.mu.Lock()
	c.all = append(c.all, ch)
	c.mu.Unlock()
}

func (c *changes) moves() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, ch := range c.all {
		out = append(out, ch.From.String()+">"+ch.To.String())
	}
	return out
}

// fail enters resource and exits with an error; it reports whether the
// request was admitted.
func fail(e *Engine, resource string) bool {
	en, err := e.Entry(resource)
	if err != nil {
		return false
	}
	en.Exit(errDependency)
	return true
}

// An error-count breaker through the engine, on a fake clock: failures
// open it; open, it refuses with its own reason, state and the time until
// the next probe; then exactly one probe goes, and the others are refused
// as half-open; a good probe closes it. The listener hears each change
// once.
func TestBreakerOpensProbesAndCloses(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var heard changes
	e, _ := newEngine(t, clock, WithBreakerListener(heard.add))
	load(t, e, Rule{ID: "dep-breaker", Resource: "dep", Breaker: ErrorCount, Threshold: 2, RetryTimeout: 5 * time.Second})

	require.True(t, fail(e, "dep"))
	require.True(t, try(e, "dep"), "one failure of two")
	require.True(t, fail(e, "dep"))
	clock.Advance(time.Second)
	en, err := e.Entry("dep")
	require.ErrorIs(t, err, ErrBlocked)
	rf := en.Refusal()
	assert.Equal(t, ReasonBreaker, rf.Err.Reason)
	assert.Equal(t, BreakerOpen, rf.Breaker)
	assert.Equal(t, 4*time.Second, rf.RetryAfter, "until the next probe")
	assert.Contains(t, err.Error(), "ErrorCount breaker, open")

	clock.Advance(4 * time.Second)
	probe, err := e.Entry("dep")
	require.NoError(t, err, "the probe")
	en, err = e.Entry("dep")
	require.ErrorIs(t, err, ErrBlocked)
	assert.Equal(t, BreakerHalfOpen, en.Refusal().Breaker)
	assert.Equal(t, 5*time.Second, en.Refusal().RetryAfter, "the probe holds its place for ProbeTimeout (RetryTimeout by default)")
	clock.Advance(30 * time.Millisecond)
	probe.Exit(nil)
	assert.True(t, try(e, "dep"), "closed")
	assert.True(t, fail(e, "dep"), "closed, its window afresh: one failure")
	assert.True(t, try(e, "dep"))

	assert.Equal(t, []string{"Closed>Open", "Open>HalfOpen", "HalfOpen>Closed"}, heard.moves())
	heard.mu.Lock()
	defer heard.mu.Unlock()
	assert.Equal(t, BreakerChange{Resource: "dep", Rule: "dep-breaker", From: BreakerClosed, To: BreakerOpen, Value: 2, At: time.Second}, heard.all[0])
	assert.Equal(t, float64(30*time.Millisecond), heard.all[2].Value, "the probe's response time")
}

// A failed probe opens the breaker again; a probe that never exits gives
// its place to the next request after ProbeTimeout; a slow-ratio breaker
// counts slow completions, not errors.
func TestBreakerProbeOutcomesAndTimeout(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "slow", Breaker: SlowRatio, Threshold: 0.5, MaxRT: 100 * time.Millisecond, MinRequests: 2,
		RetryTimeout: time.Second, ProbeTimeout: 2 * time.Second})
	exitAfter := func(d time.Duration, err error) bool {
		en, e2 := e.Entry("slow")
		if e2 != nil {
			return false
		}
		clock.Advance(d)
		en.Exit(err)
		return true
	}
	require.True(t, exitAfter(10*time.Millisecond, errDependency), "fast: an error is not slow")
	require.True(t, exitAfter(10*time.Millisecond, nil))
	require.True(t, exitAfter(150*time.Millisecond, nil), "1 slow of 3")
	require.True(t, exitAfter(150*time.Millisecond, nil), "2 slow of 4: open")
	assert.False(t, try(e, "slow"))

	clock.Advance(time.Second)
	require.True(t, exitAfter(101*time.Millisecond, nil), "a slow probe")
	assert.False(t, try(e, "slow"), "open again")

	clock.Advance(time.Second)
	_, err := e.Entry("slow") // a probe that never exits
	require.NoError(t, err)
	clock.Advance(1999 * time.Millisecond)
	assert.False(t, try(e, "slow"), "the probe holds its place")
	clock.Advance(time.Millisecond)
	require.True(t, exitAfter(time.Millisecond, nil), "its place, given to the next request: a fast probe")
	assert.True(t, try(e, "slow"), "closed")
}

// However many goroutines arrive at once when the retry timeout has passed,
// the engine admits exactly one of them, the probe.
func TestBreakerAdmitsExactlyOneProbeAtAnyConcurrency(t *testing.T) {
	for _, g := range []int{1, 2, 8, 64, 256, 1024} {
		clock := stattest.NewClock(time.Second)
		e, _ := newEngine(t, clock)
		load(t, e, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Second})
		require.True(t, fail(e, "dep"))
		for round := range 3 {
			clock.Advance(time.Second)
			var admitted atomic.Int64
			var probes sync.Map
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range g {
				wg.Go(func() {
					<-start
					if en, err := e.Entry("dep"); err == nil {
						admitted.Inc()
						probes.Store(i, en)
					}
				})
			}
			close(start)
			wg.Wait()
			require.EqualValues(t, 1, admitted.Load(), "g=%d round %d", g, round)
			probes.Range(func(_, v any) bool {
				en := v.(Entry)
				en.Exit(errDependency) // open again
				return true
			})
		}
	}
}

// Allow cannot count a completion: on a resource with a breaker it is
// refused as on one with a Concurrency rule.
func TestAllowOnABreakerNeedsExit(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Second))
	load(t, e, Rule{Resource: "dep", Breaker: ErrorRatio, Threshold: 0.5, MinRequests: 10, RetryTimeout: time.Second},
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 10})
	_, err := e.Allow("dep")
	require.ErrorIs(t, err, ErrNeedsExit)
	_, errConc := e.Allow("conc")
	require.ErrorIs(t, errConc, ErrNeedsExit)
}

// A reload that keeps a breaker rule keeps its state; one that changes it
// starts it afresh, closed.
func TestBreakerStateSurvivesAReloadThatKeepsItsRule(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	rule := Rule{ID: "b", Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Minute}
	load(t, e, rule, Rule{Resource: "other", Threshold: 10})
	require.True(t, fail(e, "dep"))
	require.False(t, try(e, "dep"))
	load(t, e, rule) // the other rule goes
	assert.False(t, try(e, "dep"), "still open")
	rule.Threshold = 2
	load(t, e, rule)
	assert.True(t, try(e, "dep"), "a changed rule starts closed")
}

// A breaker beside a Concurrency rule counts the completions of the
// requests that rule counted (their Entry claims a slot).
func TestBreakerCountsBesideAConcurrencyRule(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Second))
	load(t, e, Rule{Resource: "dep", Metric: Concurrency, Threshold: 5},
		Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 2, RetryTimeout: time.Second})
	require.True(t, fail(e, "dep"))
	require.True(t, fail(e, "dep"))
	en, err := e.Entry("dep")
	require.ErrorIs(t, err, ErrBlocked)
	assert.Equal(t, ReasonBreaker, en.Refusal().Err.Reason)
}

// A probe that a later rule refuses gives its place back: the next request
// may be the probe.
func TestAProbeRefusedByAnotherRuleGivesItsPlaceBack(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	src := &fakeSource{}
	e, _ := newEngine(t, clock, WithTokenSource(src))
	load(t, e, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Second},
		Rule{Resource: "dep", Threshold: 100, Global: true, Fallback: FallbackClosed})
	src.allow.Store(true)
	require.True(t, fail(e, "dep"), "open")
	clock.Advance(time.Second)
	src.allow.Store(false)
	assert.False(t, try(e, "dep"), "the probe, refused by the Global rule")
	src.allow.Store(true)
	assert.True(t, try(e, "dep"), "the next request is the probe")
}

// Bad breaker rules are refused naming the field, and change nothing.
func TestBadBreakerRulesAreRefused(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Second))
	good := Rule{Resource: "dep", Breaker: ErrorRatio, Threshold: 0.5, MinRequests: 5, RetryTimeout: time.Second}
	load(t, e, good)
	for _, tc := range []struct {
		field string
		edit  func(r *Rule)
	}{
		{"Threshold", func(r *Rule) { r.Threshold = 1.5 }},
		{"MinRequests", func(r *Rule) { r.MinRequests = 0 }},
		{"RetryTimeout", func(r *Rule) { r.RetryTimeout = 0 }},
		{"ProbeTimeout", func(r *Rule) { r.ProbeTimeout = -time.Second }},
		{"MaxRT", func(r *Rule) { r.Breaker, r.MaxRT = SlowRatio, -time.Millisecond }},
		{"MaxRT", func(r *Rule) { r.MaxRT = time.Millisecond }},
		{"Breaker", func(r *Rule) { r.Breaker = 9 }},
		{"Breaker", func(r *Rule) { r.PerKey = true }},
		{"Threshold", func(r *Rule) { r.Breaker, r.Threshold = ErrorCount, 2.5 }},
		{"StatInterval", func(r *Rule) { r.Buckets = 7 }},
		{"Buckets", func(r *Rule) { r.Buckets = 101 }},
		{"MinRequests", func(r *Rule) { r.Breaker, r.Threshold, r.RetryTimeout = NotBreaker, 5, 0 }},
	} {
		bad := good
		tc.edit(&bad)
		err := e.LoadRules([]Rule{{Resource: "other", Threshold: 1}, bad})
		var re *RuleError
		require.ErrorAs(t, err, &re, "%+v", bad)
		assert.Equal(t, tc.field, re.Field, "%v", err)
		assert.Equal(t, 1, re.Index)
	}
	assert.Len(t, e.Rules(), 1, "nothing changed")
}

// Entry and Exit on a resource with a breaker allocate nothing, closed or
// refusing.
func TestBreakerEntryExitAllocatesNothing(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "dep", Threshold: 1e9},
		Rule{Resource: "dep", Breaker: SlowRatio, Threshold: 0.5, MaxRT: time.Second, MinRequests: 5, RetryTimeout: time.Second},
		Rule{Resource: "open", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Hour})
	r, err := e.Resource("dep")
	require.NoError(t, err)
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		en, err := r.Entry()
		if err == nil {
			en.Exit(nil)
		}
	}))
	require.True(t, fail(e, "open"))
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		en, _ := e.Entry("open")
		_ = en.Refusal()
	}))
}

// A request admitted while closed for a later instant (WithWait), that
// exits while the breaker is half-open at that instant, is not the probe:
// only the probe's completion ends the half-open period.
func TestARequestWaitingForTheProbesInstantIsNotTheProbe(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var heard changes
	e, _ := newEngine(t, clock, WithBreakerListener(heard.add))
	load(t, e, Rule{Resource: "dep", Threshold: 4},
		Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: 500 * time.Millisecond})
	c, err := e.Entry("dep")
	require.NoError(t, err)
	for range 3 {
		require.True(t, try(e, "dep")) // the window (4/s) is full
	}
	a, err := e.Entry("dep", WithWait(5*time.Second))
	require.NoError(t, err, "waits for the next window")
	t.Logf("A.Start=%v", time.Duration(a.Start()))
	c.Exit(errDependency) // opens at 1s
	require.False(t, try(e, "dep"), "open")

	clock.Set(time.Duration(a.Start()))
	p, err := e.Entry("dep") // the probe, at S
	require.NoError(t, err, "the probe")
	t.Logf("P.Start=%v", time.Duration(p.Start()))
	clock.Advance(10 * time.Millisecond)
	a.Exit(nil) // admitted before the breaker opened: should count for nothing
	t.Logf("moves after A's exit: %v", heard.moves())
	assert.Equal(t, []string{"Closed>Open", "Open>HalfOpen"}, heard.moves(), "A is not the probe")
	clock.Advance(10 * time.Millisecond)
	p.Exit(errDependency) // the real probe fails
	t.Logf("moves after P's failed exit: %v", heard.moves())
	assert.False(t, try(e, "dep"), "the probe failed: open again")
}

// Requests waiting for the probe's bucket, admitted while closed, leave
// the probe's outcome to the probe.
func TestWaitersOfOneBucketLeaveTheProbeItsOwnOutcome(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var heard changes
	e, _ := newEngine(t, clock, WithBreakerListener(heard.add))
	load(t, e, Rule{Resource: "dep", Threshold: 4},
		Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: 300 * time.Millisecond})
	c, err := e.Entry("dep")
	require.NoError(t, err)
	for range 3 {
		require.True(t, try(e, "dep"))
	}
	a, err := e.Entry("dep", WithWait(5*time.Second))
	require.NoError(t, err)
	clock.Advance(100 * time.Millisecond)
	c.Exit(errDependency)                                    // open at 1.1s
	clock.Advance(300*time.Millisecond + 3*time.Millisecond) // 1.403s: past the retry timeout, before A's start
	p, err := e.Entry("dep", WithWait(5*time.Second))
	require.NoError(t, err, "the probe, waiting for the same bucket")
	t.Logf("A.Start=%v P.Start=%v", time.Duration(a.Start()), time.Duration(p.Start()))
	clock.Set(time.Duration(a.Start()) + 5*time.Millisecond)
	a.Exit(nil)
	assert.Equal(t, []string{"Closed>Open", "Open>HalfOpen"}, heard.moves(), "A (admitted while closed) is not the probe")
	p.Exit(errDependency)
	t.Logf("moves: %v", heard.moves())
	assert.False(t, try(e, "dep"), "the probe failed: open again")
}

// A reservation admitted while closed for the probe's instant is not the
// probe.
func TestAReservationIsNotTakenForTheProbe(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var heard changes
	e, _ := newEngine(t, clock, WithBreakerListener(heard.add))
	load(t, e, Rule{Resource: "dep", Threshold: 2},
		Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: 500 * time.Millisecond})
	c, err := e.Entry("dep")
	require.NoError(t, err)
	require.True(t, try(e, "dep"))
	r, err := e.Reserve("dep", WithWait(5*time.Second))
	require.NoError(t, err)
	c.Exit(errDependency)
	clock.Advance(r.Delay())
	p, err := e.Entry("dep")
	require.NoError(t, err, "the probe")
	a, err := r.Entry()
	require.NoError(t, err, "the reservation goes through the open breaker")
	a.Exit(nil)
	assert.Equal(t, []string{"Closed>Open", "Open>HalfOpen"}, heard.moves())
	p.Exit(errDependency)
	assert.False(t, try(e, "dep"), "the probe failed: open again")
}

// A probe given back (a later rule refused it) frees its place at once,
// however early in the engine's time.
func TestAProbeGivenBackEarlyInEngineTimeFreesItsPlace(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	src := &fakeSource{}
	e, _ := newEngine(t, clock, WithTokenSource(src))
	load(t, e, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Second, ProbeTimeout: time.Minute},
		Rule{Resource: "dep", Threshold: 100, Global: true, Fallback: FallbackClosed})
	src.allow.Store(true)
	require.True(t, fail(e, "dep"), "open")
	clock.Advance(time.Second)
	src.allow.Store(false)
	assert.False(t, try(e, "dep"), "the probe, refused by the Global rule")
	src.allow.Store(true)
	en, err := e.Entry("dep")
	if err != nil {
		t.Logf("refused: %v retryAfter=%v", err, en.Refusal().RetryAfter)
	}
	assert.NoError(t, err, "the next request is the probe")
}

// A reload that changes an open breaker's rule reports it closed.
func TestAReloadThatChangesAnOpenBreakerReportsItClosed(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var heard changes
	e, _ := newEngine(t, clock, WithBreakerListener(heard.add))
	rule := Rule{ID: "b", Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Minute}
	load(t, e, rule)
	require.True(t, fail(e, "dep"))
	require.False(t, try(e, "dep"))
	rule.Threshold = 2
	load(t, e, rule)
	require.True(t, try(e, "dep"), "closed now")
	t.Logf("heard: %v", heard.moves())
	assert.Equal(t, []string{"Closed>Open", "Open>Closed"}, heard.moves(), "the listener should hear it close")
}

// A breaker replaced by a reload reports nothing more, whatever its
// requests in flight do at Exit.
func TestAReplacedBreakerReportsNothing(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var heard changes
	e, _ := newEngine(t, clock, WithBreakerListener(heard.add))
	rule := Rule{ID: "b", Resource: "dep", Breaker: ErrorCount, Threshold: 2, RetryTimeout: time.Minute}
	load(t, e, rule)
	inflight := make([]Entry, 3)
	for i := range inflight {
		var err error
		inflight[i], err = e.Entry("dep")
		require.NoError(t, err)
	}
	rule.Threshold = 3 // changed: a fresh breaker
	load(t, e, rule)
	inflight[0].Exit(errDependency)
	inflight[1].Exit(errDependency) // the old breaker trips
	t.Logf("heard: %v", heard.moves())
	assert.True(t, try(e, "dep"), "the breaker in force is closed")
	assert.Empty(t, heard.moves(), "nothing changed in the breaker in force")
}

// A listener's panic is dropped: the request that made the change
// completes, and the breaker goes on.
func TestAListenersPanicIsDropped(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	boom := false
	e, _ := newEngine(t, clock, WithBreakerListener(func(c BreakerChange) {
		if boom {
			panic("listener")
		}
	}))
	load(t, e, Rule{Resource: "dep", Threshold: 100},
		Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Second, ProbeTimeout: time.Minute})
	require.True(t, fail(e, "dep"))
	clock.Advance(time.Second)
	boom = true
	func() {
		defer func() { t.Logf("recovered: %v", recover()) }()
		_, _ = e.Entry("dep")
	}()
	boom = false
	en, err := e.Entry("dep")
	if err != nil {
		t.Logf("after the panic: %v, retry %v", err, en.Refusal().RetryAfter)
	}
	s, _ := e.Snapshot("dep")
	t.Logf("snapshot after: %+v", s)
}

// A listener may enter requests itself.
func TestAListenerMayEnter(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var e *Engine
	calls := 0
	e, _ = newEngine(t, clock, WithBreakerListener(func(c BreakerChange) {
		calls++
		if calls > 5 {
			return
		}
		if en, err := e.Entry("dep"); err == nil {
			en.Exit(nil)
		}
		_ = e.LoadRules(e.Rules())
	}))
	load(t, e, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Second})
	require.True(t, fail(e, "dep"))
	clock.Advance(time.Second)
	assert.True(t, try(e, "dep"))
	t.Logf("calls %d", calls)
}

// A completion a bucket behind (a small clock step back) is counted, one
// bucket or many.
func TestACompletionBehindItsBucketIsCounted(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 3, StatInterval: 100 * time.Millisecond, Buckets: 1, RetryTimeout: time.Second})
	clock.Set(time.Second + 250*time.Millisecond)
	require.True(t, fail(e, "dep"))
	require.True(t, fail(e, "dep"))
	clock.Set(time.Second + 190*time.Millisecond) // back 60 ms
	require.True(t, fail(e, "dep"))
	clock.Set(time.Second + 250*time.Millisecond)
	require.True(t, fail(e, "dep"))
	assert.False(t, try(e, "dep"), "4 failures within 100 ms: open")
}

// A probe taken for a later instant whose wait is cancelled frees its
// place at once.
func TestACancelledWaitingProbeFreesItsPlaceAtOnce(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "dep", Threshold: 10, StatInterval: 10 * time.Second},
		Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 1, RetryTimeout: time.Second, ProbeTimeout: time.Second})
	for range 60 {
		require.True(t, try(e, "dep"))
	}
	require.True(t, fail(e, "dep")) // open; 61 of 100 used
	clock.Advance(time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w, err := e.Entry("dep", WithCount(50), WithWait(time.Hour), WithContext(ctx))
	t.Logf("W: start %v err %v", time.Duration(w.Start()), err)
	require.ErrorIs(t, err, context.Canceled)
	en, err := e.Entry("dep")
	if err != nil {
		t.Logf("refused: %v, retry %v", err, en.Refusal().RetryAfter)
	}
	assert.NoError(t, err, "no probe is out: this one is the probe")
}

// MarkError makes Exit count a failure whatever it is given: an Exception
// in the statistics and a failure for the breakers, on an Entry that
// holds nothing and on one that claimed a slot; a blocked or exited Entry
// ignores it.
func TestMarkErrorCountsAFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rules []Rule
	}{
		{"holds nothing", nil},
		{"claims a slot", []Rule{{Resource: "dep", Metric: Concurrency, Threshold: 5}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := stattest.NewClock(time.Second)
			e, _ := newEngine(t, clock)
			load(t, e, append(tc.rules, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 2, RetryTimeout: time.Second})...)
			good, err := e.Entry("dep")
			require.NoError(t, err)
			good.Exit(nil)
			for range 2 {
				en, err := e.Entry("dep")
				require.NoError(t, err)
				en.MarkError()
				en.Exit(nil)
				en.MarkError() // exited: nothing
				en.Exit(nil)
			}
			en, err := e.Entry("dep")
			require.ErrorIs(t, err, ErrBlocked, "two marked failures open it")
			assert.Equal(t, ReasonBreaker, en.Refusal().Err.Reason)
			en.MarkError() // blocked: nothing
			en.Exit(nil)
			snap, ok := e.Snapshot("dep")
			require.True(t, ok)
			assert.Equal(t, 2.0, snap.ExceptionQPS, "the marked exits, once each")
			assert.Equal(t, 3.0, snap.SuccessQPS)
		})
	}
}

// Breakers reads each breaker's state, the time until its next probe, its
// transitions (kept by a reload that keeps the rule), what last tripped
// it and its window.
func TestBreakersReadsStateTransitionsAndWindow(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	rules := []Rule{{Resource: "other", Threshold: 10},
		{ID: "dep-breaker", Resource: "dep", Breaker: ErrorRatio, Threshold: 0.5, MinRequests: 4, RetryTimeout: 5 * time.Second}}
	load(t, e, rules...)
	require.True(t, try(e, "dep"))
	require.True(t, fail(e, "dep"))
	bs := e.Breakers()
	require.Len(t, bs, 1)
	assert.Equal(t, "dep-breaker", bs[0].Rule.ID)
	assert.Equal(t, BreakerClosed, bs[0].State)
	assert.Equal(t, time.Second, bs[0].Since, "closed since the load")
	assert.Equal(t, [2]int64{2, 1}, [2]int64{bs[0].Completed, bs[0].Failed})

	clock.Advance(500 * time.Millisecond)
	require.True(t, fail(e, "dep"))
	require.True(t, fail(e, "dep"), "3 of 4 failed in its second: it opens")
	clock.Advance(time.Second)
	load(t, e, rules...) // keeps the rule
	bs = e.Breakers()
	require.Len(t, bs, 1)
	assert.Equal(t, BreakerOpen, bs[0].State)
	assert.Equal(t, 1500*time.Millisecond, bs[0].Since)
	assert.Equal(t, 4*time.Second, bs[0].RetryAfter)
	assert.Equal(t, [3]int64{0, 1, 0}, bs[0].Transitions)
	assert.Equal(t, 0.75, bs[0].Tripped)

	clock.Advance(4*time.Second - 1)
	require.False(t, try(e, "dep"))
	clock.Advance(1)
	require.True(t, try(e, "dep"), "the probe closes it")
	bs = e.Breakers()
	assert.Equal(t, BreakerClosed, bs[0].State)
	assert.Equal(t, [3]int64{1, 1, 1}, bs[0].Transitions, "closed, open, half-open: one each")
	assert.Equal(t, [2]int64{0, 0}, [2]int64{bs[0].Completed, bs[0].Failed}, "a closing probe clears the window")

	load(t, e, rules[0])
	assert.Empty(t, e.Breakers())
}

// A breaker counts failures after any idle spell or clock jump: its
// buckets' epochs wrap every 2^20 buckets, and a cell left from before
// must read as old, not as a newer bucket that Sum skips.
func TestABreakerCountsFailuresAfterAnyIdleSpell(t *testing.T) {
	for _, tc := range []struct {
		name     string
		interval time.Duration
		buckets  int
		idle     time.Duration
	}{
		{"1ms buckets, idle 14min", 10 * time.Millisecond, 10, 14 * time.Minute},
		{"100ms buckets (default), idle 23h", time.Second, 10, 23 * time.Hour},
		{"100ms buckets (default), idle 1h (control)", time.Second, 10, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := stattest.NewClock(time.Second)
			e, _ := newEngine(t, clock)
			load(t, e, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 5, StatInterval: tc.interval, Buckets: tc.buckets, RetryTimeout: time.Minute})
			clock.Advance(tc.idle)
			for i := 0; i < 100; i++ {
				fail(e, "dep")
			}
			bs := e.Breakers()
			if bs[0].State != BreakerOpen {
				t.Fatalf("100 failures in one bucket did not trip a Threshold-5 ErrorCount breaker: state %v, window counts %d/%d",
					bs[0].State, bs[0].Failed, bs[0].Completed)
			}
		})
	}
}

// A breaker closed by a good probe counts failures from then at any engine
// time (here 14 min with 1 ms buckets, in the last quarter of a cycle of
// 2^20): its cleared window reads as old.
func TestABreakerClosedByAGoodProbeCountsFailures(t *testing.T) {
	clock := stattest.NewClock(10 * time.Minute)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 5, StatInterval: 10 * time.Millisecond, Buckets: 10, RetryTimeout: 4 * time.Minute})
	for i := 0; i < 5; i++ {
		fail(e, "dep")
	}
	if s := e.Breakers()[0].State; s != BreakerOpen {
		t.Fatalf("did not open at 10 min: %v", s)
	}
	clock.Advance(4 * time.Minute) // 14 min: the probe
	if !try(e, "dep") {            // good probe: closes, clears the window
		t.Fatal("probe refused")
	}
	for i := 0; i < 100; i++ {
		fail(e, "dep")
	}
	if b := e.Breakers()[0]; b.State != BreakerOpen {
		t.Fatalf("100 failures after the probe closed it: %v, window %d/%d", b.State, b.Failed, b.Completed)
	}
}

// A breaker neither wedges open nor goes blind when the clock steps: back
// an hour while open, forward hours and back, forward up to a day after
// traffic in every bucket.
func TestABreakerSurvivesClockSteps(t *testing.T) {
	rule := Rule{Resource: "dep", Breaker: ErrorCount, Threshold: 3, RetryTimeout: 10 * time.Second}
	t.Run("back 1h while open", func(t *testing.T) {
		clock := stattest.NewClock(5 * time.Hour)
		e, _ := newEngine(t, clock)
		load(t, e, rule)
		for range 3 {
			fail(e, "dep")
		}
		clock.Advance(-time.Hour)
		if try(e, "dep") {
			t.Fatal("admitted right after the step")
		}
		clock.Advance(10 * time.Second)
		if !try(e, "dep") {
			t.Fatalf("wedged open after a step back: %+v", e.Breakers()[0])
		}
	})
	t.Run("forward 5h while open, then back", func(t *testing.T) {
		clock := stattest.NewClock(5 * time.Hour)
		e, _ := newEngine(t, clock)
		load(t, e, rule)
		for range 3 {
			fail(e, "dep")
		}
		clock.Advance(5 * time.Hour)
		if !try(e, "dep") {
			t.Fatal("not probing after 5h")
		}
		clock.Advance(-5 * time.Hour)
		for range 3 {
			fail(e, "dep")
		}
		if s := e.Breakers()[0].State; s != BreakerOpen {
			t.Fatalf("after a step back, 3 failures leave %v", s)
		}
	})
	for _, jump := range []time.Duration{time.Hour, 10 * time.Hour, 23 * time.Hour, 26 * time.Hour, 28 * time.Hour} {
		t.Run("forward "+jump.String()+" with traffic before", func(t *testing.T) {
			clock := stattest.NewClock(time.Second)
			e, _ := newEngine(t, clock)
			load(t, e, rule)
			for i := 0; i < 100; i++ { // good traffic in every bucket
				try(e, "dep")
				clock.Advance(10 * time.Millisecond)
			}
			clock.Advance(jump)
			for range 3 {
				fail(e, "dep")
			}
			if b := e.Breakers()[0]; b.State != BreakerOpen {
				t.Fatalf("3 failures after a %v jump: %v, window %d/%d", jump, b.State, b.Failed, b.Completed)
			}
		})
	}
}
