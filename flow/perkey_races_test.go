package flow

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/stat/stattest"
)

// undead clears the dead flag of every state in tables' sets, so that a
// request spinning on one (see the migrate tests) can finish: cleanup only.
func undead(tables ...*keytable.Table) {
	for _, t := range tables {
		t.Revive()
	}
}

// returnsWithin runs fn in a goroutine and reports whether it returned
// within d (a hang detector, not a timing assertion: the functions under
// test do no I/O and take microseconds).
func returnsWithin(d time.Duration, fn func()) bool {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// A reload that lowers MaxKeys migrates states into a smaller table,
// evicting most of them there, while they are still in the old table's
// sets. A request that read the old rule set just before the reload (in
// flight across LoadRules) and finds such a state dead looks the key up
// again and returns: it never spins.
func TestKeyedShrinkingMaxKeysNeverHangsARequest(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	rule := Rule{ID: "u", Resource: "api", Threshold: 1000, PerKey: true, MaxKeys: 64}
	load(t, e, rule)
	const keys = 32
	for i := range keys {
		require.True(t, try(e, "api", WithKey(fmt.Sprint("k", i))))
	}
	oldSet := e.rules.Load() // what a request in flight across the reload read
	rrOld := oldSet.byResource["api"]
	oldTable := rrOld.keyed[0].t

	rule.MaxKeys = 4
	load(t, e, rule)
	newTable := e.rules.Load().byResource["api"].keyed[0].t
	defer undead(oldTable, newTable)

	hung := 0
	for i := range keys {
		key := fmt.Sprint("k", i)
		if !returnsWithin(2*time.Second, func() {
			en, err := e.enter(rrOld, rrOld.node, []EntryOption{WithKey(key)})
			if err == nil {
				en.Exit(nil)
			}
		}) {
			hung++
			undead(oldTable) // let it finish
		}
	}
	assert.Zero(t, hung, "requests on the old rule set that never returned (spinning on a dead state)")
}

// A reload that raises MaxKeys migrates the old table's states (the same
// pointers) into the new table. A request still on the old rule set that
// evicts one of them there does not make it dead for the new table: every
// later request for that key on the new rule set returns.
func TestKeyedGrowingMaxKeysNeverHangsAKey(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	rule := Rule{ID: "u", Resource: "api", Threshold: 1000, PerKey: true, MaxKeys: 4}
	load(t, e, rule)
	for i := range 4 {
		require.True(t, try(e, "api", WithKey(fmt.Sprint("a", i))))
	}
	oldSet := e.rules.Load()
	rrOld := oldSet.byResource["api"]
	oldTable := rrOld.keyed[0].t

	rule.MaxKeys = 1024
	load(t, e, rule)
	newTable := e.rules.Load().byResource["api"].keyed[0].t
	defer undead(oldTable, newTable)

	// One request that read the old rule set, for a key new to the table.
	en, err := e.enter(rrOld, rrOld.node, []EntryOption{WithKey("late")})
	require.NoError(t, err)
	en.Exit(nil)

	hung := 0
	for i := range 4 {
		key := fmt.Sprint("a", i)
		if !returnsWithin(2*time.Second, func() { try(e, "api", WithKey(key)) }) {
			hung++
			undead(newTable)
		}
	}
	assert.Zero(t, hung, "keys whose requests on the new rule set never return")
}

// A per-key Throttle key whose timeline restarted at now (an idle key's
// first request) keeps its pacing when evicted and seen again: an eviction
// gives it no free request, so its rate stays bounded.
func TestKeyedThrottleEvictionKeepsPacing(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	// 1 per second per key, no queueing: a second request within 1s is refused.
	load(t, e, Rule{Resource: "api", Threshold: 1, Behavior: Throttle, PerKey: true, MaxKeys: 4})
	require.True(t, try(e, "api", WithKey("hot")))
	require.False(t, try(e, "api", WithKey("hot")), "no eviction: refused")
	admittedHot, fresh := 1, 0
	for step := 1; step <= 10; step++ {
		clock.Advance(10 * ms) // 100 ms in all
		// 30 keys evicting in all: a table of 4 remembers them.
		for range 3 {
			fresh++
			try(e, "api", WithKey(fmt.Sprint("f", fresh)))
		}
		if try(e, "api", WithKey("hot")) {
			admittedHot++
		}
	}
	assert.LessOrEqual(t, admittedHot, 1, "hot key at 1/s admitted %d times in 100ms once evicted between requests", admittedHot)
}

// A reload that lists other Keys drops the spec states of the keys no
// longer listed: reloading with rotating Keys lists holds at most MaxKeys +
// len(Keys) states.
func TestKeyedSpecStatesAreDroppedByAReload(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	for round := range 50 {
		keys := make([]KeyLimit, 100)
		for i := range keys {
			keys[i] = KeyLimit{Key: fmt.Sprintf("r%d-k%d", round, i), Threshold: 5}
		}
		load(t, e, Rule{ID: "u", Resource: "api", Threshold: 1, PerKey: true, MaxKeys: 8, Keys: keys})
	}
	tbl := e.rules.Load().byResource["api"].keyed[0].t
	n := tbl.Listed()
	assert.LessOrEqual(t, n, 100, "spec states held by a rule listing 100 keys")
}

// lockedStarts collects per-key Start times from many goroutines.
type lockedStarts struct {
	mu sync.Mutex
	m  map[string][]int64
}

func (l *lockedStarts) add(mine map[string][]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[string][]int64{}
	}
	for k, v := range mine {
		l.m[k] = append(l.m[k], v...)
	}
}

