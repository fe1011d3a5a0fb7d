package global

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
	"go.uber.org/goleak"
)

// perKeyEngines starts n instances sharing a PerKey global rule.
func perKeyEngines(t *testing.T, c func() redis.UniversalClient, n int, rule flow.Rule, opts ...Option) ([]*flow.Engine, []*Source) {
	t.Helper()
	engs := make([]*flow.Engine, n)
	srcs := make([]*Source, n)
	for i := range n {
		srcs[i] = newSource(t, c(), opts...)
		eng, err := flow.New(flow.WithTokenSource(srcs[i]))
		require.NoError(t, err)
		require.NoError(t, eng.LoadRules([]flow.Rule{rule}))
		engs[i] = eng
	}
	return engs, srcs
}

// TestPerKeyGlobal: two instances share each key's threshold; keys are
// limited apart; requests without a key share one limit; keys that look
// alike, hold braces, newlines or binary are each their own Redis hash.
func TestPerKeyGlobal(t *testing.T) {
	srv := redistest.Start(t)
	const threshold = 10 // per 10 s window
	rule := flow.Rule{ID: "users", Resource: "api", Threshold: threshold / 10.0, StatInterval: 10 * time.Second, Global: true, PerKey: true, Fallback: flow.FallbackClosed}
	engs, _ := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 2, rule)
	keys := []string{"alice", "bob", "{alice}", "alice\n", "\x00\xff", "id:users", "{id:users}"}
	for _, key := range keys {
		got := 0
		for i := range 3 * threshold {
			if en, err := engs[i%2].Entry("api", flow.WithKey(key)); err == nil {
				got++
				en.Exit(nil)
			}
		}
		assert.Equal(t, threshold, got, "key %q across both instances", key)
	}
	got := 0
	for i := range 3 * threshold {
		if en, err := engs[i%2].Entry("api"); err == nil {
			got++
			en.Exit(nil)
		}
	}
	assert.Equal(t, threshold, got, "requests without a key share one limit")

	// One Redis hash per (rule, key), apart from each other.
	var hashes []string
	iter := srv.Client().Scan(context.Background(), 0, "leapflow:*:w", 0).Iterator()
	for iter.Next(context.Background()) {
		hashes = append(hashes, iter.Val())
	}
	require.NoError(t, iter.Err())
	assert.Len(t, hashes, len(keys)+1, "%q", hashes)
	for _, h := range hashes {
		assert.Equal(t, 1, strings.Count(h, "{"), "one hash tag in %q", h)
		assert.Equal(t, 1, strings.Count(h, "}"), "one hash tag in %q", h)
	}
}

// TestPerKeyGlobalColdKeyCostsOneCall: a key seen now and then is decided
// by Redis on every request; a hot key leases.
func TestPerKeyGlobalColdKeyCostsOneCall(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "k", Resource: "api", Threshold: 1000, Global: true, PerKey: true}}))
	for i := range 3 {
		before := src.Stats().Calls
		en, err := eng.Entry("api", flow.WithKey(fmt.Sprint("cold-", i)))
		require.NoError(t, err)
		en.Exit(nil)
		assert.Equal(t, before+1, src.Stats().Calls, "one round trip for a cold key")
	}
	before := src.Stats().Calls
	for range 200 {
		en, err := eng.Entry("api", flow.WithKey("hot"))
		require.NoError(t, err)
		en.Exit(nil)
	}
	calls := src.Stats().Calls - before
	assert.Less(t, calls, int64(50), "a hot key leases: %d calls for 200 requests", calls)
}

// TestPerKeyGlobalSpreadsOverCluster: the keys of one rule land on
// different masters of a Redis Cluster.
func TestPerKeyGlobalSpreadsOverCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	src := newSource(t, c)
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "spread", Resource: "api", Threshold: 5, Global: true, PerKey: true}}))
	for i := range 30 {
		en, err := eng.Entry("api", flow.WithKey(fmt.Sprint("user-", i)))
		require.NoError(t, err)
		en.Exit(nil)
	}
	masters := 0
	for _, s := range cl.Servers {
		n, err := s.Client().Keys(context.Background(), "leapflow:*:w").Result()
		require.NoError(t, err)
		if len(n) > 0 {
			masters++
		}
	}
	assert.Equal(t, 3, masters, "30 keys over 3 masters")
}

