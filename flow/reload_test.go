package flow

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reload that adds a span-exact rule seeds its window with what the
// resource passed over its span, at the resource's newest bucket even when
// the clock stepped back a little (less than the engine absorbs): the seed
// holds for as long as those passes do, so no span of the interval admits
// more than the new rule allows.
func TestReloadSeedsAtTheNewestBucketAfterASmallStepBack(t *testing.T) {
	oneStripe(t)
	clock := stattest.NewClock(11*time.Second + 1)
	e, err := New(WithClock(clock))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Threshold: 6})
	for range 4 {
		en, err := e.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Advance(-50 * time.Millisecond)
	load(t, e, Rule{Resource: "api", Threshold: 6}, Rule{Resource: "api", Threshold: 4, SpanExact: true})
	clock.Set(12 * time.Second)
	assert.Zero(t, drain(e, "api"), "[11s, 12s] holds the 4 passed before the reload already")
	clock.Set(13*time.Second + 200*time.Millisecond)
	assert.Equal(t, 4, drain(e, "api"), "once they left every span")
}

// tenWaiting fills a plain 10/s rule at 100 ms, then has 10 requests
// borrow its bucket at 1 s at 200 ms (returning their stamps), and sets the
// clock to 300 ms, for a reload.
func tenWaiting(t *testing.T) (*Engine, *stattest.Clock, []stamp) {
	t.Helper()
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10})
	require.Len(t, greedy(t, e, clock, "api", 100*ms), 10)
	clock.Set(200 * ms)
	var st []stamp // the borrowed stamps and what the new rules admit
	for range 10 {
		en, err := e.Entry("api", WithWait(time.Second))
		require.NoError(t, err)
		st = append(st, stamp{en.Start(), 1})
		en.Exit(nil)
	}
	clock.Set(300 * ms)
	return e, clock, st
}

// Requests that borrowed a future bucket under the old rules (WithWait) are
// counted in the node only when their bucket lands; a reload that turns the
// rule span-exact still counts them, and admits no second threshold within
// 1 s of their stamps.
func TestReloadToSpanExactSeesBorrowedPasses(t *testing.T) {
	e, clock, st := tenWaiting(t)
	load(t, e, Rule{Resource: "api", Threshold: 10, SpanExact: true})
	// The waiters arrive at 1 s (their bucket lands), then 1.45 s.
	st = append(st, greedy(t, e, clock, "api", 1000*ms, 1450*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(10),
		"a span-exact 10/s rule: at most 10 in any 1 s span of stamps")
}

// The same for a rule of a new StatInterval (2 s, 4 buckets: any span under
// 1.5 s admits at most its 10).
func TestNewIntervalWindowSeesBorrowedPasses(t *testing.T) {
	e, clock, st := tenWaiting(t)
	load(t, e, Rule{Resource: "api", Threshold: 10}, Rule{Resource: "api", Threshold: 5, StatInterval: 2 * time.Second})
	// The waiters arrive at 1 s (their bucket lands), then 2.1 s.
	st = append(st, greedy(t, e, clock, "api", 1000*ms, 2100*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(1400*ms)), int64(10),
		"a 2 s rule of 10 with 4 buckets: at most 10 in any span under 1.5 s")
}

// A plain 10/s rule admits 10 at 0.5 s; at 0.6 s a reload turns the same
// rule span-exact (only SpanExact changes). The span-exact window starts
// from the passes the node holds, so it admits nothing more until they
// leave it (as the same rule reloaded plain would).
func TestReloadTurningSpanExactOnKeepsWhatPassed(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10})
	st := greedy(t, e, clock, "api", 500*ms)
	assert.Len(t, st, 10)
	clock.Set(600 * ms)
	load(t, e, Rule{Resource: "api", Threshold: 10, SpanExact: true})
	st = append(st, greedy(t, e, clock, "api", 600*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(10),
		"a span-exact 10/s rule: at most 10 in any 1 s span of stamps")
}