// worstWindow is the most admissions of one key in any keytable.Buckets
// consecutive buckets of length bucket (aligned to engine-clock 0).
func worstWindow(starts []int64, bucket int64) (most int, at int64) {
	per := map[int64]int{}
	for _, s := range starts {
		per[s/bucket]++
	}
	for b := range per {
		n := 0
		for j := range int64(keytable.Buckets) {
			n += per[b+j]
		}
		if n > most {
			most, at = n, b
		}
	}
	return most, at
}

// One PerKey rule with StatInterval 1ms (buckets of 250µs) and more busy
// goroutines than cores over a few keys, on the real clock: a goroutine
// descheduled between reading the head and resetting its bucket word never
// erases a newer bucket's live counts. Checked on Start per key, windows
// aligned to bucket starts.
func TestKeyedTinyWindowHoldsOnABusyRealClock(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	const limit = 5 // per 1ms window
	load(t, e, Rule{Resource: "api", Threshold: limit * 1000, StatInterval: time.Millisecond, PerKey: true, MaxKeys: 16})
	const goroutines, keys = 32, 4
	bucket := int64(time.Millisecond / keytable.Buckets)
	var all lockedStarts
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Second)
	for g := range goroutines {
		wg.Go(func() {
			mine := map[string][]int64{}
			i := g
			for time.Now().Before(deadline) {
				i++
				k := fmt.Sprint("k", i%keys)
				en, err := e.Entry("api", WithKey(k))
				if err == nil {
					mine[k] = append(mine[k], en.Start())
					en.Exit(nil)
				}
			}
			all.add(mine)
		})
	}
	wg.Wait()
	for k, v := range all.m {
		most, at := worstWindow(v, bucket)
		assert.LessOrEqual(t, most, limit, "key %s: %d in the window of buckets %d..%d (%d admitted)", k, most, at, at+3, len(v))
	}
}

