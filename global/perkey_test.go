package global

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
)

// perKeyEngines starts n instances sharing a PerKey global rule.
func perKeyEngines(t *testing.T, c func() redis.UniversalClient, n int, rule flow.Rule, opts Options) ([]*flow.Engine, []*Source) {
	t.Helper()
	engs := make([]*flow.Engine, n)
	srcs := make([]*Source, n)
	for i := range n {
		srcs[i] = newSource(t, c(), opts)
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
	engs, _ := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 2, rule, Options{})
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
	src := newSource(t, srv.Client(), Options{})
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
	src := newSource(t, c, Options{})
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
	src := newSource(t, px.Client(), Options{Timeout: 50 * time.Millisecond, CallTimeout: 100 * time.Millisecond})
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
	engs, srcs := perKeyEngines(t, func() redis.UniversalClient { return srv.Client() }, 2, rule, Options{MaxKeys: 16})
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