// The same when a tighter span-exact rule (10) is added beside a plain one
// (100/s): the passes the plain rule admitted just before count in the
// span-exact window.
func TestSpanExactRuleAddedBesidePlainSeesItsPasses(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 100})
	clock.Set(500 * ms)
	var st []stamp
	for range 10 {
		en, err := e.Entry("api")
		if err != nil {
			break
		}
		st = append(st, stamp{en.Start(), 1})
		en.Exit(nil)
	}
	load(t, e, Rule{Resource: "api", Threshold: 100}, Rule{Resource: "api", Threshold: 10, SpanExact: true})
	st = append(st, greedy(t, e, clock, "api", 600*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(10))
}

// A reload that adds a rule of another StatInterval (a window the resource
// did not count in yet) gives that window what the resource just passed: a
// 2 s rule of 20 per window added after 30 passes admits none of its 20
// until they have left it.
func TestNewIntervalWindowIsSeeded(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 100})
	st := greedy(t, e, clock, "api", 500*ms)
	assert.Len(t, st, 100)
	clock.Set(600 * ms)
	load(t, e, Rule{Resource: "api", Threshold: 100}, Rule{Resource: "api", Threshold: 10, StatInterval: 2 * time.Second})
	assert.Empty(t, greedy(t, e, clock, "api", 1600*ms), "the 2 s window holds the 100 passes")
	assert.NotEmpty(t, greedy(t, e, clock, "api", 2700*ms), "once they have left it")
}

// keyStarts runs steps of traffic on clock: at each step the clock moves
// by step and every key tries once; it returns each key's admissions.
func keyStarts(e *Engine, clock *stattest.Clock, keys, steps int, step time.Duration) map[string][]int64 {
	starts := map[string][]int64{}
	for range steps {
		clock.Advance(step)
		for k := range keys {
			key := fmt.Sprint("k", k)
			if en, err := e.Entry("api", WithKey(key)); err == nil {
				starts[key] = append(starts[key], en.Start())
				en.Exit(nil)
			}
		}
	}
	return starts
}

// reloadingMaxKeys reloads rule into e as fast as it goes, its MaxKeys
// a and b by turns, until the stop it returns is called; stop returns the
// reloads made and the first error.
func reloadingMaxKeys(e *Engine, rule Rule, a, b int) (stop func() (int, error)) {
	quit, done := make(chan struct{}), make(chan struct{})
	var reloads int
	var err error
	go func() {
		defer close(done)
		for ; ; reloads++ {
			select {
			case <-quit:
				return
			default:
			}
			rule.MaxKeys = []int{a, b}[reloads%2]
			if err = e.LoadRules([]Rule{rule}); err != nil {
				return
			}
		}
	}()
	return func() (int, error) {
		close(quit)
		<-done
		return reloads, err
	}
}

// Reloads that change only a PerKey rule's MaxKeys, back and forth while
// requests run on a moving clock, move every key's state to the new table
// with its count: a request that looks a key up while the table moves finds
// the state being moved, never a fresh one. No key is admitted over its
// threshold in any of its windows.
func TestPerKeyReloadsOfMaxKeysUnderTrafficKeepEveryCount(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	const limit, keys = 20, 503
	rule := Rule{ID: "u", Resource: "api", Threshold: limit, PerKey: true, MaxKeys: 1000}
	load(t, e, rule)
	stop := reloadingMaxKeys(e, rule, 2000, 1000)
	starts := keyStarts(e, clock, keys, 200, 20*ms)
	reloads, err := stop()
	require.NoError(t, err)
	over := 0
	for k, v := range starts {
		if most, at := worstWindow(v, int64(250*ms)); most > limit {
			over++
			t.Logf("key %s: %d in the window of buckets %d..%d", k, most, at, at+3)
		}
	}
	assert.Zero(t, over, "keys over their threshold in a window, over %d reloads", reloads)
	assert.Positive(t, reloads)
}