// TestPerKeyGlobalFallsBackPerKey: with Redis gone, a FallbackLocal PerKey
// rule admits LocalShare of the threshold per key, locally.
func TestPerKeyGlobalFallsBackPerKey(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv.Addr(), 0)
	src := newSource(t, px.Client(), WithTimeout(50*time.Millisecond), WithCallTimeout(100*time.Millisecond))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "fb", Resource: "api", Threshold: 2, StatInterval: 10 * time.Second, Global: true, PerKey: true, LocalShare: 0.25}}))
	px.Cut()
	// Until the rule backs off, requests are refused as late or fall back.
	require.Eventually(t, func() bool {
		_, err := eng.Entry("api", flow.WithKey("warm-up"))
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
	for _, key := range []string{"a", "b"} {
		got := 0
		for range 20 {
			if en, err := eng.Entry("api", flow.WithKey(key)); err == nil {
				got++
				en.Exit(nil)
			}
		}
		assert.Equal(t, 5, got, "key %s: a quarter of 20, locally", key)
	}
	snap, _ := eng.Snapshot("api")
	assert.Positive(t, snap.Fallbacks)
}

// TestPerKeyGlobalBoundedCallers: callers' limits in the Source stay within
// MaxKeys, and many goroutines over many keys keep every key within its
// threshold across two instances.
func TestPerKeyGlobalBoundedCallers(t *testing.T) {
	srv := redistest.Start(t)
	const threshold = 5 // per 10 s window
	rule := flow.Rule{ID: "many", Resource: "api", Threshold: threshold / 10.0, StatInterval: 10 * time.Second, Global: true, PerKey: true, Fallback: flow.FallbackClosed}
	engs, srcs := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 2, rule, WithMaxKeys(16))
	var counts sync.Map
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				key := fmt.Sprint("k", (g*7+i)%40)
				if en, err := engs[i%2].Entry("api", flow.WithKey(key)); err == nil {
					v, _ := counts.LoadOrStore(key, atomic.NewInt64(0))
					v.(*atomic.Int64).Inc()
					en.Exit(nil)
				}
			}
		})
	}
	wg.Wait()
	counts.Range(func(k, v any) bool {
		assert.LessOrEqual(t, v.(*atomic.Int64).Load(), int64(threshold), "key %v", k)
		return true
	})
	for _, s := range srcs {
		// The cache may pass its bound for a moment while it evicts; its
		// maintenance brings it back.
		s.keyed.CleanUp()
		assert.LessOrEqual(t, s.keyed.EstimatedSize(), 16)
	}
}

// advOwnerOfCaller returns the address of the master that holds caller's
// hash of per-key rule id.
func advOwnerOfCaller(t *testing.T, c *redis.ClusterClient, ruleID, caller string) string {
	t.Helper()
	ctx := t.Context()
	slots, err := c.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	slot, err := c.ClusterKeySlot(ctx, hashTag(callerKey("id:"+ruleID, caller))).Result()
	require.NoError(t, err)
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			return r.Nodes[0].Addr
		}
	}
	t.Fatalf("no node for slot %d", slot)
	return ""
}

// advPickKeys returns nSilent keys whose hashes are on silent and nOther
// keys on other masters.
func advPickKeys(t *testing.T, c *redis.ClusterClient, ruleID, silent string, nSilent, nOther int) (onSilent, onOther []string) {
	for i := 0; len(onSilent) < nSilent || len(onOther) < nOther; i++ {
		k := fmt.Sprintf("user-%d", i)
		if advOwnerOfCaller(t, c, ruleID, k) == silent {
			if len(onSilent) < nSilent {
				onSilent = append(onSilent, k)
			}
		} else if len(onOther) < nOther {
			onOther = append(onOther, k)
		}
	}
	return onSilent, onOther
}