// Requests hammer many keys while rules reload back and forth between two
// MaxKeys: every request returns. The goroutines are checked for progress
// after the load stops.
func TestKeyedReloadingMaxKeysUnderLoadNeverHangs(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	rule := Rule{ID: "u", Resource: "api", Threshold: 1e6, PerKey: true, MaxKeys: 8}
	load(t, e, rule)
	var tables []*keytable.Table
	tables = append(tables, e.rules.Load().byResource["api"].keyed[0].t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			i := g * 7919
			for {
				select {
				case <-stop:
					return
				default:
				}
				i++
				try(e, "api", WithKey(fmt.Sprint("k", i%300)))
			}
		})
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		rule.MaxKeys = []int{8, 64}[n%2]
		require.NoError(t, e.LoadRules([]Rule{rule}))
		tables = append(tables, e.rules.Load().byResource["api"].keyed[0].t)
	}
	close(stop)
	finished := returnsWithin(5*time.Second, wg.Wait)
	if !finished {
		for !returnsWithin(100*time.Millisecond, wg.Wait) {
			undead(tables...)
		}
	}
	assert.True(t, finished, "request goroutines stuck after %d reloads", len(tables)-1)
}

// After a reload that changes MaxKeys of a PerKey Concurrency rule, entries
// admitted under the old rule set release through the old table while the
// new table pins and unpins: the pinned keys are shared under one lock (run
// with -race).
func TestKeyedConcurrencyMigrationGuardsPinnedKeysWithOneLock(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	rule := Rule{ID: "c", Resource: "api", Metric: Concurrency, Threshold: 1000, PerKey: true, MaxKeys: 4}
	load(t, e, rule)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			var held []Entry
			i := g * 7919
			for {
				select {
				case <-stop:
					for j := range held {
						held[j].Exit(nil)
					}
					return
				default:
				}
				i++
				if en, err := e.Entry("api", WithKey(fmt.Sprint("k", i%64))); err == nil {
					held = append(held, en)
				}
				if len(held) > 8 { // exit the oldest: some were admitted under an older rule set
					held[0].Exit(nil)
					held = held[1:]
				}
			}
		})
	}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		rule.MaxKeys = []int{4, 8}[n%2]
		require.NoError(t, e.LoadRules([]Rule{rule}))
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	tbl := e.rules.Load().byResource["api"].keyConc.t
	for i, st := range tbl.Pinned() {
		assert.Positive(t, st.InFlight(), "pinned state %d with nothing in flight", i)
	}
}

// Many goroutines enter and exit on many keys through a tiny PerKey
// Concurrency table: keys are evicted while in flight (pinned) and their
// requests exit concurrently with the pinning. Once everything exited, no
// state stays pinned. Up to 12 rounds of one second each (the race is
// narrow: about one round in six hit it under -race on 2 cores).
func TestKeyedConcurrencyUnpinsEveryEvictedKey(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 3, PerKey: true, MaxKeys: 4})
	tbl := e.rules.Load().byResource["api"].keyConc.t
	for round := range 3 {
		var wg sync.WaitGroup
		deadline := time.Now().Add(time.Second)
		for g := range 32 {
			wg.Go(func() {
				i := g*7919 + round
				for time.Now().Before(deadline) {
					i++
					en, err := e.Entry("api", WithKey(fmt.Sprint("k", i%1000)))
					if err == nil {
						runtime.Gosched() // in flight a moment: evicted while held
						en.Exit(nil)
					}
				}
			})
		}
		wg.Wait()
		var leaked []int64
		for _, st := range tbl.Pinned() {
			leaked = append(leaked, st.InFlight())
		}
		if !assert.Empty(t, leaked, "round %d: states left pinned (their in-flight counts) once every request exited", round) {
			return
		}
	}
}

func isBlocked(err error) bool {
	var be *BlockError
	return errorsAs(err, &be)
}

func errorsAs(err error, target any) bool { return errors.As(err, target) }

