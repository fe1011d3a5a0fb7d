package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// admitted counts the requests of tries admitted for key ("": no key).
func admitted(e *Engine, resource, key string, tries int) int {
	var opts []EntryOption
	if key != "" {
		opts = append(opts, WithKey(key))
	}
	ok := 0
	for range tries {
		if try(e, resource, opts...) {
			ok++
		}
	}
	return ok
}

func TestPerKeyValidation(t *testing.T) {
	long := strings.Repeat("k", maxKeyLen+1)
	for _, tc := range []struct {
		rules []Rule
		want  string
	}{
		{[]Rule{{Resource: "api", PerKey: true, Behavior: WarmUp, WarmUpPeriod: time.Second}}, "Behavior must be Reject or Throttle for a PerKey rule, got WarmUp"},
		{[]Rule{{Resource: "api", PerKey: true, RelatedResource: "db"}}, "RelatedResource cannot be combined with PerKey, got db"},
		{[]Rule{{Resource: "api", PerKey: true, MaxKeys: -1}}, "MaxKeys must be in [1, 16777216], got -1"},
		{[]Rule{{Resource: "api", PerKey: true, MaxKeys: maxMaxKeys + 1}}, "MaxKeys must be in [1, 16777216], got 16777217"},
		{[]Rule{{Resource: "api", MaxKeys: 10}}, "MaxKeys is used only by PerKey rules and must be left zero here, got 10"},
		{[]Rule{{Resource: "api", Keys: []KeyLimit{{Key: "a", Threshold: 1}}}}, "Keys is used only by PerKey rules and must be left zero here, got 1"},
		{[]Rule{{Resource: "api", PerKey: true, Keys: []KeyLimit{{Key: "", Threshold: 1}}}}, `Keys[0].Key must not be empty, got ""`},
		{[]Rule{{Resource: "api", PerKey: true, Keys: []KeyLimit{{Key: long, Threshold: 1}}}}, "Keys[0].Key must be at most 1024 bytes"},
		{[]Rule{{Resource: "api", PerKey: true, Keys: []KeyLimit{{Key: "a", Threshold: 1}, {Key: "a", Threshold: 2}}}}, `Keys[1].Key is listed twice, got "a"`},
		{[]Rule{{Resource: "api", PerKey: true, Keys: []KeyLimit{{Key: "a", Threshold: -1}}}}, "Keys[0].Threshold must be a finite number in [0, 1e+12], got -1"},
		{[]Rule{{Resource: "api", PerKey: true, Threshold: 5e9}}, "Threshold admits 5000000000 per window, more than a key's window holds"},
		{[]Rule{{Resource: "api", PerKey: true, Threshold: 1, Keys: []KeyLimit{{Key: "vip", Threshold: 1e10}}}}, "Keys[0].Threshold admits 10000000000 per window"},
		{[]Rule{{Resource: "api", PerKey: true, Behavior: Throttle, Keys: []KeyLimit{{Key: "a", Threshold: 1e-4}}}}, "Keys[0].Threshold must be 0 or at least 0.001"},
		{[]Rule{{Resource: "api", PerKey: true, Metric: Concurrency, Threshold: 1}, {Resource: "api", PerKey: true, Metric: Concurrency, Threshold: 2}}, "is a second PerKey Concurrency rule for resource api"},
		{[]Rule{{Resource: "a", PerKey: true, MaxKeys: 600_000}, {Resource: "b", PerKey: true, MaxKeys: 600_000}}, "MaxKeys takes the rule set's keys to 1200000, over the engine's WithMaxKeys (1000000), got 600000"},
	} {
		e, _ := newEngine(t, stattest.NewClock(0))
		load(t, e, Rule{Resource: "keep", Threshold: 1})
		err := e.LoadRules(tc.rules)
		require.Error(t, err, "%+v", tc.rules)
		assert.Contains(t, err.Error(), tc.want)
		assert.ErrorIs(t, err, ErrInvalidRule)
		assert.Equal(t, []Rule{{Resource: "keep", Threshold: 1, StatInterval: time.Second}}, e.Rules(), "a bad rule set changes nothing")
	}
	_, err := New(WithMaxKeys(0))
	assert.ErrorContains(t, err, "WithMaxKeys must be in [1, 2^30], got 0")
}