// advKeyLoad runs one goroutine per key, an Entry a millisecond, and calls
// each with the key and the Entry's error.
func advKeyLoad(eng *flow.Engine, keys []string, each func(key string, err error)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				en, err := eng.Entry("api", flow.WithKey(k))
				each(k, err)
				if err == nil {
					en.Exit(nil)
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// TestClusterNodeFailsAlone for a PerKey rule: one key's hash is on a
// master that stalls, another key's on a healthy master. The stalled key's
// limit falls back (as a non-per-key limit on that master does), although
// the healthy key's successes keep the rule's health good.
func TestKeyedGlobalClusterSilentNodeKeyFallsBack(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	const ruleID = "pk-silent"
	silent := cl.Servers[0].Addr()
	onSilent, onOther := advPickKeys(t, c, ruleID, silent, 1, 1)
	var served atomic.Int64
	src := newSource(t, c, WithTimeout(50*time.Millisecond), WithCallTimeout(200*time.Millisecond), WithMaxBatch(1), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: ruleID, Resource: "api", Threshold: 1e6, Global: true, PerKey: true, Fallback: flow.FallbackOpen},
	}))
	stop := advKeyLoad(eng, append(onSilent, onOther...), func(string, error) {})
	defer stop()
	fallbacks := func() int64 { snap, _ := eng.Snapshot("api"); return snap.Fallbacks }
	require.Eventually(t, func() bool { return served.Load() > 50 }, 15*time.Second, 5*time.Millisecond, "Redis decides")

	stall := redis.NewClient(&redis.Options{Addr: silent})
	defer stall.Close()
	stalled := make(chan error, 1)
	go func() { stalled <- stall.Do(context.Background(), "DEBUG", "SLEEP", "1.5").Err() }()
	fellBack := assert.Eventually(t, func() bool { return fallbacks() > 0 }, 1300*time.Millisecond, 5*time.Millisecond,
		"the stalled master's key falls back")
	<-stalled
	t.Logf("fell back: %v; fallbacks %d; %+v", fellBack, fallbacks(), src.Stats())
}

// Three keys on a stalled master, one on a healthy master, FallbackClosed
// and a threshold never reached: the healthy key is never refused, since
// its master answers; the stalled keys' failures do not back off the
// healthy key.
func TestKeyedGlobalClusterHealthyKeysNotRefused(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	const ruleID = "pk-healthy"
	silent := cl.Servers[0].Addr()
	onSilent, onOther := advPickKeys(t, c, ruleID, silent, 3, 1)
	var served atomic.Int64
	src := newSource(t, c, WithTimeout(50*time.Millisecond), WithCallTimeout(200*time.Millisecond), WithMaxBatch(1), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: ruleID, Resource: "api", Threshold: 1e6, Global: true, PerKey: true, Fallback: flow.FallbackClosed},
	}))
	var stalling atomic.Bool
	var healthyRefused, healthyTried atomic.Int64
	stop := advKeyLoad(eng, append(onSilent, onOther...), func(k string, err error) {
		if k == onOther[0] && stalling.Load() {
			healthyTried.Inc()
			if err != nil {
				healthyRefused.Inc()
			}
		}
	})
	require.Eventually(t, func() bool { return served.Load() > 50 }, 15*time.Second, 5*time.Millisecond, "Redis decides")
	stall := redis.NewClient(&redis.Options{Addr: silent})
	defer stall.Close()
	stalled := make(chan error, 1)
	stalling.Store(true)
	go func() { stalled <- stall.Do(context.Background(), "DEBUG", "SLEEP", "1.2").Err() }()
	<-stalled
	stalling.Store(false)
	stop()
	t.Logf("healthy key during the stall: %d refused of %d; %+v", healthyRefused.Load(), healthyTried.Load(), src.Stats())
	assert.Zero(t, healthyRefused.Load(), "a key on a healthy master is refused while another master stalls")
}

// A Global PerKey rule's Keys (specific thresholds, as for local PerKey
// rules) apply: an abuser at 0 is refused, a premium key gets its own
// threshold.
func TestKeyedGlobalKeysApply(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "keys", Resource: "api", Threshold: 1, StatInterval: 10 * time.Second,
		Global: true, PerKey: true, Fallback: flow.FallbackClosed,
		Keys: []flow.KeyLimit{{Key: "abuser", Threshold: 0}, {Key: "premium", Threshold: 3}}}}))
	count := func(key string) int {
		got := 0
		for range 60 {
			if en, err := eng.Entry("api", flow.WithKey(key)); err == nil {
				got++
				en.Exit(nil)
			}
		}
		return got
	}
	assert.Equal(t, 10, count("user"), "the rule's threshold")
	assert.Equal(t, 0, count("abuser"), "Keys: abuser at 0")
	assert.Equal(t, 30, count("premium"), "Keys: premium at 3/s")
}

