package flow

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stubSource admits every global request without a call out: a token
// source that allocates nothing, for measuring the engine alone.
var stubSource = sourceFunc(func(context.Context, GlobalRequest) (bool, error) { return true, nil })

// everyKind is one rule of every kind, each on its own resource, named
// for its kind.
func everyKind() []Rule {
	return []Rule{
		{Resource: "plain", Threshold: 1e12},
		{Resource: "per-key", Threshold: 1e9, PerKey: true},
		{Resource: "per-key-concurrency", Metric: Concurrency, Threshold: 1e9, PerKey: true},
		{Resource: "gcra", Threshold: 1e9, Behavior: GCRA, Burst: 1000},
		{Resource: "span-exact", Threshold: 1e9, SpanExact: true},
		{Resource: "concurrency", Metric: Concurrency, Threshold: 1e9},
		{Resource: "throttle", Threshold: 1e9, Behavior: Throttle, MaxQueueing: time.Second},
		{Resource: "warm-up", Threshold: 1e9, Behavior: WarmUp, WarmUpPeriod: time.Second},
		{Resource: "global", Threshold: 1e9, Global: true},
		{Resource: "related", Threshold: 1e9, RelatedResource: "plain"},
		{Resource: "dry-run", Threshold: 1, DryRun: true},
		{Resource: "two-windows", Threshold: 1e9}, {Resource: "two-windows", Threshold: 1e9, StatInterval: 2 * time.Second},
	}
}

// eachResource calls fn once for each resource the rules name, with the
// options its requests take (a key, for a PerKey rule).
func eachResource(rules []Rule, fn func(r Rule, opts []EntryOption)) {
	seen := map[string]bool{}
	for _, r := range rules {
		if seen[r.Resource] {
			continue
		}
		seen[r.Resource] = true
		var opts []EntryOption
		if r.PerKey {
			opts = []EntryOption{WithKey("k")}
		}
		fn(r, opts)
	}
}

// everyKindEngine is an engine on a fake clock with every kind loaded,
// whose waits end at once.
func everyKindEngine(t *testing.T) (*Engine, *stattest.Clock, []Rule) {
	clock := stattest.NewClock(time.Second)
	e, err := New(WithClock(clock), WithTokenSource(stubSource))
	require.NoError(t, err)
	// Waits end at once: the clock stays put (a bucket made allocates, once
	// per bucket, not per request).
	e.sleep = func(context.Context, time.Duration) error { return nil }
	rules := everyKind()
	load(t, e, rules...)
	return e, clock, rules
}

// Entry and Exit allocate nothing on any kind of rule, admitted or
// refused, by name and through a handle, once the rule's buckets exist.
func TestEntryExitAllocateNothingOnEveryKind(t *testing.T) {
	e, _, rules := everyKindEngine(t)
	eachResource(rules, func(r Rule, opts []EntryOption) {
		h, err := e.Resource(r.Resource)
		require.NoError(t, err)
		admitted := 0
		byName := func() {
			if en, err := e.Entry(r.Resource, opts...); err == nil {
				admitted++
				en.Exit(nil)
			}
		}
		handle := func() {
			if en, err := h.Entry(opts...); err == nil {
				admitted++
				en.Exit(nil)
			}
		}
		byName()
		assert.Zero(t, testing.AllocsPerRun(200, byName), "%s by name", r.Resource)
		assert.Zero(t, testing.AllocsPerRun(200, handle), "%s through a handle", r.Resource)
		assert.Equal(t, 403, admitted, "%s: every request admitted", r.Resource)
	})
	// Refusals: the dry run's window is full by now (it never refuses); a
	// threshold of 0 refuses every request.
	load(t, e, Rule{Resource: "refused", Threshold: 0}, Rule{Resource: "refused-gcra", Threshold: 1, Behavior: GCRA, Burst: 1})
	for _, name := range []string{"refused", "refused-gcra"} {
		if en, err := e.Entry(name); err == nil {
			en.Exit(nil) // the GCRA rule's one token
		}
		refused := 0
		refuse := func() {
			en, err := e.Entry(name)
			if err != nil {
				refused++
				en.retryAfter()
				en.reset()
			}
		}
		refuse()
		assert.Zero(t, testing.AllocsPerRun(200, refuse), "%s refused, its retry time read", name)
		assert.Equal(t, 202, refused, "%s: every request refused", name)
	}
}

