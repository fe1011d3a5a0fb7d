package global

import (
	"cmp"
	"context"
	"fmt"
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

// TestFarRedisWorksWithDefaults: with Redis 1, 20 and 50 ms away (a
// delaying proxy) and default Options on the README's client, requests are
// decided by Redis, never by the fallback, and after every connection is
// dropped the Source reconnects on its own. With the old defaults (50 ms
// for a call, dial included) every call at 20 ms and more failed.
func TestFarRedisWorksWithDefaults(t *testing.T) {
	srv := redistest.Start(t)
	for _, rtt := range []time.Duration{time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("rtt=%v", rtt), func(t *testing.T) {
			px := redistest.StartProxy(t, srv.Addr(), rtt)
			var served atomic.Int64
			src, err := New(px.Client(), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
			require.NoError(t, err)
			t.Cleanup(func() { _ = src.Close() })
			eng, err := flow.New(flow.WithTokenSource(src))
			require.NoError(t, err)
			require.NoError(t, eng.LoadRules([]flow.Rule{{ID: fmt.Sprintf("far-%v", rtt), Resource: "api", Threshold: 1e6, Global: true, Fallback: flow.FallbackClosed}}))
			var answered, admitted atomic.Int64
			l := startLoad(eng, 4, func(err error) {
				answered.Inc()
				if err == nil {
					admitted.Inc()
				}
			})
			const long = 15 * time.Second
			require.Eventually(t, func() bool { return served.Load() > 100 }, long, 5*time.Millisecond, "Redis decides")
			time.Sleep(500 * time.Millisecond)
			px.Drop()
			from := served.Load()
			require.Eventually(t, func() bool { return served.Load() > from+100 }, long, 5*time.Millisecond,
				"Redis decides again after every connection dropped")
			time.Sleep(300 * time.Millisecond)
			l.Stop()
			snap, _ := eng.Snapshot("api")
			st := src.Stats()
			t.Logf("rtt %v: %d of %d admitted, slowest Entry %v, fallbacks %d, %+v", rtt, admitted.Load(), answered.Load(), l.Slowest(), snap.Fallbacks, st)
			assert.Zero(t, snap.Fallbacks, "no fallback: Redis is healthy, only far")
			assert.Zero(t, st.Refused, "never backed off")
			assert.GreaterOrEqual(t, admitted.Load()*10, answered.Load()*9, "nearly every request admitted (refused only while a call was late: dialling)")
		})
	}
}

// TestSilentRedisIsDetected: a Redis that stops answering (every byte held
// for an hour) is detected after FailAfter calls time out, within
// FailAfter x CallTimeout of the first; the fallback then applies, and
// once it answers again the Source recovers on its own.
func TestSilentRedisIsDetected(t *testing.T) {
	srv := redistest.Start(t)
	px := redistest.StartProxy(t, srv.Addr(), 0)
	var served atomic.Int64
	src := newSource(t, px.Client(), WithTimeout(50*time.Millisecond), WithCallTimeout(200*time.Millisecond), WithFailAfter(2), WithMaxBatch(1), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "silent", Resource: "api", Threshold: 1e6, Global: true, Fallback: flow.FallbackOpen}}))
	fallbacks := func() int64 { snap, _ := eng.Snapshot("api"); return snap.Fallbacks }
	var answered atomic.Int64
	l := startLoad(eng, 4, func(error) { answered.Inc() })
	const long = 15 * time.Second
	require.Eventually(t, func() bool { return served.Load() > 0 }, long, 5*time.Millisecond, "Redis decides")

	px.SetRTT(2 * time.Hour)
	px.Drop() // new connections, and every byte on them held
	errsFrom := src.Stats().Errors
	require.Eventually(t, func() bool { return fallbacks() > 0 }, long, 5*time.Millisecond, "the fallback applies")
	st := src.Stats()
	assert.GreaterOrEqual(t, st.Errors-errsFrom, int64(2), "only after FailAfter calls failed")
	assert.Positive(t, st.Late, "until then, requests were refused as late")
	// Known down: requests fall back at once while probes run in the
	// background, none waits for one.
	require.Eventually(t, func() bool { return src.Stats().Errors >= st.Errors+2 }, long, 5*time.Millisecond, "probes fail")
	assert.Equal(t, st.Late, src.Stats().Late, "no request waited on a probe")

	px.SetRTT(0)
	px.Drop()
	from := served.Load()
	require.Eventually(t, func() bool { return served.Load() > from }, long, 5*time.Millisecond, "recovers on its own")
	l.Stop()
	t.Logf("answered %d, fallbacks %d, %+v", answered.Load(), fallbacks(), src.Stats())
}

// TestClusterNodeFailsAlone: in a Redis Cluster, one silent master fails
// the limits on its slots, which fall back, while the limits on the other
// masters go on being decided by Redis. With one health for the whole
// Source, the other masters' successes kept resetting the count of
// failures: the silent master's limits were refused as late, never fell
// back.
func TestClusterNodeFailsAlone(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client(t)
	ctx := t.Context()
	slots, err := c.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	owner := func(id string) string {
		slot, err := c.ClusterKeySlot(ctx, hashTag("id:"+id)).Result()
		require.NoError(t, err)
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) {
				return r.Nodes[0].Addr
			}
		}
		t.Fatalf("no node for slot %d", slot)
		return ""
	}
	silent := cl.Servers[0].Addr()
	var onSilent, onOther string
	for i := 0; onSilent == "" || onOther == ""; i++ {
		id := fmt.Sprintf("node-%d", i)
		if owner(id) == silent {
			onSilent = cmp.Or(onSilent, id)
		} else {
			onOther = cmp.Or(onOther, id)
		}
	}
	var served atomic.Int64
	src := newSource(t, c, WithTimeout(50*time.Millisecond), WithCallTimeout(200*time.Millisecond), WithMaxBatch(1), WithOnAdmit(func(time.Time, int64) { served.Inc() }))
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: onSilent, Resource: "silent", Threshold: 1e6, Global: true, Fallback: flow.FallbackOpen},
		{ID: onOther, Resource: "other", Threshold: 1e6, Global: true, Fallback: flow.FallbackOpen},
	}))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, res := range []string{"silent", "other"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if en, err := eng.Entry(res); err == nil {
					en.Exit(nil)
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	fallbacks := func(res string) int64 { snap, _ := eng.Snapshot(res); return snap.Fallbacks }
	require.Eventually(t, func() bool { return served.Load() > 50 }, 15*time.Second, 5*time.Millisecond, "Redis decides")

	stall := redis.NewClient(&redis.Options{Addr: silent})
	defer stall.Close()
	stalled := make(chan error, 1)
	go func() { stalled <- stall.Do(context.Background(), "DEBUG", "SLEEP", "1.2").Err() }()
	require.Eventually(t, func() bool { return fallbacks("silent") > 0 }, 10*time.Second, 5*time.Millisecond,
		"the silent master's limit falls back")
	from := served.Load()
	require.Eventually(t, func() bool { return served.Load() > from+50 }, 10*time.Second, 5*time.Millisecond,
		"the other master's limit is still decided by Redis")
	require.NoError(t, <-stalled)
	close(stop)
	wg.Wait()
	t.Logf("fallbacks: silent %d, other %d; %+v", fallbacks("silent"), fallbacks("other"), src.Stats())
	assert.Zero(t, fallbacks("other"), "the other limit never fell back")
}