// The same under FallbackLocal with Redis gone: the local per-key fallback
// applies Keys too.
func TestKeyedGlobalKeysApplyInFallback(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv.Addr(), 0)
	src := newSource(t, px.Client(), WithTimeout(50*time.Millisecond), WithCallTimeout(100*time.Millisecond))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "keysfb", Resource: "api", Threshold: 1, StatInterval: 10 * time.Second,
		Global: true, PerKey: true, LocalShare: 1,
		Keys: []flow.KeyLimit{{Key: "abuser", Threshold: 0}}}}))
	px.Cut()
	require.Eventually(t, func() bool {
		_, err := eng.Entry("api", flow.WithKey("warm-up"))
		return err == nil
	}, 5*time.Second, 5*time.Millisecond)
	got := 0
	for range 20 {
		if en, err := eng.Entry("api", flow.WithKey("abuser")); err == nil {
			got++
			en.Exit(nil)
		}
	}
	assert.Equal(t, 0, got, "Keys: abuser at 0, in the fallback too")
}

// A rule ID may hold any byte (only its length is checked). A non-per-key
// rule whose ID is another PerKey rule's ID, "\x00key:" and a caller's key
// has a Redis hash of its own, apart from that caller's; so does a PerKey
// rule's key from another PerKey rule's.
func TestKeyedGlobalRuleIDsAndKeysNeverCollide(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: "x", Resource: "perkey", Threshold: 1, StatInterval: 10 * time.Second, Global: true, PerKey: true, Fallback: flow.FallbackClosed},
		{ID: "x\x00key:alice", Resource: "plain", Threshold: 1, StatInterval: 10 * time.Second, Global: true, Fallback: flow.FallbackClosed},
		{ID: "x\x00nokey", Resource: "plain2", Threshold: 1, StatInterval: 10 * time.Second, Global: true, Fallback: flow.FallbackClosed},
	}))
	spend := func(res string, opts ...flow.EntryOption) int {
		got := 0
		for range 20 {
			if en, err := eng.Entry(res, opts...); err == nil {
				got++
				en.Exit(nil)
			}
		}
		return got
	}
	assert.Equal(t, 10, spend("perkey", flow.WithKey("alice")))
	assert.Equal(t, 10, spend("plain"), "rule %q has its own limit", "x\\x00key:alice")
	assert.Equal(t, 10, spend("perkey"))
	assert.Equal(t, 10, spend("plain2"), "rule %q has its own limit", "x\\x00nokey")
}

// TestKeyedGlobalHotLeaseAllocatesNothing: TestLeaseTakeAllocatesNothing for
// a hot key of a PerKey rule, through the KeyedSource and the TokenSource.
func TestKeyedGlobalHotLeaseAllocatesNothing(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
	r := req("pkallocs", 1e9, time.Second, 1)
	r.PerKey = true
	b := src.Bind(r).(flow.KeyedSource)
	ctx := t.Context()
	caller := string([]byte("hot-caller")) // not a constant
	l := src.keyLimit(src.limitFor(r), &r, caller)
	ls := &lease{deadline: src.opts.Clock.Now() + int64(time.Minute), installed: src.opts.Clock.Now()}
	ls.size.Store(1e6)
	ls.left.Store(1e6)
	l.leases[0].Store(ls)
	calls := src.Stats().Calls
	allocs := testing.AllocsPerRun(200, func() {
		if ok, err := b.AcquireKey(ctx, caller, r.Threshold, 1); !ok || err != nil {
			panic("refused")
		}
	})
	assert.Zero(t, allocs, "KeyedSource")
	r.Caller = caller
	allocs = testing.AllocsPerRun(200, func() {
		if ok, err := src.Acquire(ctx, r); !ok || err != nil {
			panic("refused")
		}
	})
	assert.Zero(t, allocs, "TokenSource")
	assert.Equal(t, calls, src.Stats().Calls, "all from the lease")
}

