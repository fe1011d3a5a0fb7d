package flow

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/callerkey"
	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/stat/stattest"
)

// Moving a key into (or out of) the rule's Keys moves it between its table
// state and a spec state: the counts move with it, so a key that used its
// whole window gets no new threshold in the same window.
func TestKeyedKeysListChangeKeepsCounts(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	r := Rule{ID: "u", Resource: "api", Threshold: 4, PerKey: true}
	load(t, e, r)
	got := admitted(e, "api", "abuser", 10)
	require.Equal(t, 4, got)
	// The operator lowers the abuser's threshold to 2.
	r.Keys = []KeyLimit{{Key: "abuser", Threshold: 2}}
	load(t, e, r)
	got += admitted(e, "api", "abuser", 10)
	assert.LessOrEqual(t, got, 4, "admitted in one window, with thresholds 4 then 2")
	// And back out of Keys.
	r.Keys = nil
	load(t, e, r)
	got += admitted(e, "api", "abuser", 10)
	assert.LessOrEqual(t, got, 4, "admitted in one window after leaving Keys")
}

// TestKeyedClockBackAbsorbed: a step back of an hour is absorbed by the
// engine's steady time; per-key windows go on like the resource's.
func TestKeyedClockBackAbsorbed(t *testing.T) {
	clock := stattest.NewClock(2 * time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 4, PerKey: true}, Rule{Resource: "plain", Threshold: 4})
	require.Equal(t, 4, admitted(e, "api", "k", 10))
	require.Equal(t, 4, admitted(e, "plain", "", 10))
	clock.Set(time.Hour)
	assert.Equal(t, 0, admitted(e, "api", "k", 10), "same window: the step is absorbed")
	clock.Advance(time.Second)
	plain := admitted(e, "plain", "", 10)
	keyed := admitted(e, "api", "k", 10)
	assert.Equal(t, 4, plain)
	assert.Equal(t, plain, keyed)
	clock.Set(5 * time.Hour) // and forward
	assert.Equal(t, 4, admitted(e, "api", "k", 10))
}

// TestKeyedThrottleQueuedKeyEvicted: a key with requests queued (timeline
// ahead of now) evicted by a flood keeps its timeline in its ghost.
func TestKeyedThrottleQueuedKeyEvicted(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, s := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 1, Behavior: Throttle, MaxQueueing: 5 * time.Second, PerKey: true, MaxKeys: 4})
	for range 3 {
		require.True(t, try(e, "api", WithKey("hot")))
	}
	for i := range 200 {
		try(e, "api", WithKey(fmt.Sprint("f", i)))
	}
	s.waits = nil
	require.True(t, try(e, "api", WithKey("hot")))
	assert.Equal(t, []time.Duration{3 * time.Second}, s.waits, "queued behind its three")
}

// TestKeyedTwoIntervalsUndo: two PerKey QPS rules with different intervals;
// the second blocks after the first admitted: the first's count is given
// back.
func TestKeyedTwoIntervalsUndo(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "api", Threshold: 10, PerKey: true},
		Rule{Resource: "api", Threshold: 1, StatInterval: 4 * time.Second, PerKey: true})
	assert.Equal(t, 4, admitted(e, "api", "k", 20), "4 per 4s")
	clock.Advance(4 * time.Second)
	assert.Equal(t, 4, admitted(e, "api", "k", 20), "the refusals of the 4s rule gave the 1s rule's counts back")
}

// TestKeyedSpecificZeroAndHuge: Keys with thresholds 0 and the largest
// allowed, on every kind.
func TestKeyedSpecificZeroAndHuge(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	load(t, e,
		Rule{Resource: "q", Threshold: 2, PerKey: true, Keys: []KeyLimit{{Key: "z", Threshold: 0}, {Key: "h", Threshold: maxKeyWindowCount}}},
		Rule{Resource: "c", Metric: Concurrency, Threshold: 2, PerKey: true, Keys: []KeyLimit{{Key: "z", Threshold: 0}, {Key: "h", Threshold: maxThreshold}}},
		Rule{Resource: "p", Threshold: 2, Behavior: Throttle, PerKey: true, Keys: []KeyLimit{{Key: "z", Threshold: 0}, {Key: "h", Threshold: maxThreshold}}},
	)
	for _, res := range []string{"q", "c", "p"} {
		assert.Zero(t, admitted(e, res, "z", 5), res)
		if res == "p" {
			continue // a 1ns cost on a still clock with no queueing admits one: as the resource pacer
		}
		assert.Equal(t, 5, admitted(e, res, "h", 5), res)
		en, err := e.Entry(res, WithKey("h"), WithCount(maxCount))
		assert.NoError(t, err, res)
		en.Exit(nil)
	}
}