// reloading runs traffic on a moving clock, reloading between rules a and
// b (one field apart) every few steps: each step the clock moves 10 ms
// and every key tries once with Allow (PerKey rules: keys k0..k4; else
// one request without a key). It returns each key's admission times.
func reloading(t *testing.T, a, b Rule) map[string][]stamp {
	t.Helper()
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e, a)
	starts := map[string][]stamp{}
	keys := 1
	if a.PerKey {
		keys = 5
	}
	for step := range 600 {
		clock.Advance(10 * ms)
		if step%37 == 36 {
			load(t, e, []Rule{b, a}[step/37%2])
		}
		for k := range keys {
			key := fmt.Sprint("k", k)
			var opts []EntryOption
			if a.PerKey {
				opts = append(opts, WithKey(key))
			}
			if _, err := e.Allow("api", opts...); err == nil {
				starts[key] = append(starts[key], stamp{clock.Now(), 1})
			}
		}
	}
	return starts
}

// inFlightReloading is reloading for Concurrency rules: each step every
// key enters once and holds its entry for hold steps; it returns the most
// any key held at once.
func inFlightReloading(t *testing.T, a, b Rule, hold int) int {
	t.Helper()
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e, a)
	keys := 1
	if a.PerKey {
		keys = 5
	}
	held := make([][]Entry, keys)
	most := 0
	for step := range 600 {
		clock.Advance(10 * ms)
		if step%37 == 36 {
			load(t, e, []Rule{b, a}[step/37%2])
		}
		for k := range keys {
			var opts []EntryOption
			if a.PerKey {
				opts = append(opts, WithKey(fmt.Sprint("k", k)))
			}
			if len(held[k]) == hold {
				held[k][0].Exit(nil)
				held[k] = held[k][1:]
			}
			if en, err := e.Entry("api", opts...); err == nil {
				held[k] = append(held[k], en)
			}
			most = max(most, len(held[k]))
		}
	}
	return most
}