func TestPerKeyDefaultsAndRoundTrip(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	keys := []KeyLimit{{Key: "vip", Threshold: 30}}
	load(t, e, Rule{Resource: "api", Threshold: 3, PerKey: true, Keys: keys})
	got := e.Rules()
	require.Len(t, got, 1)
	assert.Equal(t, defaultMaxKeys, got[0].MaxKeys)
	keys[0].Threshold = 1 // the caller's slice is theirs
	assert.Equal(t, 30.0, e.Rules()[0].Keys[0].Threshold)
	require.NoError(t, e.LoadRules(got), "the normalised rules load again")
	assert.Equal(t, got, e.Rules())
}

func TestWithKeyErrors(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 3, PerKey: true})
	for _, key := range []string{"", strings.Repeat("x", maxKeyLen+1)} {
		en, err := e.Entry("api", WithKey(key))
		require.ErrorIs(t, err, ErrInvalidOption)
		en.Exit(nil)
	}
	snap, _ := e.Snapshot("api")
	assert.Zero(t, snap.PassQPS+snap.BlockQPS, "neither admitted nor blocked")
	assert.True(t, try(e, "api", WithKey(strings.Repeat("x", maxKeyLen))), "maxKeyLen bytes is a key")
}

// TestPerKeyRejectSteps: each key has its own sliding window of four
// buckets; specific keys have their own thresholds; requests without a
// key share one entry.
func TestPerKeyRejectSteps(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 4, PerKey: true,
		Keys: []KeyLimit{{Key: "premium", Threshold: 40}, {Key: "abuser", Threshold: 0}}})
	steps := []struct {
		at         time.Duration
		key        string
		tries, got int
	}{
		{0, "alice", 3, 3},
		{0, "bob", 10, 4},
		{250 * ms, "alice", 3, 1}, // 3 in the first bucket, 1 here
		{999 * ms, "alice", 1, 0},
		{1000 * ms, "alice", 5, 3}, // the first bucket left the window
		{1250 * ms, "alice", 5, 1},
		{1250 * ms, "premium", 50, 40},
		{1250 * ms, "abuser", 5, 0},
		{1250 * ms, "", 10, 4},
		{1250 * ms, "bob", 10, 4},
		{2250 * ms, "premium", 50, 40},
	}
	for _, st := range steps {
		clock.Set(st.at)
		assert.Equal(t, st.got, admitted(e, "api", st.key, st.tries), "%v %q", st.at, st.key)
	}
	snap, _ := e.Snapshot("api")
	assert.Equal(t, int64(10), snap.Keyless)
	assert.Zero(t, snap.KeyEvictions)
}

// TestPerKeyBatches: a batch is admitted or blocked whole per key.
func TestPerKeyBatches(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 10, PerKey: true})
	assert.False(t, try(e, "api", WithKey("a"), WithCount(11)))
	assert.True(t, try(e, "api", WithKey("a"), WithCount(7)))
	assert.False(t, try(e, "api", WithKey("a"), WithCount(4)))
	assert.True(t, try(e, "api", WithKey("a"), WithCount(3)))
	assert.True(t, try(e, "api", WithKey("b"), WithCount(10)))
}