// TestKeyedManyKeysMemory: 100,000 distinct keys through MaxKeys 1000
// leave the heap bounded.
func TestKeyedManyKeysMemory(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 5, PerKey: true, MaxKeys: 1000},
		Rule{Resource: "c", Metric: Concurrency, Threshold: 5, PerKey: true, MaxKeys: 1000},
		Rule{Resource: "p", Threshold: 5, Behavior: Throttle, PerKey: true, MaxKeys: 1000})
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	key := make([]byte, 0, 16)
	for i := range 100_000 {
		clock.Advance(time.Microsecond)
		key = fmt.Appendf(key[:0], "user-%d", i)
		for _, r := range []string{"api", "c", "p"} {
			en, _ := e.Entry(r, WithKey(string(key)))
			en.Exit(nil)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&ms1)
	grew := int64(ms1.HeapAlloc) - int64(ms0.HeapAlloc)
	t.Logf("heap grew %d KiB", grew>>10)
	assert.Less(t, grew, int64(8<<20), "heap growth after 100,000 keys")
	tbl := e.rules.Load().byResource["c"].keyConc.t
	assert.Empty(t, tbl.Pinned())
}

func TestKeyedPathsAllocateNothing(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	load(t, e,
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 1e9, PerKey: true},
		Rule{Resource: "spec", Threshold: 1e6, PerKey: true, Keys: []KeyLimit{{Key: "vip", Threshold: 1e6}}},
		Rule{Resource: "two", Threshold: 1e6, PerKey: true},
		Rule{Resource: "two", Threshold: 1e6, StatInterval: 2 * time.Second, PerKey: true},
	)
	for name, fn := range map[string]func(){
		"conc":     func() { try(e, "conc", WithKey("user-0000000001")) },
		"spec":     func() { try(e, "spec", WithKey("vip")) },
		"two":      func() { try(e, "two", WithKey("user-0000000001")) },
		"priority": func() { try(e, "spec", WithKey("user-1"), WithWait(500*time.Millisecond)) },
	} {
		fn()
		assert.Zero(t, testing.AllocsPerRun(1000, fn), name)
	}
}

// TestKeyedReloadThresholdBatchesHammer: reloads that change Threshold (10 or
// 20) and a stepping clock while goroutines send batches over more keys
// than the table holds: no key over 20 in any window (by Start).
func TestKeyedReloadThresholdBatchesHammer(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	r := Rule{ID: "u", Resource: "api", Threshold: 10, PerKey: true, MaxKeys: 16}
	load(t, e, r)
	stop := make(chan struct{})
	var all lockedStarts
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			mine := map[string][]int64{}
			i := g * 31
			for {
				select {
				case <-stop:
					all.add(mine)
					return
				default:
				}
				i++
				k := fmt.Sprint("k", i%64)
				n := 1 + i%5
				en, err := e.Entry("api", WithKey(k), WithCount(n))
				if err == nil {
					for range n {
						mine[k] = append(mine[k], en.Start())
					}
					en.Exit(nil)
				}
			}
		})
	}
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			clock.Advance(7 * ms)
			time.Sleep(50 * time.Microsecond)
		}
	})
	deadline := time.Now().Add(1500 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		r.Threshold = []float64{10, 20}[n%2]
		require.NoError(t, e.LoadRules([]Rule{r}))
	}
	close(stop)
	wg.Wait()
	total := 0
	for k, v := range all.m {
		total += len(v)
		most, at := worstWindow(v, int64(250*ms))
		assert.LessOrEqual(t, most, 20, "key %s in buckets %d..%d", k, at, at+3)
	}
	t.Logf("%d admitted", total)
}

// TestKeyedConcInFlightOracle: per-key Concurrency 2 through a table of 4
// with 64 keys and 16 goroutines, mixed with a resource Reject rule and a
// per-key QPS rule; in flight per key is counted by the test between
// admission and Exit (never above the real count): never above 2. Exits
// are done on copies too.
func TestKeyedConcInFlightOracle(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	load(t, e,
		Rule{Resource: "api", Metric: Concurrency, Threshold: 2, PerKey: true, MaxKeys: 4},
		Rule{Resource: "api", Threshold: 1e7, PerKey: true, MaxKeys: 8},
		Rule{Resource: "api", Threshold: 1e8})
	const keys = 64
	var inflight [keys]atomic.Int64
	var worst atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(2 * time.Second)
	for g := range 16 {
		wg.Go(func() {
			i := g * 13
			for time.Now().Before(deadline) {
				i++
				k := i % keys
				en, err := e.Entry("api", WithKey(fmt.Sprint("k", k)))
				if err != nil {
					continue
				}
				if v := inflight[k].Add(1); v > worst.Load() {
					worst.Store(v)
				}
				runtime.Gosched()
				inflight[k].Add(-1)
				cp := en
				cp.Exit(nil)
				en.Exit(nil)
			}
		})
	}
	wg.Wait()
	assert.LessOrEqual(t, worst.Load(), int64(2))
	snap, _ := e.Snapshot("api")
	assert.Zero(t, snap.Inflight)
	tbl := e.rules.Load().byResource["api"].keyConc.t
	tbl.Each(func(st *keytable.State) { assert.Zero(t, st.InFlight()) })
}