// A reload that keeps a rule (its Resource, ID, Metric and PerKey) keeps
// what it counted, whatever else changed of Threshold, MaxKeys, Keys,
// Burst, MaxQueueing, StatInterval, and Behavior between Reject and
// WarmUp: under traffic on a moving clock, reloaded back and forth every
// 370 ms, no key is admitted over the looser of the two rules in any span
// (a rule that started afresh at a reload admits its threshold again on
// top of what the window holds). Every rule kind, PerKey and not.
func TestAReloadThatKeepsTheRuleKeepsItsCounts(t *testing.T) {
	win := Rule{ID: "r", Resource: "api", Threshold: 20}
	keyed := Rule{ID: "r", Resource: "api", Threshold: 20, PerKey: true, MaxKeys: 8}
	with := func(r Rule, f func(*Rule)) Rule { f(&r); return r }
	// Windows: the most in any span of 3/4 of the window (a key's window
	// and the node's second window both hold that to the threshold).
	windows := []struct {
		name string
		a, b Rule
		most int64
	}{
		{"window/Threshold", win, with(win, func(r *Rule) { r.Threshold = 25 }), 25},
		{"window/WarmUp", win, with(win, func(r *Rule) { r.Behavior, r.WarmUpPeriod, r.ColdFactor = WarmUp, time.Second, 3 }), 20},
		{"warmup/Threshold", with(win, func(r *Rule) { r.Behavior, r.WarmUpPeriod, r.ColdFactor = WarmUp, time.Second, 3 }),
			with(win, func(r *Rule) { r.Behavior, r.WarmUpPeriod, r.ColdFactor, r.Threshold = WarmUp, time.Second, 3, 25 }), 25},
		{"perkey/Threshold", keyed, with(keyed, func(r *Rule) { r.Threshold = 25 }), 25},
		{"perkey/MaxKeys", keyed, with(keyed, func(r *Rule) { r.MaxKeys = 64 }), 20},
		{"perkey/Keys", keyed, with(keyed, func(r *Rule) { r.Keys = []KeyLimit{{Key: "k1", Threshold: 20}} }), 20},
		{"perkey/StatInterval", keyed, with(keyed, func(r *Rule) { r.StatInterval, r.Threshold = 2*time.Second, 10 }), 20},
	}
	for _, c := range windows {
		t.Run(c.name, func(t *testing.T) {
			for k, st := range reloading(t, c.a, c.b) {
				assert.LessOrEqual(t, mostInSpan(st, int64(750*ms)-1), c.most, "key %s", k)
			}
		})
	}
	// Rates: consecutive admissions no closer than the faster rate allows.
	paced := with(win, func(r *Rule) { r.Behavior, r.Threshold = Throttle, 10 })
	keyPaced := with(keyed, func(r *Rule) { r.Behavior, r.Threshold = Throttle, 10 })
	gcraRule := with(win, func(r *Rule) { r.Behavior, r.Threshold, r.Burst = GCRA, 10, 1 })
	rates := []struct {
		name string
		a, b Rule
		gap  time.Duration // the least time between two admissions
	}{
		{"throttle/Threshold", paced, with(paced, func(r *Rule) { r.Threshold = 20 }), 50 * ms},
		{"throttle/MaxQueueing", paced, with(paced, func(r *Rule) { r.MaxQueueing = time.Second }), 100 * ms},
		{"perkey-throttle/Threshold", keyPaced, with(keyPaced, func(r *Rule) { r.Threshold = 20 }), 50 * ms},
		{"perkey-throttle/MaxKeys", keyPaced, with(keyPaced, func(r *Rule) { r.MaxKeys = 64 }), 100 * ms},
		{"perkey-throttle/MaxQueueing", keyPaced, with(keyPaced, func(r *Rule) { r.MaxQueueing = time.Second }), 100 * ms},
		{"perkey-throttle/Keys", keyPaced, with(keyPaced, func(r *Rule) { r.Keys = []KeyLimit{{Key: "k1", Threshold: 10}} }), 100 * ms},
		{"gcra/Threshold", gcraRule, with(gcraRule, func(r *Rule) { r.Threshold = 20 }), 50 * ms},
		{"gcra/Burst", gcraRule, with(gcraRule, func(r *Rule) { r.Burst = 2 }), 0},
	}
	for _, c := range rates {
		t.Run(c.name, func(t *testing.T) {
			for k, st := range reloading(t, c.a, c.b) {
				for i := 1; i < len(st); i++ {
					if gap := time.Duration(st[i].t - st[i-1].t); c.gap > 0 && gap < c.gap {
						t.Errorf("key %s: admitted %v after the one before, at %v", k, gap, time.Duration(st[i].t))
						break
					}
				}
				if c.gap == 0 { // Burst 1 <-> 2 at 10/s: at most 2 in any 100 ms
					assert.LessOrEqual(t, mostInSpan(st, int64(100*ms)), int64(2), "key %s", k)
				}
			}
		})
	}
	// In flight: never more held at once than the larger limit.
	conc := with(win, func(r *Rule) { r.Metric, r.Threshold = Concurrency, 3 })
	keyConc := with(keyed, func(r *Rule) { r.Metric, r.Threshold = Concurrency, 3 })
	for _, c := range []struct {
		name string
		a, b Rule
		most int
	}{
		{"concurrency/Threshold", conc, with(conc, func(r *Rule) { r.Threshold = 4 }), 4},
		{"perkey-concurrency/Threshold", keyConc, with(keyConc, func(r *Rule) { r.Threshold = 4 }), 4},
		{"perkey-concurrency/MaxKeys", keyConc, with(keyConc, func(r *Rule) { r.MaxKeys = 64 }), 3},
		{"perkey-concurrency/Keys", keyConc, with(keyConc, func(r *Rule) { r.Keys = []KeyLimit{{Key: "k1", Threshold: 3}} }), 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.most, inFlightReloading(t, c.a, c.b, 10))
		})
	}
}

// A reload that slows a Throttle rule, or a GCRA rule, stretches what is
// queued (or owed) ahead of now to the new rate: the requests queued keep
// their slots, and the next one goes where the new rate puts it after
// them, not where the old rate would.
func TestAReloadStretchesQueuesToTheNewRate(t *testing.T) {
	for _, b := range []Behavior{Throttle, GCRA} {
		t.Run(b.String(), func(t *testing.T) {
			clock := stattest.NewClock(time.Hour)
			e, s := newEngine(t, clock)
			r := Rule{Resource: "api", Threshold: 10, Behavior: b, MaxQueueing: 2 * time.Second}
			if b == GCRA {
				r.MaxQueueing, r.Burst = 0, 1
			}
			load(t, e, r)
			for range 5 { // queued (or owed) at 0, 100, ..., 400 ms
				en, err := e.Entry("api", WithWait(2*time.Second))
				require.NoError(t, err)
				en.Exit(nil)
			}
			r.Threshold = 5
			load(t, e, r)
			en, err := e.Entry("api", WithWait(2*time.Second))
			require.NoError(t, err)
			en.Exit(nil)
			// Throttle: the last slot, 400 ms ahead at 10/s, is 800 ms
			// ahead at 5/s; the next is 200 ms after it. GCRA: 500 ms
			// owed is 1 s, and a burst of 1 lets the next go 200 ms
			// before the arrival time it sets.
			assert.Equal(t, time.Second, s.waits[len(s.waits)-1], "waits: %v", s.waits)
		})
	}
}