func TestPerKeyThrottleSteps(t *testing.T) {
	clock := stattest.NewClock(0)
	e, s := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10, Behavior: Throttle, MaxQueueing: 200 * ms, PerKey: true,
		Keys: []KeyLimit{{Key: "fast", Threshold: 100}}})
	for _, key := range []string{"a", "b"} {
		for i := range 3 {
			assert.True(t, try(e, "api", WithKey(key)), "%s #%d queues at most 200ms", key, i)
		}
		assert.False(t, try(e, "api", WithKey(key)), "%s: a fourth would wait 300ms", key)
	}
	assert.Equal(t, []time.Duration{100 * ms, 200 * ms, 100 * ms, 200 * ms}, s.waits, "each key queues on its own")
	s.waits = nil
	for range 3 {
		assert.True(t, try(e, "api", WithKey("fast")))
	}
	assert.Equal(t, []time.Duration{10 * ms, 20 * ms}, s.waits)
	clock.Advance(time.Second)
	assert.True(t, try(e, "api", WithKey("a")), "the timeline is in the past")

	// A cancelled wait gives its slot back.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := e.Entry("api", WithKey("c"), WithContext(ctx)) // first: no wait
	require.NoError(t, err)
	_, err = e.Entry("api", WithKey("c"), WithContext(ctx))
	require.ErrorIs(t, err, context.Canceled)
	s.waits = nil
	assert.True(t, try(e, "api", WithKey("c")))
	assert.Equal(t, []time.Duration{100 * ms}, s.waits, "the cancelled request's slot was given back")
}

func TestPerKeyConcurrency(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 2, PerKey: true,
		Keys: []KeyLimit{{Key: "big", Threshold: 5}}})
	var held []Entry
	for range 2 {
		en, err := e.Entry("api", WithKey("a"))
		require.NoError(t, err)
		held = append(held, en)
	}
	_, err := e.Entry("api", WithKey("a"))
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonConcurrency, be.Reason)
	assert.True(t, try(e, "api", WithKey("b")), "another key has its own limit")
	assert.Equal(t, 5, admittedHeld(t, e, "big", 10))
	cp := held[0]
	held[0].Exit(nil)
	cp.Exit(nil) // a copy exits nothing more
	assert.True(t, try(e, "api", WithKey("a")))
	en, err := e.Entry("api", WithKey("a"))
	require.NoError(t, err)
	_, err = e.Entry("api", WithKey("a"))
	require.Error(t, err, "one exit frees one place")
	en.Exit(nil)
	held[1].Exit(nil)
	assert.Equal(t, 2, admittedHeld(t, e, "a", 3))
}

// admittedHeld enters tries requests for key without exiting, counts those
// admitted, then exits them all.
func admittedHeld(t *testing.T, e *Engine, key string, tries int) int {
	t.Helper()
	var held []Entry
	for range tries {
		if en, err := e.Entry("api", WithKey(key)); err == nil {
			held = append(held, en)
		}
	}
	for i := range held {
		held[i].Exit(nil)
	}
	return len(held)
}

// TestPerKeyConcurrencyKeyInFlightIsNeverEvicted: a key with requests in
// flight that a flood of other keys pushes out of a small table keeps its
// count, and frees it when they exit.
func TestPerKeyConcurrencyKeyInFlightIsNeverEvicted(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Metric: Concurrency, Threshold: 2, PerKey: true, MaxKeys: 4})
	a1, err := e.Entry("api", WithKey("a"))
	require.NoError(t, err)
	a2, err := e.Entry("api", WithKey("a"))
	require.NoError(t, err)
	var flood []Entry
	for i := range 200 {
		en, err := e.Entry("api", WithKey(fmt.Sprint("k", i)))
		require.NoError(t, err)
		if i%50 == 0 {
			flood = append(flood, en) // some stay in flight too
		} else {
			en.Exit(nil)
		}
	}
	assert.False(t, try(e, "api", WithKey("a")), "still two in flight")
	a1.Exit(nil)
	assert.Equal(t, 1, admittedHeld(t, e, "a", 3))
	a2.Exit(nil)
	assert.Equal(t, 2, admittedHeld(t, e, "a", 3))
	for _, en := range flood {
		en.Exit(nil)
	}
	tbl := e.rules.Load().byResource["api"].keyConc.t
	assert.Empty(t, tbl.Pinned(), "no state stays pinned once its requests exited")
}

