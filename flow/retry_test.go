package flow

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestBlockedEntrySaysWhenToRetry: a blocked request's Entry tells how
// long until its rule would admit it, and until its window empties, on a
// fake clock, for each kind of rule.
func TestBlockedEntrySaysWhenToRetry(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "qps", Threshold: 4},
		Rule{Resource: "key", Threshold: 4, PerKey: true},
		Rule{Resource: "paced", Threshold: 10, Behavior: Throttle, MaxQueueing: 100 * ms},
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 1},
		Rule{Resource: "two", Threshold: 4}, Rule{Resource: "two", Threshold: 100, StatInterval: 2 * time.Second},
	)
	// 3 at 100 ms, 1 at 600 ms: the window (4 buckets of 250 ms) is full.
	for _, at := range []time.Duration{100 * ms, 100 * ms, 100 * ms, 600 * ms} {
		clock.Set(at)
		require.True(t, try(e, "qps"))
		require.True(t, try(e, "key", WithKey("k")))
		require.True(t, try(e, "two"))
	}
	clock.Set(700 * ms)
	en, err := e.Entry("two")
	require.ErrorIs(t, err, ErrBlocked)
	wait, ok := en.retryAfter()
	require.True(t, ok, "two rules: the one that blocked, and the other had room")
	assert.Equal(t, 300*ms, wait, "two: the 1 s rule's wait; the 2 s rule has room now")
	for _, res := range []string{"qps"} {
		en, err := e.Entry(res)
		require.ErrorIs(t, err, ErrBlocked)
		wait, ok := en.retryAfter()
		require.True(t, ok, res)
		assert.Equal(t, 300*ms, wait, "%s: the bucket of 0-250 ms leaves at 1 s", res)
		reset, ok := en.reset()
		require.True(t, ok)
		assert.Equal(t, 800*ms, reset, "%s: the bucket of 500-750 ms leaves at 1.5 s", res)
	}
	en, err = e.Entry("key", WithKey("k"))
	require.ErrorIs(t, err, ErrBlocked)
	wait, ok = en.retryAfter()
	require.True(t, ok)
	assert.Equal(t, 300*ms, wait, "per key, the same")
	reset, ok := en.reset()
	require.True(t, ok)
	assert.Equal(t, 800*ms, reset)
	en, err = e.Entry("qps", WithCount(5))
	require.ErrorIs(t, err, ErrBlocked)
	_, ok = en.retryAfter()
	assert.False(t, ok, "a request over the threshold is never admitted")

	// Throttle: 100 ms a request; two queue, the third would wait 200 ms.
	clock.Set(time.Second)
	require.True(t, try(e, "paced"))
	require.True(t, try(e, "paced"))
	en, err = e.Entry("paced")
	require.ErrorIs(t, err, ErrBlocked)
	wait, ok = en.retryAfter()
	require.True(t, ok)
	assert.Equal(t, 100*ms, wait, "its slot, 200 ms away, is within the 100 ms queue in 100 ms")
	_, ok = en.reset()
	assert.False(t, ok, "a pacer has no window")

	held, err := e.Entry("conc")
	require.NoError(t, err)
	en, err = e.Entry("conc")
	require.ErrorIs(t, err, ErrBlocked)
	_, ok = en.retryAfter()
	assert.False(t, ok, "a concurrency limit cannot say")
	held.Exit(nil)
	_, ok = held.retryAfter()
	assert.False(t, ok, "an admitted request has nothing to retry")
}

func TestBlockPathStillAllocatesNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "qps", Threshold: 0}, Rule{Resource: "key", Threshold: 1, PerKey: true})
	try(e, "key", WithKey("k"))
	for name, fn := range map[string]func(){
		"qps": func() { try(e, "qps") },
		"key": func() { try(e, "key", WithKey("k")) },
	} {
		fn()
		assert.Zero(t, testing.AllocsPerRun(1000, fn), name)
	}
}