// TestKeyedGlobalFloodBounded: 200,000 distinct callers through one rule's
// limit keep at most MaxKeys callers' limits and a bounded heap.
func TestKeyedGlobalFloodBounded(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client(), WithMaxKeys(1000))
	r := req("flood", 10, time.Second, 1)
	r.PerKey = true
	parent := src.limitFor(r)
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	before := ms.HeapAlloc
	buf := make([]byte, 0, 64)
	for i := range 200_000 {
		buf = fmt.Appendf(buf[:0], "flood-key-%d", i)
		src.keyLimit(parent, &r, string(buf))
	}
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("size %d, heap grew %d KiB", src.keyed.EstimatedSize(), (int64(ms.HeapAlloc)-int64(before))/1024)
	assert.LessOrEqual(t, src.keyed.EstimatedSize(), 1000)
	assert.Less(t, int64(ms.HeapAlloc)-int64(before), int64(8<<20), "heap bounded")
}

// TestKeyedGlobalThresholdUnderEvictionAndReloads: three instances hammer one
// hot key (it leases) while their Sources' caller caches (MaxKeys 2) are
// flooded with other callers, evicting the hot key's limit with leases out,
// and the rule is reloaded between two thresholds. No server window of
// the key admits more than the larger threshold.
func TestKeyedGlobalThresholdUnderEvictionAndReloads(t *testing.T) {
	srv := redistest.Start(t)
	audit := NewAudit()
	const hi, lo = 300, 200
	rule := func(th float64) flow.Rule {
		return flow.Rule{ID: "hotkey", Resource: "api", Threshold: th, Global: true, PerKey: true, Fallback: flow.FallbackClosed}
	}
	engs, srcs := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 3, rule(hi),
		WithMaxKeys(2), WithOnAdmit(audit.Record))
	done := make(chan struct{})
	var wg sync.WaitGroup
	var admitted, tried atomic.Int64
	for i, eng := range engs {
		for range 3 {
			wg.Go(func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					tried.Inc()
					if en, err := eng.Entry("api", flow.WithKey("hot")); err == nil {
						admitted.Inc()
						en.Exit(nil)
					}
				}
			})
		}
		src := srcs[i]
		wg.Go(func() {
			r := flow.GlobalRequest{Key: "id:hotkey", Resource: "api", Threshold: hi, Interval: time.Second, PerKey: true}
			parent := src.limitFor(r)
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				src.keyLimit(parent, &r, fmt.Sprint("flood-", n))
				if n%64 == 0 {
					time.Sleep(100 * time.Microsecond)
				}
			}
		})
	}
	for i := range 30 {
		th := float64(hi)
		if i%2 == 1 {
			th = lo
		}
		for _, eng := range engs {
			if err := eng.LoadRules([]flow.Rule{rule(th)}); err != nil {
				t.Error(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	close(done)
	wg.Wait()
	var st Stats
	for _, s := range srcs {
		x := s.Stats()
		st.Calls += x.Calls
		st.Leased += x.Leased
		st.Late += x.Late
		st.Returned += x.Returned
	}
	t.Logf("admitted %d of %d; fullest window %d; %+v", admitted.Load(), tried.Load(), audit.Fullest(time.Second), st)
	assert.LessOrEqual(t, audit.Fullest(time.Second), int64(hi))
	assert.Positive(t, st.Leased, "the hot key leased")
}

// TestKeyedGlobalManyKeysExact: three instances, 24 keys, Source MaxKeys 4,
// one 100 s window (every admission in one window): no key is admitted
// more than its threshold, in bucket mode (hot keys lease) and exact mode.
func TestKeyedGlobalManyKeysExact(t *testing.T) {
	for _, exact := range []bool{false, true} {
		t.Run(fmt.Sprint("exact=", exact), func(t *testing.T) {
			srv := redistest.Start(t)
			const threshold = 50
			opts := []Option{WithMaxKeys(4)}
			if exact {
				opts = append(opts, WithExactBelow(threshold))
			}
			rule := flow.Rule{ID: "many", Resource: "api", Threshold: threshold / 100.0, StatInterval: 100 * time.Second, Global: true, PerKey: true, Fallback: flow.FallbackClosed}
			engs, srcs := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 3, rule, opts...)
			var counts sync.Map
			var wg sync.WaitGroup
			for g := range 9 {
				wg.Go(func() {
					for i := range 400 {
						key := fmt.Sprint("k", (g*5+i*(g+1))%24)
						if en, err := engs[g%3].Entry("api", flow.WithKey(key)); err == nil {
							v, _ := counts.LoadOrStore(key, atomic.NewInt64(0))
							v.(*atomic.Int64).Inc()
							en.Exit(nil)
						}
					}
				})
			}
			wg.Wait()
			total := int64(0)
			counts.Range(func(k, v any) bool {
				total += v.(*atomic.Int64).Load()
				assert.LessOrEqual(t, v.(*atomic.Int64).Load(), int64(threshold), "key %v", k)
				return true
			})
			var leased, late int64
			for _, s := range srcs {
				leased += s.Stats().Leased
				late += s.Stats().Late
			}
			t.Logf("total %d, leased %d, late %d", total, leased, late)
		})
	}
}

// TestKeyedGlobalColdKeysOutageAndBack: many cold keys (each used twice) at a
// moderate rate through a Redis 10 ms away: about one call per decision and
// none late; then Redis is cut: the rule falls back per key (FallbackLocal)
// and, once backing off, the Source makes few calls however many keys come;
// then Redis returns and decides again.
// It runs in real time, longer than 5 s, as an exception: the outage, the
// backoff and the recovery are timed by a real Redis behind a proxy.
func TestKeyedGlobalColdKeysOutageAndBack(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv.Addr(), 10*time.Millisecond)
	var served atomic.Int64
	// Timeouts far above the proxy's 10 ms, so that a round trip the
	// scheduler delays on a loaded machine is not a late request (refused,
	// as documented): the cut below is detected by connection errors.
	src := newSource(t, px.Client(), WithTimeout(time.Second), WithCallTimeout(2*time.Second), WithMaxBackoff(400*time.Millisecond), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "cold", Resource: "api", Threshold: 100, Global: true, PerKey: true, LocalShare: 0.5}}))
	var seq atomic.Int64
	var admitted, refused, decisions atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				key := fmt.Sprint("cold-", seq.Inc()/2)
				decisions.Inc()
				if en, err := eng.Entry("api", flow.WithKey(key)); err == nil {
					admitted.Inc()
					en.Exit(nil)
				} else {
					refused.Inc()
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	defer func() { close(done); wg.Wait() }()
	time.Sleep(1500 * time.Millisecond)
	st0, d0, r0 := src.Stats(), decisions.Load(), refused.Load()
	t.Logf("healthy: %d decisions, %d refused, %+v", d0, r0, st0)
	assert.Zero(t, st0.Late, "no request late with Redis 10 ms away")
	assert.Zero(t, r0, "nothing refused: every key under its threshold")
	assert.InDelta(t, 1.0, float64(st0.Calls)/float64(d0), 0.2, "about one call per decision")

	px.Cut()
	time.Sleep(time.Second) // detection and backoff
	st1, d1, r1 := src.Stats(), decisions.Load(), refused.Load()
	time.Sleep(2 * time.Second)
	st2, d2, r2 := src.Stats(), decisions.Load(), refused.Load()
	t.Logf("cut: first second %+v; next 2 s: %d decisions, %d refused, %d calls, %+v", st1, d2-d1, r2-r1, st2.Calls-st1.Calls, st2)
	assert.Less(t, st2.Calls-st1.Calls, int64(20), "backing off: a few probes in 2 s, not a call per key")
	assert.Zero(t, r2-r1, "falls back per key: nothing refused")

	px.Restore()
	from := served.Load()
	assert.Eventually(t, func() bool { return served.Load() > from+100 }, 5*time.Second, 10*time.Millisecond, "Redis decides again")
	st3 := src.Stats()
	time.Sleep(time.Second)
	st4, d4 := src.Stats(), decisions.Load()
	t.Logf("back: %+v; after a second more: %+v (%d decisions in all)", st3, st4, d4)
	assert.Equal(t, st3.Refused, st4.Refused, "no longer backing off")
}