// TestPerKeyEvictionAttack: one hot key, and between each of its requests
// a flood of fresh keys that push it out of a table of 8. Evicted and
// admitted again, it must start from what it had: in no window may it
// pass its threshold.
func TestPerKeyEvictionAttack(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	const threshold = 10
	load(t, e, Rule{Resource: "api", Threshold: threshold, PerKey: true, MaxKeys: 8})
	var times []time.Duration
	fresh := 0
	for step := range 400 {
		clock.Set(time.Duration(step) * 10 * ms) // 4 s
		if try(e, "api", WithKey("hot")) {
			times = append(times, time.Duration(step)*10*ms)
		}
		for range 20 {
			fresh++
			try(e, "api", WithKey(fmt.Sprint("fresh-", fresh)))
		}
	}
	most := mostInWindow(times, time.Second, 250*ms)
	assert.LessOrEqual(t, most, threshold, "the hot key in any of its windows")
	assert.GreaterOrEqual(t, len(times), 3*threshold, "it is limited, not shut out")
	snap, _ := e.Snapshot("api")
	assert.Positive(t, snap.KeyEvictions, "evictions of active keys are counted")
	t.Logf("hot key admitted %d in 4 s, at most %d in a window; %d active evictions", len(times), most, snap.KeyEvictions)
}

// mostInWindow is the most admissions in any window of length w aligned
// to buckets of bucket (the windows the rule counts in).
func mostInWindow(times []time.Duration, w, bucket time.Duration) int {
	most := 0
	for i, at := range times {
		start := at - at%bucket
		n := 0
		for _, x := range times[i:] {
			if x < start+w {
				n++
			}
		}
		// Admissions earlier in at's bucket count too.
		for _, x := range times[:i] {
			if x >= start {
				n++
			}
		}
		most = max(most, n)
	}
	return most
}

// TestPerKeyReloadKeepsCounts: a reload that changes the threshold, or
// MaxKeys, keeps each key's count in its window.
func TestPerKeyReloadKeepsCounts(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{ID: "u", Resource: "api", Threshold: 5, PerKey: true})
	assert.Equal(t, 5, admitted(e, "api", "a", 10))
	load(t, e, Rule{ID: "u", Resource: "api", Threshold: 8, PerKey: true})
	assert.Equal(t, 3, admitted(e, "api", "a", 10), "5 of 8 used")
	load(t, e, Rule{ID: "u", Resource: "api", Threshold: 8, PerKey: true, MaxKeys: 64})
	assert.Zero(t, admitted(e, "api", "a", 10), "moved to the new table with its count")
	assert.Equal(t, 8, admitted(e, "api", "b", 10))
}

// TestPerKeyOddKeys: keys that look alike, or hold braces, newlines or
// binary, are each their own key.
func TestPerKeyOddKeys(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e, Rule{Resource: "api", Threshold: 1, PerKey: true})
	keys := []string{"a", "a ", "{a}", "a\n", "\x00", "\x00\x00", "é", "\xff\xfe", "id:a", "{id:a}"}
	for _, k := range keys {
		assert.True(t, try(e, "api", WithKey(k)), "%q", k)
	}
	for _, k := range keys {
		assert.False(t, try(e, "api", WithKey(k)), "%q", k)
	}
}