// TestBlockErrorQuota: the quota a blocked request is told, per rule kind,
// and for a listed key its own.
func TestBlockErrorQuota(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e,
		Rule{Resource: "qps", Threshold: 0, StatInterval: 2 * time.Second},
		Rule{Resource: "paced", Threshold: 0.5, Behavior: Throttle},
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 0},
		Rule{Resource: "key", Threshold: 2, PerKey: true, Keys: []KeyLimit{{Key: "vip", Threshold: 0}}},
	)
	for _, tc := range []struct {
		res    string
		opts   []EntryOption
		quota  int64
		window time.Duration
	}{
		{"qps", nil, 0, 2 * time.Second},
		{"paced", nil, 1, time.Second},
		{"conc", nil, 0, 0},
		{"key", []EntryOption{WithKey("vip")}, 0, time.Second},
	} {
		if tc.res == "paced" {
			try(e, tc.res) // the first has its slot at once
		}
		_, err := e.Entry(tc.res, tc.opts...)
		var be *BlockError
		require.ErrorAs(t, err, &be, tc.res)
		q, w := be.Quota()
		assert.Equal(t, tc.quota, q, tc.res)
		assert.Equal(t, tc.window, w, tc.res)
	}
	try(e, "key", WithKey("a"))
	try(e, "key", WithKey("a"))
	_, err := e.Entry("key", WithKey("a"))
	var be *BlockError
	require.ErrorAs(t, err, &be)
	q, _ := be.Quota()
	assert.Equal(t, int64(2), q, "the rule's own for other keys")
}

// TestRetryAfterIsEnough: on a fake clock, a blocked request that comes
// back after exactly its RetryAfter, with nothing else admitted meanwhile,
// is admitted; one that comes back a millisecond earlier is not (the
// window's buckets are whole milliseconds here), for resource and per-key
// windows at random times and batches.
func TestRetryAfterIsEnough(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 200 {
		clock := stattest.NewClock(time.Duration(rng.IntN(5000)) * ms)
		e, _ := newEngine(t, clock)
		limit := 1 + rng.IntN(8)
		interval := time.Duration(1+rng.IntN(4)) * time.Second
		load(t, e, Rule{Resource: "r", Threshold: float64(limit) / interval.Seconds(), StatInterval: interval},
			Rule{Resource: "k", Threshold: float64(limit) / interval.Seconds(), StatInterval: interval, PerKey: true})
		for _, res := range []string{"r", "k"} {
			opts := []EntryOption{WithKey("key")}
			var blockedEn Entry
			var n int
			for range 200 {
				clock.Advance(time.Duration(rng.IntN(300)) * ms)
				n = 1 + rng.IntN(limit)
				en, err := e.Entry(res, append(opts, WithCount(n))...)
				if err != nil {
					blockedEn = en
					break
				}
				en.Exit(nil)
			}
			wait, ok := blockedEn.retryAfter()
			require.True(t, ok, "round %d %s", round, res)
			if wait >= ms {
				clock.Advance(wait - ms)
				_, err := e.Entry(res, append(opts, WithCount(n))...)
				require.Error(t, err, "round %d %s: a millisecond early", round, res)
				clock.Advance(ms)
			} else {
				clock.Advance(wait)
			}
			en, err := e.Entry(res, append(opts, WithCount(n))...)
			require.NoError(t, err, "round %d %s: after RetryAfter %v", round, res, wait)
			en.Exit(nil)
		}
	}
}

// TestRetryAfterAfterAStepBack: a small step back of the clock (passed
// through, not absorbed) does not shorten the wait a blocked request is
// told.
func TestRetryAfterAfterAStepBack(t *testing.T) {
	clock := stattest.NewClock(1020 * ms)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "r", Threshold: 2})
	require.True(t, try(e, "r"))
	require.True(t, try(e, "r"))
	clock.Set(970 * ms)
	en, err := e.Entry("r")
	require.ErrorIs(t, err, ErrBlocked)
	wait, ok := en.retryAfter()
	require.True(t, ok)
	clock.Advance(wait - ms)
	assert.False(t, try(e, "r"), "a millisecond early")
	clock.Advance(ms)
	assert.True(t, try(e, "r"), "after %v", wait)
}