// windowRules is one Reject rule on each of k distinct windows of one
// resource.
func windowRules(k int) []Rule {
	var rules []Rule
	for i := range k {
		rules = append(rules, Rule{Resource: "api", Threshold: 1e9, StatInterval: time.Duration(i+1) * time.Second})
	}
	return rules
}

// A resource whose rules count in 1 to maxWindows distinct windows admits
// and refuses without allocating.
func TestManyWindowsAllocateNothing(t *testing.T) {
	for _, k := range []int{1, 2, 3, 4, maxWindows} {
		t.Run(fmt.Sprint(k), func(t *testing.T) {
			clock := stattest.NewClock(time.Second)
			e, err := New(WithClock(clock))
			require.NoError(t, err)
			load(t, e, windowRules(k)...)
			admitted := 0
			pass := func() {
				if en, err := e.Entry("api"); err == nil {
					admitted++
					en.Exit(nil)
				}
			}
			pass()
			assert.Zero(t, testing.AllocsPerRun(200, pass), "admitted")
			assert.Equal(t, 202, admitted, "every request admitted")
			// The last window refuses: every other one took and gives back.
			rules := windowRules(k)
			rules[k-1].Threshold = 0
			load(t, e, rules...)
			refused := 0
			refuse := func() {
				if _, err := e.Entry("api"); err != nil {
					refused++
				}
			}
			refuse()
			assert.Zero(t, testing.AllocsPerRun(200, refuse), "refused")
			assert.Equal(t, 202, refused, "every request refused")
		})
	}
}

// LoadRules refuses a resource with more than maxWindows distinct windows,
// naming the resource and the count, and changes nothing.
func TestMoreWindowsThanTheBoundAreRefused(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 1})
	rules := windowRules(maxWindows)
	rules = append(rules, Rule{Resource: "api", Threshold: 1, StatInterval: time.Minute, SpanExact: true})
	err := e.LoadRules(rules)
	require.ErrorIs(t, err, ErrInvalidRule)
	assert.ErrorContains(t, err, fmt.Sprintf("makes %d distinct windows for resource \"api\", over %d", maxWindows+1, maxWindows))
	var re *RuleError
	require.ErrorAs(t, err, &re)
	assert.Equal(t, maxWindows, re.Index)
	assert.Equal(t, "StatInterval", re.Field)
	assert.Equal(t, []Rule{{Resource: "api", Threshold: 1, StatInterval: time.Second}}, e.Rules(), "nothing changed")
	// The same window twice counts once.
	rules = append(windowRules(maxWindows), windowRules(maxWindows)...)
	assert.NoError(t, e.LoadRules(rules))
}

// A request that really sleeps (the engine's own sleep, a queued Throttle
// slot) allocates nothing either: its timer comes from a pool.
func TestAWaitThatSleepsAllocatesNothing(t *testing.T) {
	e, err := New(WithClock(stattest.NewClock(time.Second)))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Threshold: 1e6, Behavior: Throttle, MaxQueueing: time.Second})
	admitted := 0
	wait := func() {
		if en, err := e.Entry("api"); err == nil {
			admitted++
			en.Exit(nil)
		}
	}
	wait()
	allowed := 0.0
	if raceEnabled {
		// A quarter of the timers put back are dropped and made anew
		// (three objects each): about 0.75 a call, 1 by chance.
		allowed = 3
	}
	assert.LessOrEqual(t, testing.AllocsPerRun(100, wait), allowed)
	assert.Equal(t, 102, admitted, "each waited its 1 µs slot (the clock stays put) and went")
}