// TestPerKeyHammerFewKeys: many goroutines over few keys, one window (the
// clock stands still): each key admits exactly its threshold, and the
// resource's pass count is the sum over keys.
func TestPerKeyHammerFewKeys(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	const threshold, keys, goroutines, tries = 50, 5, 32, 200
	load(t, e, Rule{Resource: "api", Threshold: threshold, PerKey: true},
		Rule{Resource: "api", Metric: Concurrency, Threshold: 3, PerKey: true})
	var got [keys]int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			var mine [keys]int64
			for i := range tries {
				k := (g + i) % keys
				if try(e, "api", WithKey(fmt.Sprint("key-", k))) {
					mine[k]++
				}
			}
			mu.Lock()
			for k := range mine {
				got[k] += mine[k]
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	var sum int64
	for k := range got {
		assert.LessOrEqual(t, got[k], int64(threshold), "key %d", k)
		sum += got[k]
	}
	snap, _ := e.Snapshot("api")
	assert.Equal(t, float64(sum), snap.PassQPS, "pass is the sum over keys")
	assert.Zero(t, snap.Inflight)
}

// TestPerKeyHammerManyKeys: many goroutines over more keys than the table
// holds, on the real clock: evictions under load, every key's admissions
// within its threshold in every window (checked on their admission times),
// and the resource's pass count equal to the sum over keys.
func TestPerKeyHammerManyKeys(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	const threshold, keys, goroutines = 20, 200, 16 // keys a table of 64 remembers when evicted
	load(t, e, Rule{Resource: "api", Threshold: threshold, PerKey: true, MaxKeys: 64})
	var mu sync.Mutex
	starts := map[int][]int64{}
	var wg sync.WaitGroup
	deadline := time.Now().Add(1500 * time.Millisecond)
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			mine := map[int][]int64{}
			for time.Now().Before(deadline) {
				// Skewed: a few hot keys, a long tail.
				k := int(float64(keys) * rng.Float64() * rng.Float64() * rng.Float64())
				en, err := e.Entry("api", WithKey(fmt.Sprint("k", k)))
				if err == nil {
					mine[k] = append(mine[k], en.Start())
					en.Exit(nil)
				}
			}
			mu.Lock()
			for k, v := range mine {
				starts[k] = append(starts[k], v...)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	total, worst := 0, 0
	for _, v := range starts {
		slices.Sort(v)
		times := make([]time.Duration, len(v))
		for i := range v {
			times[i] = time.Duration(v[i])
		}
		worst = max(worst, mostInWindow(times, time.Second, 250*ms))
		total += len(v)
	}
	assert.LessOrEqual(t, worst, threshold, "no key over its threshold in any window")
	snap, _ := e.Snapshot("api")
	assert.Equal(t, int64(total), snap.MinutePass, "pass is the sum over keys")
	assert.Positive(t, snap.KeyEvictions)
	t.Logf("%d admitted over %d keys, most in a window %d, %d active evictions", total, len(starts), worst, snap.KeyEvictions)
}

func TestPerKeyPathsAllocateNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	load(t, e,
		Rule{Resource: "qps", Threshold: 1e9, PerKey: true},
		Rule{Resource: "mixed", Threshold: 1e9, PerKey: true},
		Rule{Resource: "mixed", Threshold: 1e9},
		Rule{Resource: "mixed", Metric: Concurrency, Threshold: 1e9, PerKey: true},
		Rule{Resource: "paced", Threshold: 1e9, Behavior: Throttle, PerKey: true, Keys: []KeyLimit{{Key: "vip", Threshold: 1e9}}},
	)
	for name, fn := range map[string]func(){
		"qps":       func() { try(e, "qps", WithKey("user-0000000001")) },
		"qps-nokey": func() { try(e, "qps") },
		"mixed":     func() { try(e, "mixed", WithKey("user-0000000001")) },
		"paced":     func() { try(e, "paced", WithKey("user-0000000001")) },
		"paced-vip": func() { try(e, "paced", WithKey("vip")) },
	} {
		fn()
		assert.Zero(t, testing.AllocsPerRun(1000, fn), name)
	}
}

// TestNewKeysThroughAFullTableAllocateNothing: with a key table full,
// every request of a new key evicts another and takes its state: no rule
// kind allocates for it (the evicted keys' memory is made once).
func TestNewKeysThroughAFullTableAllocateNothing(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "qps", Threshold: 1e9, PerKey: true, MaxKeys: 256},
		Rule{Resource: "paced", Threshold: 1e9, Behavior: Throttle, PerKey: true, MaxKeys: 256},
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 1e9, PerKey: true, MaxKeys: 256},
	)
	keys := make([]string, 1<<14)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%011d", i)
	}
	for _, res := range []string{"qps", "paced", "conc"} {
		i := 0
		next := func() {
			clock.Advance(time.Microsecond)
			try(e, res, WithKey(keys[i%len(keys)]))
			i++
		}
		for range 4096 { // full, and evicting
			next()
		}
		before := e.rules.Load().byResource[res].node.KeyEvictions()
		assert.Zero(t, testing.AllocsPerRun(2000, next), res)
		if res == "qps" {
			assert.Greater(t, e.rules.Load().byResource[res].node.KeyEvictions(), before, "active keys evicted")
		}
	}
}