// A throttled key slower than one a second, evicted by a flood (within
// what the rule remembers), keeps its timeline for as long as its slot
// is ahead: seen again 2 s later at 0.2 a second, it is refused until 5 s.
func TestASlowThrottledKeyEvictedKeepsItsSlot(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 0.2, Behavior: Throttle, MaxQueueing: 1, PerKey: true, MaxKeys: 1024})
	require.True(t, allowKey(e, "slow"))
	for f := range 3000 {
		allowKey(e, fmt.Sprint("flood-", f))
	}
	snap, _ := e.Snapshot("api")
	require.Positive(t, snap.KeyEvictions)
	clock.Advance(2 * time.Second)
	assert.False(t, allowKey(e, "slow"), "its next slot is at 5 s")
	clock.Advance(3 * time.Second)
	assert.True(t, allowKey(e, "slow"))
}

// A key evicted while active and then listed in Keys keeps what it had:
// its state comes back from what the rule remembers of it.
func TestAKeyListedAfterItsEvictionKeepsItsCount(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour))
	r := Rule{ID: "u", Resource: "api", Threshold: 3, PerKey: true, MaxKeys: 8}
	load(t, e, r)
	require.Equal(t, 3, admitted(e, "api", "k", 3))
	for f := range 20 {
		allowKey(e, fmt.Sprint("flood-", f))
	}
	r.Keys = []KeyLimit{{Key: "k", Threshold: 4}}
	load(t, e, r)
	assert.Equal(t, 1, admitted(e, "api", "k", 5), "3 of its own 4 used")
}

// A key listed anew in a Throttle rule with its own rate has its queue
// stretched from the rule's old rate to its own.
func TestAKeyListedAnewHasItsQueueStretchedToItsOwnRate(t *testing.T) {
	e, s := newEngine(t, stattest.NewClock(time.Hour))
	r := Rule{ID: "u", Resource: "api", Threshold: 10, Behavior: Throttle, MaxQueueing: 10 * time.Second, PerKey: true}
	load(t, e, r)
	for range 5 { // slots at 0, 100, ..., 400 ms
		en, err := e.Entry("api", WithKey("k"))
		require.NoError(t, err)
		en.Exit(nil)
	}
	r.Keys = []KeyLimit{{Key: "k", Threshold: 1}}
	load(t, e, r)
	en, err := e.Entry("api", WithKey("k"))
	require.NoError(t, err)
	en.Exit(nil)
	// 400 ms ahead at 10/s is 4 s at 1/s; the next slot 1 s after.
	assert.Equal(t, 5*time.Second, s.waits[len(s.waits)-1], "waits %v", s.waits)
}

// TestLongListedKeysMatchTheirRequests: a listed key longer than 256 bytes
// is matched by requests with that key, which stand for its start and a
// hash; a longer key sharing its start is not the listed one.
func TestLongListedKeysMatchTheirRequests(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	long := strings.Repeat("k", 300)
	load(t, e, Rule{Resource: "api", Threshold: 100, PerKey: true, Keys: []KeyLimit{{Key: long, Threshold: 1}}})
	assert.True(t, try(e, "api", WithKey(long)))
	assert.False(t, try(e, "api", WithKey(long)), "its own threshold of 1")
	assert.True(t, try(e, "api", WithKey(long+"x")), "another key: the rule's threshold")
	assert.True(t, try(e, "api", WithKey(long+"x")))
}

// TestLongListedKeyAndItsBoundFormAreOneKey: a key over 256 bytes and the
// form it is loaded as are the same listed key, refused as listed twice.
func TestLongListedKeyAndItsBoundFormAreOneKey(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(0))
	long := strings.Repeat("k", 300)
	_, err := e.CheckRules([]Rule{{Resource: "api", Threshold: 100, PerKey: true,
		Keys: []KeyLimit{{Key: long, Threshold: 1}, {Key: callerkey.Bound(long), Threshold: 50}}}})
	assert.ErrorContains(t, err, "is listed twice")
	rules, err := e.CheckRules([]Rule{{Resource: "api", Threshold: 100, PerKey: true, Keys: []KeyLimit{{Key: long, Threshold: 1}}}})
	require.NoError(t, err)
	_, err = e.CheckRules(rules)
	assert.NoError(t, err, "rules as loaded load again")
}