// TestRefusalAndPolicy: Entry.Refusal gathers what a blocked request
// recorded; Engine.Policy names the strictest QPS rule of a resource and
// follows reloads; neither allocates.
func TestRefusalAndPolicy(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{ID: "loose", Resource: "api", Threshold: 50, StatInterval: 2 * time.Second},
		Rule{ID: "strict", Resource: "api", Threshold: 3},
		Rule{Resource: "api", Metric: Concurrency, Threshold: 100},
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 1},
		Rule{Resource: "one", Threshold: 2},
	)
	name, q, w, ok := e.Policy("api")
	require.True(t, ok)
	assert.Equal(t, "strict", name)
	assert.Equal(t, int64(3), q)
	assert.Equal(t, time.Second, w)
	_, _, _, ok = e.Policy("conc")
	assert.False(t, ok, "no QPS rule")
	_, _, _, ok = e.Policy("nothing")
	assert.False(t, ok)
	assert.Zero(t, testing.AllocsPerRun(100, func() { e.Policy("api") }))

	clock.Set(100 * ms)
	require.True(t, try(e, "one"))
	require.True(t, try(e, "one"))
	en, err := e.Entry("one")
	var be *BlockError
	require.ErrorAs(t, err, &be)
	r := en.Refusal()
	assert.Equal(t, "one", r.Resource)
	assert.Same(t, be, r.Err)
	quota, window := r.Err.Quota()
	assert.Equal(t, int64(2), quota)
	assert.Equal(t, time.Second, window)
	assert.Equal(t, int64(0), r.Remaining)
	assert.Equal(t, 900*ms, r.RetryAfter, "both passes sit in the bucket [0, 250 ms), which leaves the window at 1 s")
	assert.GreaterOrEqual(t, r.Reset, time.Duration(0), "a QPS Reject rule says when its window empties")
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = en.Refusal() }))

	held, err := e.Entry("conc")
	require.NoError(t, err)
	en, err = e.Entry("conc")
	require.ErrorAs(t, err, &be)
	r = en.Refusal()
	assert.Same(t, be, r.Err)
	assert.Equal(t, "conc", r.Resource)
	assert.Negative(t, r.RetryAfter, "a Concurrency rule cannot say when")
	assert.Negative(t, r.Reset)
	quota, window = r.Err.Quota()
	assert.Equal(t, int64(1), quota)
	assert.Equal(t, time.Duration(0), window)
	assert.Zero(t, held.Refusal(), "an admitted request was not refused")
	bad, err := e.Entry("conc", WithKey(""))
	require.ErrorIs(t, err, ErrInvalidOption)
	assert.Zero(t, bad.Refusal(), "an error that is not a refusal")
	held.Exit(nil)

	load(t, e, Rule{Resource: "api", Threshold: 7})
	name, q, _, ok = e.Policy("api")
	require.True(t, ok)
	assert.Equal(t, "api", name, "a rule with no ID is named by its resource")
	assert.Equal(t, int64(7), q)
}

// A refused request's retry time is computed when it is read, from the
// refusal's instant: never shorter than it was at the refusal, however the
// window moved since (more admissions, a newer bucket, buckets gone).
func TestRetryReadLaterIsNeverShorter(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "qps", Threshold: 4})
	for _, at := range []time.Duration{100 * ms, 100 * ms, 100 * ms} {
		clock.Set(at)
		require.True(t, try(e, "qps"))
	}
	clock.Set(600 * ms)
	require.True(t, try(e, "qps"))
	en, err := e.Entry("qps")
	require.ErrorIs(t, err, ErrBlocked)
	wait, ok := en.retryAfter()
	require.True(t, ok)
	assert.Equal(t, 400*ms, wait, "read at once: the bucket of 0-250 ms leaves at 1 s")
	reset, _ := en.reset()
	assert.Equal(t, 900*ms, reset, "the bucket of 500-750 ms leaves at 1.5 s")
	for _, at := range []time.Duration{700 * ms, 900 * ms, 1100 * ms, 1900 * ms, 5 * time.Second} {
		clock.Set(at)
		try(e, "qps") // the window moves on, and admits again once it can
		later, ok := en.retryAfter()
		require.True(t, ok, "at %v", at)
		assert.GreaterOrEqual(t, later, wait, "read at %v", at)
		r, ok := en.reset()
		require.True(t, ok)
		assert.GreaterOrEqual(t, r, reset, "read at %v", at)
	}
}