// TestPerKeyBoundedMemory: a million distinct keys through a rule with
// MaxKeys 1000 leave at most 1000 tracked, and no request errs.
func TestPerKeyBoundedMemory(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 1, PerKey: true, MaxKeys: 1000})
	for i := range 200_000 {
		clock.Advance(10 * time.Microsecond)
		en, err := e.Entry("api", WithKey(fmt.Sprint(i)))
		if err != nil && !errors.Is(err, ErrBlocked) {
			require.NoError(t, err)
		}
		en.Exit(nil)
	}
	tbl := e.rules.Load().byResource["api"].keyed[0].t
	assert.LessOrEqual(t, tbl.Len(), int64(1000))
	assert.Equal(t, 1000, tbl.Capacity())
}

// Requests without a key share one "no key" entry under every PerKey
// kind: a PerKey Concurrency rule holds them, together, at its threshold.
func TestKeylessRequestsShareOneKeyUnderEveryKind(t *testing.T) {
	for _, r := range []Rule{
		{Resource: "api", Threshold: 2, PerKey: true},
		{Resource: "api", Metric: Concurrency, Threshold: 2, PerKey: true},
	} {
		t.Run(r.Metric.String(), func(t *testing.T) {
			e, _ := newEngine(t, stattest.NewClock(0))
			load(t, e, r)
			var held []Entry
			for range 2 {
				en, err := e.Entry("api")
				require.NoError(t, err)
				held = append(held, en)
			}
			_, err := e.Entry("api")
			assert.ErrorIs(t, err, ErrBlocked, "a third request without a key")
			en, err := e.Entry("api", WithKey("k"))
			require.NoError(t, err, "a key of its own is apart")
			en.Exit(nil)
			if r.Metric == Concurrency {
				held[0].Exit(nil)
				en, err := e.Entry("api")
				require.NoError(t, err, "one exited: room again")
				en.Exit(nil)
			}
		})
	}
}

// allowKey reports whether key's request is admitted.
func allowKey(e *Engine, key string) bool {
	_, err := e.Allow("api", WithKey(key))
	return err == nil
}

// A flood of distinct keys, one request each in one window, through a
// table far smaller than the flood: none is refused. An evicted key leaves
// only its own counts behind, so no key starts from another's.
func TestAFloodOfDistinctKeysShutsNoKeyOut(t *testing.T) {
	keys := 1_000_000
	if raceEnabled {
		keys = 100_000
	}
	for _, maxKeys := range []int{1024, 100_000} {
		t.Run(fmt.Sprint("MaxKeys=", maxKeys), func(t *testing.T) {
			e, _ := newEngine(t, stattest.NewClock(time.Hour))
			load(t, e, Rule{Resource: "api", Threshold: 10, PerKey: true, MaxKeys: maxKeys})
			refused := 0
			for k := range keys {
				if !allowKey(e, "k"+strconv.Itoa(k)) {
					refused++
				}
			}
			assert.Zero(t, refused, "of %d distinct keys", keys)
			snap, _ := e.Snapshot("api")
			assert.Positive(t, snap.KeyEvictions, "the keys were evicted while active")
		})
	}
}