// The default 1s StatInterval: a key whose head moves by a whole window
// (four buckets: the same word) while another request sits between reading
// the head and reading its word keeps its counts. The clock steps by
// exactly 1s; no window holds more than the threshold (checked for 5 s).
func TestKeyedWholeWindowStepsKeepCounts(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	const limit = 5
	load(t, e, Rule{Resource: "api", Threshold: limit, PerKey: true})
	bucket := int64(250 * ms)
	stop := make(chan struct{})
	var mu sync.Mutex
	per := map[int64]int{} // admissions by bucket of Start
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				en, err := e.Entry("api", WithKey("k"))
				if err == nil {
					mu.Lock()
					per[en.Start()/bucket]++
					mu.Unlock()
					en.Exit(nil)
				}
			}
		})
	}
	most, at, steps := 0, int64(0), 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && most <= limit; steps++ {
		clock.Advance(time.Second)
		time.Sleep(100 * time.Microsecond)
		mu.Lock()
		for b := range per {
			n := 0
			for j := range int64(keytable.Buckets) {
				n += per[b+j]
			}
			if n > most {
				most, at = n, b
			}
		}
		clear(per) // each step is a window of its own
		mu.Unlock()
	}
	close(stop)
	wg.Wait()
	assert.LessOrEqual(t, most, limit, "in buckets %d..%d, after %d steps of 1s", at, at+3, steps)
}

// A request that read a rule set listing a key, and counts after a reload
// that no longer lists it and a flood that evicted it from the sets,
// looks the key up in the table: it returns, for every per-key kind
// (before, it retried on the listed key's dead state forever).
func TestARequestOfAnOldRuleSetFindsAnUnlistedKeyInTheTable(t *testing.T) {
	for _, r := range []Rule{
		{ID: "u", Resource: "api", Threshold: 100, PerKey: true, MaxKeys: 4},
		{ID: "u", Resource: "api", Threshold: 100, Behavior: Throttle, PerKey: true, MaxKeys: 4},
		{ID: "u", Resource: "api", Metric: Concurrency, Threshold: 100, PerKey: true, MaxKeys: 4},
	} {
		clock := stattest.NewClock(time.Hour)
		e, _ := newEngine(t, clock)
		listed := r
		listed.Keys = []KeyLimit{{Key: "vip", Threshold: 100}}
		load(t, e, listed)
		old := e.rules.Load().byResource["api"]
		load(t, e, r)
		clock.Advance(10 * time.Second)
		var held []Entry
		for i := range 8 {
			if en, err := e.Entry("api", WithKey(fmt.Sprint("k", i))); err == nil {
				held = append(held, en)
			}
		}
		admitted := false
		returned := returnsWithin(time.Second, func() {
			en, err := e.enter(old, old.node, []EntryOption{WithKey("vip")})
			if admitted = err == nil; admitted {
				en.Exit(nil)
			}
		})
		require.True(t, returned, "%v %v: the request never returned", r.Metric, r.Behavior)
		assert.True(t, admitted, "%v %v", r.Metric, r.Behavior)
		for _, en := range held {
			en.Exit(nil)
		}
	}
}

// Reloads that list new keys of a PerKey Concurrency rule while requests
// add keys to its table never deadlock: a listed key is taken from the
// sets without holding the lock of the listed keys, which an add takes
// under the sets' locks.
func TestListingKeysUnderTrafficNeverDeadlocks(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	rule := Rule{ID: "u", Resource: "api", Metric: Concurrency, Threshold: 1, PerKey: true, MaxKeys: 4}
	load(t, e, rule)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			for i := g; ; i += 2 {
				select {
				case <-stop:
					return
				default:
				}
				try(e, "api", WithKey(fmt.Sprint("k", i%64)))
			}
		})
	}
	reloads := 0
	done := returnsWithin(5*time.Second, func() {
		for ; reloads < 300; reloads++ {
			rule.Keys = []KeyLimit{{Key: fmt.Sprint("k", reloads%64), Threshold: 1}}
			if err := e.LoadRules([]Rule{rule}); err != nil {
				t.Error(err)
				return
			}
		}
	})
	close(stop)
	if done {
		wg.Wait()
	}
	assert.True(t, done, "reloads stuck after %d", reloads)
}