// A dry-run rule and a Global rule's local fallback keep what they
// counted across a reload that keeps the rule: the dry run's window and
// what it would have blocked, the fallback's window (per key too).
func TestAReloadKeepsDryRunAndFallbackWindows(t *testing.T) {
	t.Run("dry run", func(t *testing.T) {
		e, _ := newEngine(t, stattest.NewClock(time.Hour))
		r := Rule{Resource: "api", Threshold: 5, DryRun: true}
		load(t, e, r)
		for range 8 {
			require.True(t, try(e, "api"), "a dry run blocks nothing")
		}
		require.Equal(t, int64(3), e.DryRuns()[0].WouldBlock)
		r.Threshold = 6
		load(t, e, r)
		require.True(t, try(e, "api"))
		require.True(t, try(e, "api"))
		assert.Equal(t, int64(4), e.DryRuns()[0].WouldBlock, "its window still holds 5 of the new 6: the 10th would be blocked")
	})
	down := sourceFunc(func(context.Context, GlobalRequest) (bool, error) { return false, errors.New("down") })
	for _, perKey := range []bool{false, true} {
		t.Run(fmt.Sprint("fallback/perKey=", perKey), func(t *testing.T) {
			e, err := New(WithClock(stattest.NewClock(time.Hour)), WithTokenSource(down))
			require.NoError(t, err)
			r := Rule{Resource: "api", Threshold: 10, Global: true, PerKey: perKey, Fallback: FallbackLocal, LocalShare: 0.5}
			load(t, e, r)
			var opts []EntryOption
			if perKey {
				opts = append(opts, WithKey("k"))
			}
			n := 0
			for try(e, "api", opts...) {
				n++
			}
			require.Equal(t, 5, n, "the fallback admits LocalShare of 10")
			r.Threshold = 12
			load(t, e, r)
			n = 0
			for try(e, "api", opts...) {
				n++
			}
			assert.Equal(t, 1, n, "6 of the new 12 locally, 5 used")
		})
	}
}

// Adding or removing a rule of another kind on the same resource moves no
// other rule's state: a dry run added beside a Throttle rule, or a Reject
// rule removed from beside it, leaves its queue; a PerKey Throttle rule
// removed from beside a PerKey Reject rule leaves the keys' windows.
func TestAReloadKeepsEachRulesStateWhateverRulesBesideItDo(t *testing.T) {
	paced := Rule{Resource: "api", Threshold: 2, Behavior: Throttle, MaxQueueing: time.Second}
	for name, sets := range map[string][2][]Rule{
		"dry run added":  {{paced}, {{Resource: "api", Threshold: 100, DryRun: true}, paced}},
		"reject removed": {{{Resource: "api", Threshold: 1000}, paced}, {paced}},
		"reject added":   {{paced}, {paced, {Resource: "api", Threshold: 1000}}},
	} {
		t.Run(name, func(t *testing.T) {
			e, s := newEngine(t, stattest.NewClock(time.Hour))
			load(t, e, sets[0]...)
			require.True(t, try(e, "api"))
			require.True(t, try(e, "api"), "queued 500 ms")
			load(t, e, sets[1]...)
			require.True(t, try(e, "api"))
			assert.Equal(t, time.Second, s.waits[len(s.waits)-1], "queued behind the two: waits %v", s.waits)
		})
	}
	t.Run("perkey throttle removed", func(t *testing.T) {
		e, _ := newEngine(t, stattest.NewClock(time.Hour))
		window := Rule{Resource: "api", Threshold: 5, PerKey: true}
		load(t, e, Rule{Resource: "api", Threshold: 1000, Behavior: Throttle, PerKey: true}, window)
		assert.Equal(t, 1, admitted(e, "api", "k", 1))
		load(t, e, window)
		assert.Equal(t, 4, admitted(e, "api", "k", 10), "1 of 5 used")
	})
}