// Attacker keys, each admitted up to its threshold and then evicted by the
// next, flood a table of 1024 in one window (20,000 of them): fresh keys
// among them, sending up to the threshold each, are admitted in full. (A
// count sketch shared by keys would have refused them all.)
func TestAttackerKeysEvictedAtTheirLimitShutNoFreshKeyOut(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	const threshold = 5
	load(t, e, Rule{Resource: "api", Threshold: threshold, PerKey: true, MaxKeys: 1024})
	attacked, full, fresh := 0, 0, 0
	for a := range 20_000 {
		key := "attacker-" + strconv.Itoa(a)
		for allowKey(e, key) {
			attacked++
		}
		if a%20 == 19 {
			fresh++
			n := 0
			for range threshold {
				if allowKey(e, "fresh-"+strconv.Itoa(fresh)) {
					n++
				}
			}
			if n == threshold {
				full++
			}
		}
	}
	assert.Equal(t, 20_000*threshold, attacked, "each attacker key admitted up to its threshold")
	assert.Equal(t, fresh, full, "fresh keys admitted in full (99% are promised)")
	t.Logf("%d of %d fresh keys admitted in full", full, fresh)
}

// A key evicted and coming back in the same window is held to what it had
// left, while at most 4 x MaxKeys keys were evicted in that window: the
// table remembers every one of them (99% are promised). Beyond that, it
// forgets the keys that gain least and counts them in KeysForgotten.
func TestAKeyEvictedAndBackInItsWindowGetsNoMore(t *testing.T) {
	for _, c := range []struct {
		name    string
		fillers int
		held    int // victims at least that must be refused again
	}{
		{"4xMaxKeys", 4*1024 - 100 + 1024, 99}, // 4096 evicted: every victim remembered
		{"20xMaxKeys", 20 * 1024, 0},           // beyond: documented, and counted
	} {
		t.Run(c.name, func(t *testing.T) {
			e, _ := newEngine(t, stattest.NewClock(time.Hour))
			const threshold, victims = 10, 100
			load(t, e, Rule{Resource: "api", Threshold: threshold, PerKey: true, MaxKeys: 1024})
			for v := range victims {
				for range threshold {
					require.True(t, allowKey(e, "victim-"+strconv.Itoa(v)))
				}
			}
			for f := range c.fillers {
				require.True(t, allowKey(e, "filler-"+strconv.Itoa(f)))
			}
			snap, _ := e.Snapshot("api")
			refused := 0
			for v := range victims {
				if !allowKey(e, "victim-"+strconv.Itoa(v)) {
					refused++
				}
			}
			t.Logf("%d evicted while active, %d forgotten; %d of %d victims refused again", snap.KeyEvictions, snap.KeysForgotten, refused, victims)
			assert.GreaterOrEqual(t, refused, c.held)
			if c.held > 0 {
				assert.LessOrEqual(t, snap.KeyEvictions, int64(4*1024))
				assert.Zero(t, snap.KeysForgotten)
			} else {
				assert.Positive(t, snap.KeysForgotten, "forgetting is counted")
				assert.Equal(t, victims, refused, "the fillers (1 each) are forgotten before the victims (10 each)")
			}
		})
	}
}

// TestACancelAfterItsKeyLeftGivesNothingToTheNextKey: a reservation
// cancelled after its key's state went to another key gives back nothing:
// for a Throttle rule the next key's timeline may end where the cancelled
// slot did, and giving that slot back would give the next key two slots
// at one instant; for a Reject rule its count left with its key.
func TestACancelAfterItsKeyLeftGivesNothingToTheNextKey(t *testing.T) {
	for _, r := range []Rule{
		{Resource: "paced", Threshold: 1, Behavior: Throttle, PerKey: true, MaxKeys: 4, MaxQueueing: 10 * time.Second},
		{Resource: "window", Threshold: 1, PerKey: true, MaxKeys: 4},
	} {
		t.Run(r.Resource, func(t *testing.T) {
			e, _ := newEngine(t, stattest.NewClock(time.Hour))
			load(t, e, r)
			tbl := e.rules.Load().byResource[r.Resource].keyed[0].t
			res, err := e.Reserve(r.Resource, WithKey("a"), WithWait(0))
			require.NoError(t, err)
			st := tbl.Peek("a")
			life := st.Life()
			var next string
			for i := 0; next == ""; i++ {
				require.Less(t, i, 1000, "a's state never reused")
				k := fmt.Sprint("f-", i)
				_, err := e.Reserve(r.Resource, WithKey(k), WithWait(0))
				require.NoError(t, err, k)
				if tbl.Peek(k) == st && !st.Alive(life) {
					next = k
				}
			}
			res.Cancel()
			again, err := e.Reserve(r.Resource, WithKey(next), WithWait(0))
			if r.Behavior == Throttle {
				require.NoError(t, err)
				assert.Equal(t, time.Second, again.Delay(), "%s's second slot a second after its first, at 1/s", next)
			} else {
				assert.Error(t, err, "%s admitted twice in a window at 1/s", next)
			}
		})
	}
}