// TestListingKeysUnderTrafficNeverAdmitsTwice: reloads that list and
// unlist keys of two PerKey rules (tiny tables: keys are evicted and their
// states reused all along) run while requests of the old and the new rule
// set count: each key has one state in each rule whichever rule set finds
// it, so no key is admitted over the stricter rule's threshold in any
// window (brute force over every 4-bucket window). Window rules, and the
// same for in-flight counts of Concurrency rules.
func TestListingKeysUnderTrafficNeverAdmitsTwice(t *testing.T) {
	const keys, goroutines, phases = 8, 8, 300
	ruleSet := func(kind Metric, v int) []Rule {
		a := Rule{ID: "a", Resource: "api", Metric: kind, Threshold: 3, PerKey: true, MaxKeys: 4}
		b := Rule{ID: "b", Resource: "api", Metric: kind, Threshold: 2, PerKey: true, MaxKeys: 1}
		switch v % 3 {
		case 1:
			a.Keys = []KeyLimit{{"k0", 3}, {"k1", 3}}
			b.Keys = []KeyLimit{{"k2", 2}}
		case 2:
			a.Keys = []KeyLimit{{"k2", 3}}
			b.Keys = []KeyLimit{{"k0", 2}, {"k1", 2}}
		}
		if kind == Concurrency {
			// One PerKey Concurrency rule per resource: b's keys on a.
			a.Threshold, a.Keys = 2, append(a.Keys, b.Keys...)
			for i := range a.Keys {
				a.Keys[i].Threshold = 2
			}
			return []Rule{a}
		}
		return []Rule{a, b}
	}
	t.Run("window", func(t *testing.T) {
		clock := stattest.NewClock(time.Hour)
		e, _ := newEngine(t, clock)
		load(t, e, ruleSet(QPS, 0)...)
		const bucket = int64(250 * time.Millisecond)
		admitted := make([]map[int64]int64, keys) // by key, by bucket
		for k := range admitted {
			admitted[k] = map[int64]int64{}
		}
		for phase := range phases {
			clock.Advance(time.Duration(phase*7919%150) * time.Millisecond)
			at := clock.Now() / bucket
			var counts [keys]atomic.Int64
			duringReload(t, e, ruleSet(QPS, phase), goroutines, 40, keys, phase, func(k int) {
				if try(e, "api", WithKey(fmt.Sprint("k", k))) {
					counts[k].Add(1)
				}
			})
			for k := range counts {
				admitted[k][at] += counts[k].Load()
			}
		}
		for k, per := range admitted {
			for b := range per {
				held := per[b] + per[b+1] + per[b+2] + per[b+3]
				assert.LessOrEqual(t, held, int64(2), "key k%d, buckets %d to %d", k, b, b+3)
			}
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		e, _ := newEngine(t, stattest.NewClock(time.Hour))
		load(t, e, ruleSet(Concurrency, 0)...)
		var inFlight [keys]atomic.Int64
		var worst atomic.Int64
		for phase := range phases {
			duringReload(t, e, ruleSet(Concurrency, phase), goroutines, 40, keys, phase, func(k int) {
				en, err := e.Entry("api", WithKey(fmt.Sprint("k", k)))
				if err != nil {
					return
				}
				n := inFlight[k].Add(1)
				for w := worst.Load(); n > w && !worst.CompareAndSwap(w, n); w = worst.Load() {
				}
				runtime.Gosched()
				inFlight[k].Add(-1)
				en.Exit(nil)
			})
		}
		assert.LessOrEqual(t, worst.Load(), int64(2), "in flight under one key")
	})
}

// A reload that changes a PerKey rule's StatInterval makes its key table
// anew; the requests of the rule set it replaces, which run on until the
// new one is in force, count in the new table under the stricter of their
// two limits: none is admitted past a limit the new rules would see, for
// a key the old table tracked, a listed key, a key new to it, requests
// without a key, or a Global rule's local fallback.
func TestRequestsOfTheReplacedRuleSetCountInTheNewWindow(t *testing.T) {
	for _, global := range []bool{false, true} {
		t.Run(fmt.Sprintf("global=%v", global), func(t *testing.T) {
			clock := stattest.NewClock(time.Hour)
			src := &fakeSource{}
			src.err.Store(errors.New("down")) // the local fallback decides
			e, _ := newEngine(t, clock, WithTokenSource(src))
			rule := func(interval time.Duration) Rule {
				// 3 per window in both rule sets, 2 for listed key v.
				per := float64(time.Second) / float64(interval)
				r := Rule{ID: "a", Resource: "api", PerKey: true, Threshold: 3 * per, StatInterval: interval,
					Keys: []KeyLimit{{"v", 2 * per}}}
				if global {
					r.Global, r.LocalShare, r.Threshold, r.Keys[0].Threshold = true, 0.5, 2*r.Threshold, 2*r.Keys[0].Threshold
				}
				return r
			}
			load(t, e, rule(2*time.Second))
			for _, key := range []string{"k", "v", ""} {
				require.Equal(t, 1, admitted(e, "api", key, 1), "key %q", key)
			}
			// A request that read the rule set just before a reload to a
			// shorter window (nothing charged for what the old one knew not).
			old := e.rules.Load().byResource["api"]
			load(t, e, rule(time.Second))
			for _, c := range []struct {
				key   string
				limit int
			}{{"k", 3}, {"v", 2}, {"", 3}, {"new", 3}} {
				var opts []EntryOption
				if c.key != "" {
					opts = append(opts, WithKey(c.key))
				}
				n := 0
				for range 5 {
					if en, err := e.enter(old, old.node, opts); err == nil {
						en.Exit(nil)
						n++
					}
				}
				n += admitted(e, "api", c.key, 5)
				if c.key != "new" {
					n++ // before the reload
				}
				assert.Equal(t, c.limit, n, "key %q admitted at one instant by both rule sets, limit %d a window in each", c.key, c.limit)
			}
		})
	}
}

// A request of the replaced rule set that counted in the new table of
// another window starts in the new table's bucket, not an instant scaled
// by the old buckets' length: its Entry starts at the clock, and a second
// PerKey rule counts it now (a start hours ahead would shut the key out
// of that rule until the clock got there), on the one-rule path and the
// general one, for a shorter window and a longer.
func TestRequestsOfTheReplacedRuleSetStartAtTheirAdmission(t *testing.T) {
	for _, c := range []struct {
		name     string
		from, to time.Duration
		second   bool // a second PerKey rule: the general path
		// keys of the old rule set's requests: after a longer window, k's
		// unseen past is charged its old limit, which refuses them
		keys []string
	}{
		{"shorter", 3 * time.Second, time.Second, false, []string{"k", "new"}},
		{"shorter, two rules", 3 * time.Second, time.Second, true, []string{"k", "new"}},
		{"longer", time.Second, 3 * time.Second, false, []string{"new"}},
		{"longer, two rules", time.Second, 3 * time.Second, true, []string{"new"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := stattest.NewClock(time.Hour)
			e, _ := newEngine(t, clock)
			rules := func(interval time.Duration) []Rule {
				// 10 a second: a longer window charges what the old one
				// knew not at 10 a second, below its limit.
				rs := []Rule{{ID: "a", Resource: "api", PerKey: true, Threshold: 10, StatInterval: interval}}
				if c.second {
					rs = append(rs, Rule{ID: "b", Resource: "api", PerKey: true, Threshold: 5})
				}
				return rs
			}
			load(t, e, rules(c.from)...)
			require.True(t, try(e, "api", WithKey("k")))
			old := e.rules.Load().byResource["api"]
			load(t, e, rules(c.to)...)
			for _, key := range c.keys {
				en, err := e.enter(old, old.node, []EntryOption{WithKey(key)})
				require.NoError(t, err, "key %s: within every limit", key)
				assert.Equal(t, clock.Now(), en.Start(), "key %s: admitted now", key)
				en.Exit(nil)
			}
			// One a second, each within every limit, from the new rule set.
			n := 0
			for range 10 {
				clock.Advance(time.Second)
				if try(e, "api", WithKey("new")) {
					n++
				}
			}
			assert.Equal(t, 10, n, "one a second under limits of 5 and 10 a second")
		})
	}
}

// A request of a rule set two reloads back, one of MaxKeys and then one
// of the window, counts in the newest table and returns, with or without
// a key, for a PerKey rule and a Global one's local fallback.
func TestRequestsOfARuleSetTwoReloadsBackCountInTheNewest(t *testing.T) {
	for _, global := range []bool{false, true} {
		t.Run(fmt.Sprintf("global=%v", global), func(t *testing.T) {
			src := &fakeSource{}
			src.err.Store(errors.New("down")) // the local fallback decides
			e, _ := newEngine(t, stattest.NewClock(time.Hour), WithTokenSource(src))
			rule := Rule{ID: "a", Resource: "api", Threshold: 3, PerKey: true, MaxKeys: 64, StatInterval: time.Second}
			if global {
				rule.Global, rule.LocalShare, rule.Threshold = true, 0.5, 6
			}
			load(t, e, rule)
			require.True(t, try(e, "api", WithKey("k")))
			old := e.rules.Load().byResource["api"]
			rule.MaxKeys = 128
			load(t, e, rule)
			rule.StatInterval = 500 * time.Millisecond // shorter: nothing charged
			rule.Threshold *= 2
			load(t, e, rule)
			for _, opts := range [][]EntryOption{{WithKey("k")}, {WithKey("fresh")}, nil} {
				var err error
				returned := returnsWithin(5*time.Second, func() {
					var en Entry
					if en, err = e.enter(old, old.node, opts); err == nil {
						en.Exit(nil)
					}
				})
				require.True(t, returned, "%d options: the request returns", len(opts))
				assert.NoError(t, err, "%d options: within its limit", len(opts))
			}
			assert.Equal(t, 1, admitted(e, "api", "k", 5), "k: 2 of 3 in this window")
		})
	}
}

// Reloads that alternate a PerKey rule's StatInterval, its Keys and its
// MaxKeys under traffic never admit a key past its limit at one instant,
// whichever rule set admitted it: the requests of a replaced rule set
// count where the new one sees them.
func TestReloadsOfNewWindowsUnderTrafficNeverAdmitOverTheLimit(t *testing.T) {
	const keys, goroutines, epochs, phases = 12, 8, 40, 8
	rule := func(v int) Rule {
		interval := []time.Duration{time.Second, 2 * time.Second}[v/2%2]
		r := Rule{ID: "a", Resource: "api", PerKey: true, StatInterval: interval,
			Threshold: 3 * float64(time.Second) / float64(interval), MaxKeys: []int{4, 8, 12}[v%3]}
		for _, k := range [][]string{nil, {"k0", "k1"}, {"k2"}, {"k0", "k2", "k3"}}[v%4] {
			r.Keys = append(r.Keys, KeyLimit{k, r.Threshold})
		}
		return r
	}
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e, rule(0))
	v := 0
	for epoch := range epochs {
		clock.Advance(10 * time.Second) // a fresh window for every key
		var admitted [keys]atomic.Int64
		for range phases {
			v++
			duringReload(t, e, []Rule{rule(v)}, goroutines, 3, keys, v, func(k int) {
				if try(e, "api", WithKey(fmt.Sprint("k", k))) {
					admitted[k].Add(1)
				}
			})
		}
		for k := range admitted {
			require.LessOrEqual(t, admitted[k].Load(), int64(3), "epoch %d, key k%d", epoch, k)
		}
	}
}

// duringReload loads rules while goroutines goroutines make tries requests
// each, request(k) for keys k spread over keys by the goroutine, the try
// and phase, and fails t if the load failed.
func duringReload(t *testing.T, e *Engine, rules []Rule, goroutines, tries, keys, phase int, request func(k int)) {
	t.Helper()
	var wg sync.WaitGroup
	var reloadErr error
	wg.Go(func() { reloadErr = e.LoadRules(rules) })
	for g := range goroutines {
		wg.Go(func() {
			for i := range tries {
				request((g*31 + i*17 + phase) % keys)
			}
		})
	}
	wg.Wait()
	require.NoError(t, reloadErr)
}