// A blocked Entry's room, packed into one word, reads back never shorter
// than it was, to the ns for retries up to 8 s, the ms for resets up to
// 6 days, and up to the 30 days a GCRA rule can take to refill.
func TestPackedRoomIsNeverShorter(t *testing.T) {
	for _, d := range []time.Duration{0, 1, 999, time.Millisecond, 1500 * ms, 8 * time.Second, 9 * time.Second, time.Hour,
		27*time.Hour + 46*time.Minute + 40*time.Second, 6 * 24 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour} {
		r := unpackRoom(packRoom(room{int64(d), int64(d)}))
		assert.GreaterOrEqual(t, r.retry, int64(d), "retry %v", d)
		assert.GreaterOrEqual(t, r.reset, int64(d), "reset %v", d)
		if d <= 8*time.Second {
			assert.Equal(t, int64(d), r.retry, "retry %v to the ns", d)
		} else {
			assert.Less(t, r.retry, int64(d+time.Millisecond), "retry %v to the ms", d)
		}
		if d <= 6*24*time.Hour {
			assert.Less(t, r.reset, int64(d+time.Millisecond), "reset %v to the ms", d)
		} else {
			assert.Less(t, r.reset, int64(d+time.Second), "reset %v to the s", d)
		}
	}
	assert.Equal(t, unknownRoom, unpackRoom(packRoom(unknownRoom)))
}

// Every refusal leads back to the rule that made it, whatever the kind and
// whichever path decided it: Entry.Refusal's Err is the error Entry
// returned, its Resource the resource entered.
func TestEveryRefusalLeadsBackToItsRule(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Second))
	e.sleep = func(context.Context, time.Duration) error { return nil }
	rules := []Rule{
		{Resource: "plain", Threshold: 1},
		{Resource: "gcra", Threshold: 1, Behavior: GCRA, Burst: 1},
		{Resource: "per-key", Threshold: 1, PerKey: true},
		{Resource: "concurrency", Metric: Concurrency, Threshold: 1},
		{Resource: "throttle", Threshold: 1, Behavior: Throttle},
		{Resource: "warm-up", Threshold: 1, Behavior: WarmUp, WarmUpPeriod: time.Second},
		{Resource: "two", Threshold: 1}, {Resource: "two", Threshold: 5, StatInterval: 2 * time.Second},
		{Resource: "related", Threshold: 0, RelatedResource: "plain"},
	}
	load(t, e, rules...)
	eachResource(rules, func(r Rule, opts []EntryOption) {
		var last Entry
		var err error
		for range 3 { // the first may pass; held entries stay open
			last, err = e.Entry(r.Resource, opts...)
			if err != nil {
				break
			}
		}
		var be *BlockError
		require.ErrorAs(t, err, &be, r.Resource)
		got := last.Refusal()
		assert.Same(t, be, got.Err, r.Resource)
		assert.Equal(t, r.Resource, got.Resource)
	})
}

// A refusal by a Global rule's local fallback tells the fallback's quota
// (LocalShare of the threshold) and no Remaining: the local window is not
// the rule's.
func TestLocalFallbackRefusalTellsItsOwnQuota(t *testing.T) {
	down := sourceFunc(func(context.Context, GlobalRequest) (bool, error) { return false, errors.New("down") })
	e, err := New(WithClock(stattest.NewClock(time.Second)), WithTokenSource(down))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "r", Threshold: 10, Global: true, Fallback: FallbackLocal, LocalShare: 0.5})
	var en Entry
	for range 6 {
		if en, err = e.Entry("r"); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, ErrBlocked, "the fallback admits 5")
	r := en.Refusal()
	q, _ := r.Err.Quota()
	assert.Equal(t, int64(5), q)
	assert.Zero(t, r.Remaining)
}