// TestKeyedGlobalCloseLeavesNothing: calls of many keys in flight through a
// far Redis when the Source closes; requests after Close are refused and
// start nothing; no goroutine outlives the test.
func TestKeyedGlobalCloseLeavesNothing(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv.Addr(), 300*time.Millisecond)
	src, err := New(px.Client(), WithTimeout(50*time.Millisecond), WithCallTimeout(2*time.Second), WithMaxKeys(8))
	require.NoError(t, err)
	r := req("closing", 100, time.Second, 1)
	r.PerKey = true
	b := src.Bind(r).(flow.KeyedSource)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() { _, _ = b.AcquireKey(context.Background(), fmt.Sprint("c", i), r.Threshold, 1) })
	}
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, src.Close())
	wg.Wait()
	for i := range 40 {
		ok, err := b.AcquireKey(context.Background(), fmt.Sprint("after", i), r.Threshold, 1)
		assert.False(t, ok)
		assert.NoError(t, err)
	}
	assert.Positive(t, src.Stats().Refused)
}

// TestKeyedGlobalEntryOnLeaseAllocatesNothing: Entry and Exit of a hot key
// of a Global PerKey rule, admitted from its lease, allocate nothing.
func TestKeyedGlobalEntryOnLeaseAllocatesNothing(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "pkentry", Resource: "api", Threshold: 1e6, Global: true, PerKey: true}}))
	r := flow.GlobalRequest{Key: "id:pkentry", Resource: "api", Threshold: 1e6, Interval: time.Second, PerKey: true}
	caller := string([]byte("hot-caller"))
	l := src.keyLimit(src.limitFor(r), &r, caller)
	ls := &lease{deadline: src.opts.Clock.Now() + int64(time.Minute), installed: src.opts.Clock.Now()}
	ls.size.Store(1e6)
	ls.left.Store(1e6)
	l.leases[0].Store(ls)
	opt := flow.WithKey(caller)
	calls := src.Stats().Calls
	allocs := testing.AllocsPerRun(200, func() {
		en, err := eng.Entry("api", opt)
		if err != nil {
			panic(err)
		}
		en.Exit(nil)
	})
	assert.Zero(t, allocs)
	assert.Equal(t, calls, src.Stats().Calls, "all from the lease")
}