// KeyStats shows a PerKey rule's busiest keys over the last minute, by
// admissions and by refusals (sampled: the attacker's counts are large
// enough that its rank is certain), the keys it tracks and its evictions; a
// reload that keeps the rule keeps what it sampled, and a minute later
// the keys are gone from it.
func TestKeyStatsShowTheBusiestKeys(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	r := Rule{ID: "per-user", Resource: "api", PerKey: true, Threshold: 500, MaxKeys: 64}
	load(t, e, r, Rule{ID: "plain", Resource: "other", Threshold: 5})
	for sec := range 10 {
		clock.Set(time.Hour + time.Duration(sec)*time.Second)
		admitted(e, "api", "attacker", 2500) // 500 admitted, 2000 refused a second
		for u := range 40 {
			admitted(e, "api", fmt.Sprint("user-", u), 1+u%3)
		}
	}
	stats := e.KeyStats()
	require.Len(t, stats, 1, "one PerKey rule")
	ks := stats[0]
	assert.Equal(t, "per-user", ks.Rule.ID)
	assert.Equal(t, 41, ks.Tracked)
	assert.Equal(t, 64, ks.Capacity)
	require.NotEmpty(t, ks.Refused)
	assert.Equal(t, "attacker", ks.Refused[0].Key)
	assert.InDelta(t, 20000, ks.Refused[0].Count, 20000*0.3, "an estimate from one request in 256")
	require.NotEmpty(t, ks.Passed)
	assert.Equal(t, "attacker", ks.Passed[0].Key, "5,000 admitted, far more than any user")
	assert.LessOrEqual(t, len(ks.Passed), 10)

	r.Threshold = 400
	load(t, e, r, Rule{ID: "plain", Resource: "other", Threshold: 5})
	assert.Equal(t, "attacker", e.KeyStats()[0].Refused[0].Key, "kept across a reload")
	clock.Advance(2 * time.Minute)
	ks = e.KeyStats()[0]
	assert.Empty(t, ks.Passed, "a minute later")
	assert.Empty(t, ks.Refused)
}

// A request is sampled once however many times its rules take it: a
// PerKey Throttle rule beside other paced rules takes a waiting request's
// slot again when the rules align it, and the estimate stays the count.
func TestKeyStatsSampleARequestOnce(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, err := New(WithClock(clock), WithSleep(func(context.Context, time.Duration) error { return nil }))
	require.NoError(t, err)
	load(t, e,
		Rule{Resource: "r", PerKey: true, Behavior: Throttle, Threshold: 1e6, MaxQueueing: time.Hour, MaxKeys: 64},
		Rule{Resource: "r", Behavior: Throttle, Threshold: 1e6, MaxQueueing: time.Hour},
		Rule{Resource: "r", Behavior: Throttle, Threshold: 5e5, MaxQueueing: time.Hour},
	)
	const n = 256 * 500
	admitted := 0
	for i := range n {
		if i%1000 == 0 {
			clock.Advance(time.Millisecond)
		}
		if en, err := e.Entry("r", WithKey("k"), WithWait(time.Hour)); err == nil {
			admitted++
			en.Exit(nil)
		}
	}
	require.Equal(t, n, admitted)
	ks := e.KeyStats()
	require.Len(t, ks, 1)
	require.Len(t, ks[0].Passed, 1)
	assert.InDelta(t, 1, float64(ks[0].Passed[0].Count)/n, 0.25, "an estimate of the admissions, not of twice as many")
}