// A Global PerKey rule refuses a key it lists in Keys with that key's
// quota, by the source and by the local fallback, and any other key with
// the rule's.
func TestGlobalListedKeyRefusalTellsTheKeysQuota(t *testing.T) {
	var fail atomic.Bool
	src := sourceFunc(func(context.Context, GlobalRequest) (bool, error) {
		if fail.Load() {
			return false, errors.New("down")
		}
		return false, nil
	})
	e, err := New(WithClock(stattest.NewClock(time.Second)), WithTokenSource(src))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "r", Threshold: 1, Global: true, PerKey: true, Fallback: FallbackLocal, LocalShare: 0.5,
		Keys: []KeyLimit{{Key: "vip", Threshold: 100}}})
	quota := func(key string) int64 {
		en, err := e.Entry("r", WithKey(key))
		require.ErrorIs(t, err, ErrBlocked, key)
		q, _ := en.Refusal().Err.Quota()
		return q
	}
	assert.Equal(t, int64(100), quota("vip"), "refused by the source")
	assert.Equal(t, int64(1), quota("other"))
	fail.Store(true)
	for range 60 { // the fallback admits 50 for vip
		if en, err := e.Entry("r", WithKey("vip")); err == nil {
			en.Exit(nil)
		}
	}
	assert.Equal(t, int64(50), quota("vip"), "refused by the local fallback")
}

// TestRefusalWaitsForEveryRateRule: on a resource with several rules, a
// refused request is told to come back when the rule that refused it and
// every other rate rule would admit it (the latest of their waits), under
// the refusing rule's policy, on a fake clock: a window then a PerKey
// rule, a window then GCRA, a window then Throttle, a PerKey rule after a
// global one, and a later rule that never admits the request (no time).
func TestRefusalWaitsForEveryRateRule(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithTokenSource(stubSource))
	load(t, e,
		// 10/s for the resource, 2 per 4 s per key.
		Rule{Resource: "keyed", Threshold: 10},
		Rule{Resource: "keyed", Threshold: 0.5, StatInterval: 4 * time.Second, PerKey: true},
		Rule{Resource: "gcra", Threshold: 2},
		Rule{Resource: "gcra", Threshold: 1, Behavior: GCRA, Burst: 3},
		Rule{Resource: "paced", Threshold: 2},
		Rule{Resource: "paced", Threshold: 1, Behavior: Throttle, MaxQueueing: 500 * ms},
		Rule{Resource: "global", Threshold: 100, Global: true},
		Rule{Resource: "global", Threshold: 0.5, StatInterval: 4 * time.Second, PerKey: true},
		Rule{Resource: "never", Threshold: 5},
		Rule{Resource: "never", Threshold: 1, PerKey: true},
	)
	refused := func(res string, opts ...EntryOption) Refusal {
		t.Helper()
		en, err := e.Entry(res, opts...)
		require.ErrorIs(t, err, ErrBlocked, res)
		return en.Refusal()
	}

	// The key took its 2 at 0; at 100 ms the resource's 10 are gone
	// (8 more keys): the window refuses, waiting 900 ms, and the key's
	// window 3.9 s.
	for i := range 10 {
		require.True(t, try(e, "keyed", WithKey(string(rune('a'+i/2)))))
	}
	clock.Set(100 * ms)
	r := refused("keyed", WithKey("a"))
	assert.Equal(t, "keyed", r.Err.Rule.Resource)
	assert.False(t, r.Err.Rule.PerKey, "the policy is the refusing rule's")
	assert.Equal(t, 3900*ms, r.RetryAfter, "the key's window holds it longest")
	assert.Zero(t, r.Remaining, "the resource's window had nothing left")
	assert.Equal(t, 900*ms, r.Reset, "the resource's window empties at 1 s")
	r = refused("keyed", WithKey("z"))
	assert.Equal(t, 900*ms, r.RetryAfter, "a key the rule has not seen waits for the resource's window only")

	// GCRA at 1/s, burst 3: 2 taken at 10 s leave 1 token; the window of
	// 2/s refuses the third at 10.2 s, which GCRA alone would admit: the
	// window's wait, 800 ms; a batch of 2 waits for GCRA's second token,
	// back at 11 s.
	clock.Set(10 * time.Second)
	require.True(t, try(e, "gcra", WithCount(2)))
	clock.Set(10*time.Second + 200*ms)
	r = refused("gcra")
	assert.Equal(t, 800*ms, r.RetryAfter, "GCRA has a token now: the window's wait")
	assert.Equal(t, "gcra", r.Resource)
	r = refused("gcra", WithCount(2))
	assert.Equal(t, 800*ms, r.RetryAfter, "2 tokens are back at 11 s too")
	clock.Set(11 * time.Second)
	require.True(t, try(e, "gcra", WithCount(2)), "the bucket from 10 s has left")

	// Throttle at 1/s, queue 500 ms: 2 admitted at 20 s took the slots at
	// 20 s and 21 s; the window refuses the third at 20.2 s (800 ms), and
	// its slot at 22 s is within the queue from 21.5 s: 1.3 s.
	clock.Set(20 * time.Second)
	en, err := e.Entry("paced")
	require.NoError(t, err)
	en.Exit(nil)
	en, err = e.Entry("paced", WithWait(time.Second))
	require.NoError(t, err)
	en.Exit(nil)
	clock.Set(20*time.Second + 200*ms)
	r = refused("paced")
	assert.Equal(t, 1300*ms, r.RetryAfter, "the throttle's slot, less its queue")

	// A PerKey rule beside a Global one: the key's window refuses before
	// the Global rule is asked: its wait (its bucket from 30 s leaves at
	// 34 s).
	clock.Set(30 * time.Second)
	require.True(t, try(e, "global", WithKey("k")))
	require.True(t, try(e, "global", WithKey("k")))
	clock.Set(31 * time.Second)
	r = refused("global", WithKey("k"))
	assert.True(t, r.Err.Rule.PerKey)
	assert.Equal(t, 3*time.Second, r.RetryAfter)

	// A batch of 2 that the window refuses, and that the per-key limit of
	// 1 never admits: no time to give.
	clock.Set(40 * time.Second)
	for i := range 5 {
		require.True(t, try(e, "never", WithKey(string(rune('a'+i)))))
	}
	r = refused("never", WithCount(2), WithKey("q"))
	assert.Negative(t, r.RetryAfter, "the PerKey rule never admits 2")
	clock.Set(40*time.Second + 500*ms)
	r = refused("never", WithCount(2), WithKey("q"))
	assert.False(t, r.Err.Rule.PerKey)
	assert.Negative(t, r.RetryAfter, "the PerKey rule never admits 2")
	r = refused("never", WithKey("q"))
	assert.False(t, r.Err.Rule.PerKey)
	assert.Equal(t, 500*ms, r.RetryAfter, "one: the window's wait (its bucket from 40 s leaves at 41 s)")
}