// TestKeyedGlobalOddCallersApart: callers that look like markers, escapes
// or the rule's key are each their own limit, apart from requests without
// a key and from the non-per-key rule of the same ID.
func TestKeyedGlobalOddCallersApart(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: "odd", Resource: "api", Threshold: 0.2, StatInterval: 10 * time.Second, Global: true, PerKey: true, Fallback: flow.FallbackClosed},
		{ID: "odd", Resource: "plain", Threshold: 0.2, StatInterval: 10 * time.Second, Global: true, Fallback: flow.FallbackClosed},
	}))
	keys := []string{"nokey", "key:nokey", "\x00nokey", "\x00key:a", "a", "key:a", "%7B", "{", "%", "%25", "}", "id:odd", "\x00", "\n", "odd"}
	spend := func(res string, opts ...flow.EntryOption) int {
		got := 0
		for range 5 {
			if en, err := eng.Entry(res, opts...); err == nil {
				got++
				en.Exit(nil)
			}
		}
		return got
	}
	for _, k := range keys {
		assert.Equal(t, 2, spend("api", flow.WithKey(k)), "key %q", k)
	}
	assert.Equal(t, 2, spend("api"), "no key")
	assert.Equal(t, 2, spend("plain"), "the non-per-key rule of the same ID")
}