// Entry and Exit on span-exact rules (pass and block), and waits that
// borrow, take ahead, queue and align, allocate nothing once warm.
func TestSpanExactAndWaitsAllocateNothing(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		rules []Rule
		opts  []EntryOption
		fill  int
	}{
		{"span-pass", []Rule{{Resource: "api", Threshold: 1e12, SpanExact: true}}, nil, 0},
		{"span-block", []Rule{{Resource: "api", Threshold: 0, SpanExact: true}}, nil, 0},
		{"span+plain", []Rule{{Resource: "api", Threshold: 1e12, SpanExact: true}, {Resource: "api", Threshold: 1e12}}, nil, 0},
		{"span-wait", []Rule{{Resource: "api", Threshold: 1e6, SpanExact: true}}, []EntryOption{WithWait(2 * time.Second)}, 1e6},
		{"reject-wait", []Rule{{Resource: "api", Threshold: 1e6}}, []EntryOption{WithWait(2 * time.Second)}, 1e6},
		{"gcra-wait", []Rule{{Resource: "api", Threshold: 1e8, Behavior: GCRA, Burst: 1}}, []EntryOption{WithWait(2 * time.Second)}, 0},
		{"throttle-wait", []Rule{{Resource: "api", Threshold: 1e8, Behavior: Throttle}}, []EntryOption{WithWait(2 * time.Second)}, 0},
		{"combo-wait", []Rule{
			{Resource: "api", Threshold: 1e6, SpanExact: true},
			{Resource: "api", Threshold: 1e6 + 1},
			{Resource: "api", Threshold: 1e8, Behavior: GCRA, Burst: 1},
			{Resource: "api", Threshold: 1e8, Behavior: Throttle}}, []EntryOption{WithWait(2 * time.Second)}, 0},
		{"span-exact-wait", []Rule{{Resource: "api", Threshold: 1e6, SpanExact: true}}, []EntryOption{WithWait(2 * time.Second)}, 1e6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clock, _ := waitEngine(t)
			// A sleeper that records nothing (the clockSleeper appends).
			// The clock stays put (a bucket made costs an allocation, once
			// per bucket, not per request): every wait is real, in the
			// engine's eyes, and ends at once.
			waits := 0
			e.sleep = func(ctx context.Context, d time.Duration) error {
				waits++
				return nil
			}
			load(t, e, tc.rules...)
			clock.Set(time.Second)
			f := func() {
				en, err := e.Entry("api", tc.opts...)
				if err == nil {
					en.Exit(nil)
				}
			}
			if tc.fill > 0 {
				en, err := e.Entry("api", WithCount(tc.fill))
				if err == nil {
					en.Exit(nil)
				}
			}
			for range 100 {
				f()
			}
			before := waits
			assert.Zero(t, testing.AllocsPerRun(500, f))
			r, _ := e.Resource("api")
			assert.Zero(t, testing.AllocsPerRun(500, func() {
				en, err := r.Wait(ctx, tc.opts...)
				if err == nil {
					en.Exit(nil)
				}
			}))
			if tc.opts != nil {
				assert.GreaterOrEqual(t, waits-before, 500, "the requests measured waited")
			}
		})
	}
}

// Entry and Exit on WarmUp and WarmUpThrottle rules allocate nothing,
// passed or refused (the warm-up bucket reads the previous second's passes
// through a closure that stays on the stack).
func TestWarmUpAllocatesNothing(t *testing.T) {
	for _, r := range []Rule{
		{Resource: "api", Threshold: 300, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second},
		{Resource: "api", Threshold: 300, Behavior: WarmUpThrottle, WarmUpPeriod: 10 * time.Second, MaxQueueing: time.Millisecond},
	} {
		t.Run(r.Behavior.String(), func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock)
			load(t, e, r)
			passed := 0
			f := func() {
				en, err := e.Entry("api")
				if err == nil {
					passed++
					en.Exit(nil)
				}
			}
			clock.Set(time.Second)
			for range 100 {
				f()
			}
			assert.Zero(t, testing.AllocsPerRun(500, f), "within a second")
			assert.Positive(t, passed)
		})
	}
}

// Traffic that moves through time allocates nothing on any kind of rule
// once every window has gone round (its buckets and a spare made): each
// rotation reuses the bucket the previous one retired.
func TestRotationsAllocateNothingOnEveryKind(t *testing.T) {
	e, clock, rules := everyKindEngine(t)
	eachResource(rules, func(r Rule, opts []EntryOption) {
		step := func() {
			clock.Advance(100 * time.Millisecond)
			if en, err := e.Entry(r.Resource, opts...); err == nil {
				en.Exit(nil)
			}
		}
		// Past the minute window and every rule's window, and their spares.
		for range 700 {
			step()
		}
		assert.Zero(t, testing.AllocsPerRun(300, step), "%s: 30 s of traffic, every bucket rotating", r.Resource)
	})
}