// The same for a PerKey Concurrency rule, over more keys than the tables
// hold (keys evicted with requests in flight move to the side table): a
// request that looks a key up while the table moves finds the state in
// flight, never a fresh one. No key ever holds more than its limit.
func TestPerKeyConcurrencyReloadsOfMaxKeysUnderTrafficKeepInFlight(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	const limit, keys, hold = 2, 300, 3
	rule := Rule{ID: "u", Resource: "api", Metric: Concurrency, Threshold: limit, PerKey: true, MaxKeys: 64}
	load(t, e, rule)
	stop := reloadingMaxKeys(e, rule, 128, 64)
	held := make([][]Entry, keys)
	most := 0
	for range 200 {
		clock.Advance(ms)
		for k := range keys {
			if len(held[k]) == hold {
				held[k][0].Exit(nil)
				held[k] = held[k][1:]
			}
			if en, err := e.Entry("api", WithKey(fmt.Sprint("k", k))); err == nil {
				held[k] = append(held[k], en)
			}
			most = max(most, len(held[k]))
		}
	}
	reloads, err := stop()
	require.NoError(t, err)
	assert.LessOrEqual(t, most, limit, "in flight on one key, over %d reloads", reloads)
	for k := range held {
		for _, en := range held[k] {
			en.Exit(nil)
		}
	}
	tbl := e.rules.Load().byResource["api"].keyConc.t
	assert.Empty(t, tbl.Pinned(), "nothing stays pinned once all exited")
}

// A PerKey rule reloaded to a longer window keeps what the old one knew of
// each key and charges what it did not (the part of the new window older
// than the old one's, at the old rule's limit): a key that had 10 at
// 0.1 s and 10 at 1.2 s under 10 a second gets nothing more under 10 a
// second over 2 s until the charge leaves its window, never 30 within
// 1.5 s.
func TestAPerKeyWindowOfANewLengthErrsStrict(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	r := Rule{Resource: "api", Threshold: 10, PerKey: true}
	load(t, e, r)
	at := func(d time.Duration, tries int) int {
		clock.Set(d)
		return admitted(e, "api", "k", tries)
	}
	require.Equal(t, 10, at(100*ms, 20))
	require.Equal(t, 10, at(1200*ms, 20))
	r.StatInterval = 2 * time.Second // 20 a window, buckets of 500 ms
	clock.Set(1300 * ms)
	load(t, e, r)
	assert.Zero(t, at(1300*ms, 20))
	assert.Zero(t, at(1900*ms, 20), "the charge (bucket [0, 500 ms)) is in the window")
	assert.Equal(t, 10, at(2000*ms, 20), "it left: the 10 of 1.2 s remain")
}

// A key a reload lists anew along with a longer window is charged its
// own limit's worth of what the old window knew not, not the rule's: a
// key that had 10 a second under the rule for 4 s, listed at 10 a second
// over a 4 s window while the rule drops to 1.25, gets nothing more
// within those 4 s (the rule's 5 would have let it take 25 more).
func TestAKeyListedWithANewWindowIsChargedItsOwnLimit(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	r := Rule{ID: "a", Resource: "api", PerKey: true, Threshold: 10}
	load(t, e, r)
	n := 0
	for s := range 4 {
		if s > 0 {
			clock.Advance(time.Second)
		}
		n += admitted(e, "api", "k", 20)
	}
	require.Equal(t, 40, n)
	r.StatInterval, r.Threshold, r.Keys = 4*time.Second, 1.25, []KeyLimit{{"k", 10}} // the rule 5, k 40 per 4 s
	load(t, e, r)
	assert.Zero(t, admitted(e, "api", "k", 100), "k: 40 within the last 4 s")
	assert.Equal(t, 5, admitted(e, "api", "other", 100), "a key the rule alone limits")
}