// A reload that keeps a global PerKey rule (a new Threshold, MaxKeys or
// Keys) keeps every key's count in Redis and its lease here: a key that
// used 6 of 10 in a window gets 2 more of a new 8 in it (without leases,
// whose unspent tokens stay counted in Redis when they expire, so that
// the count is exact), and a hot key's limit in this instance is the same
// one, its lease too.
func TestPerKeyGlobalReloadKeepsEveryKeysCountAndLease(t *testing.T) {
	for _, leasing := range []bool{false, true} {
		t.Run(fmt.Sprint("leasing=", leasing), func(t *testing.T) {
			srv := redistest.Start(t)
			rule := flow.Rule{ID: "users", Resource: "api", Threshold: 1, StatInterval: 10 * time.Second, Global: true, PerKey: true, Fallback: flow.FallbackClosed}
			var opts []Option
			if !leasing {
				opts = append(opts, WithMaxBatch(1))
			}
			engs, srcs := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 1, rule, opts...)
			eng, src := engs[0], srcs[0]
			admit := func(key string, tries int) int {
				n := 0
				for range tries {
					if en, err := eng.Entry("api", flow.WithKey(key)); err == nil {
						n++
						en.Exit(nil)
					}
				}
				return n
			}
			limitOf := func(key string) *limit {
				parent := src.limitFor(flow.GlobalRequest{Key: "id:users", Resource: "api", Threshold: rule.Threshold, Interval: rule.StatInterval, PerKey: true})
				l, ok := src.keyed.GetIfPresent(keyLimitID{parent: parent, caller: key})
				require.True(t, ok, "key %s has a limit here", key)
				return l
			}
			for k := range 20 {
				require.Equal(t, 6, admit(fmt.Sprint("k", k), 6))
			}
			before := limitOf("k0")
			lease := before.leases[0].Load()
			for _, change := range []func(r *flow.Rule){
				func(r *flow.Rule) { r.MaxKeys = 64 },
				func(r *flow.Rule) { r.Keys = []flow.KeyLimit{{Key: "other", Threshold: 5}} },
				func(r *flow.Rule) { r.Threshold = 0.8 }, // 8 per window (a larger one applies a window later: see scriptThreshold)
			} {
				change(&rule)
				require.NoError(t, eng.LoadRules([]flow.Rule{rule}))
			}
			after := limitOf("k0")
			assert.Same(t, before, after, "the key's limit here is kept")
			if leasing {
				assert.NotNil(t, lease, "k0 leased (hot)")
				assert.Same(t, lease, after.leases[0].Load(), "with its lease")
				return
			}
			for k := range 20 {
				assert.Equal(t, 2, admit(fmt.Sprint("k", k), 20), "key k%d: 2 of the new 8 left", k)
			}
		})
	}
}

// One request each from 20,000 distinct keys in one window, through a
// PerKey rule of MaxKeys 1024 and a Source bounded to 1024 callers: none
// is refused (each key is its own Redis hash; no key starts from another's
// count).
func TestPerKeyGlobalFloodOfDistinctKeysRefusesNone(t *testing.T) {
	srv := redistest.Start(t)
	rule := flow.Rule{ID: "users", Resource: "api", Threshold: 1, StatInterval: 10 * time.Second, Global: true, PerKey: true,
		MaxKeys: 1024, Fallback: flow.FallbackClosed}
	engs, _ := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 1, rule, WithMaxKeys(1024))
	refused := 0
	for k := range 20_000 {
		en, err := engs[0].Entry("api", flow.WithKey(fmt.Sprint("k", k)))
		if err != nil {
			refused++
			continue
		}
		en.Exit(nil)
	}
	assert.Zero(t, refused, "of 20,000 distinct keys")
}

// TestPerKeyGlobalResetKey: Engine.ResetKey empties one caller's shared
// limit in Redis: another instance admits the key afresh; other keys keep
// their counts.
func TestPerKeyGlobalResetKey(t *testing.T) {
	srv := redistest.Start(t)
	rule := flow.Rule{ID: "reset", Resource: "api", Threshold: 1, StatInterval: 10 * time.Second, Global: true, PerKey: true,
		Fallback: flow.FallbackClosed}
	engs, _ := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 2, rule)
	use := func(eng *flow.Engine, key string, n int) int {
		got := 0
		for range n {
			if en, err := eng.Entry("api", flow.WithKey(key)); err == nil {
				got++
				en.Exit(nil)
			}
		}
		return got
	}
	require.Equal(t, 10, use(engs[0], "alice", 15))
	require.Equal(t, 10, use(engs[0], "bob", 15))
	require.NoError(t, engs[0].ResetKey(context.Background(), "api", "alice"))
	assert.Equal(t, 10, use(engs[1], "alice", 15), "alice afresh, from the other instance")
	assert.Equal(t, 0, use(engs[0], "alice", 5), "the reset limit is shared: 10 in all")
	assert.Equal(t, 0, use(engs[1], "bob", 1), "bob keeps his counts")
}