// TestLocalRefusalAsksNoSource: a resource's Global rules are asked after
// every local rule, so a request a local rule refuses makes no call to the
// token source and takes nothing from the shared limit (a window and a
// Global rule; a PerKey rule and a Global rule, on its short path).
func TestLocalRefusalAsksNoSource(t *testing.T) {
	var calls atomic.Int64
	src := sourceFunc(func(context.Context, GlobalRequest) (bool, error) {
		calls.Inc()
		return true, nil
	})
	e, _ := newEngine(t, stattest.NewClock(time.Second), WithTokenSource(src))
	load(t, e,
		Rule{Resource: "window", Threshold: 1}, Rule{Resource: "window", Threshold: 100, Global: true},
		Rule{Resource: "keyed", Threshold: 1, PerKey: true}, Rule{Resource: "keyed", Threshold: 100, Global: true},
	)
	for _, tc := range []struct {
		res  string
		opts []EntryOption
	}{{"window", nil}, {"keyed", []EntryOption{WithKey("a")}}} {
		before := calls.Load()
		require.True(t, try(e, tc.res, tc.opts...))
		assert.Equal(t, before+1, calls.Load(), "%s: admitted locally, then asked", tc.res)
		for range 3 {
			require.False(t, try(e, tc.res, tc.opts...))
		}
		assert.Equal(t, before+1, calls.Load(), "%s: refused locally, never asked", tc.res)
	}
}
