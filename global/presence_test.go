package global

import (
	"cmp"
	"context"
	"errors"
	"strconv"
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

// TestFallbackLocalIsKeptFromTheOthers: four instances share 400/s, each
// falling back to a quarter of it. Two are cut off from Redis (their
// proxies close) and admit their share on their own; the two still
// connected used to go on filling the whole window (about 600/s in all).
// Once their presence lapses it keeps their shares free, so that all four
// together admit about the threshold; and once they are back, Redis
// decides for them again and the four still admit about the threshold.
// It runs in real time, longer than 5 s, as an exception: presence lapses
// and is renewed on Redis's clock, over windows of a second.
func TestFallbackLocalIsKeptFromTheOthers(t *testing.T) {
	srv := redistest.Start(t)
	const threshold, instances = 400, 4
	var (
		counted [instances]*atomic.Int64
		engs    [instances]*flow.Engine
		proxies [instances]*redistest.Proxy
	)
	for i := range instances {
		counted[i] = atomic.NewInt64(0)
		proxies[i] = redistest.StartProxy(t, srv.Addr(), 0)
		src, err := New(proxies[i].Client(), WithPresenceTTL(300*time.Millisecond), WithCallTimeout(200*time.Millisecond), WithOnAdmit(func(time.Time, int64) { counted[i].Inc() }))
		require.NoError(t, err)
		t.Cleanup(func() { _ = src.Close() })
		eng, err := flow.New(flow.WithTokenSource(src))
		require.NoError(t, err)
		require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "shared", Resource: "api", Threshold: threshold, Global: true, LocalShare: 0.25}}))
		engs[i] = eng
	}
	var admitted [instances]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range instances {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if en, err := engs[i].Entry("api"); err == nil {
						admitted[i].Inc()
						en.Exit(nil)
					}
					time.Sleep(500 * time.Microsecond)
				}
			}()
		}
	}
	total := func() (n int64) {
		for i := range instances {
			n += admitted[i].Load()
		}
		return n
	}
	fallbacks := func(i int) int64 { snap, _ := engs[i].Snapshot("api"); return snap.Fallbacks }

	time.Sleep(1200 * time.Millisecond) // all connected: presence renewed
	for i := 2; i < instances; i++ {
		proxies[i].Cut()
	}
	require.Eventually(t, func() bool {
		return fallbacks(2) > 0 && fallbacks(3) > 0
	}, 10*time.Second, 10*time.Millisecond, "the cut-off instances fall back")
	time.Sleep(800 * time.Millisecond) // their presence lapses (300ms) and the window slides
	const span = 2 * time.Second
	from := total()
	time.Sleep(span)
	cut := total() - from

	for i := 2; i < instances; i++ {
		proxies[i].Restore()
	}
	back := counted[2].Load()
	require.Eventually(t, func() bool { return counted[2].Load() > back+10 }, 10*time.Second, 10*time.Millisecond,
		"Redis decides for the instances that were cut off")
	// For a window after they are back, their shares are still kept: what
	// they admitted on their own in the last window is not in Redis.
	time.Sleep(1200 * time.Millisecond)
	from = total()
	time.Sleep(span)
	restored := total() - from
	close(stop)
	wg.Wait()
	t.Logf("admitted in %v: %d with 2 of 4 cut off, %d once back", span, cut, restored)
	// The limit is 800 in 2 s; the cut-off instances' local windows and the
	// server's slide by buckets, so allow some more.
	assert.LessOrEqual(t, cut, int64(2*threshold*115/100), "together no more than the threshold while cut off")
	assert.GreaterOrEqual(t, cut, int64(2*threshold*70/100), "the fallbacks admit their shares")
	assert.LessOrEqual(t, restored, int64(2*threshold*115/100), "no more than the threshold once back")
	assert.GreaterOrEqual(t, restored, int64(2*threshold*70/100), "the threshold is used once back")
}

// failKeyHook fails every command that names a key containing tag while on
// is set, as a down Redis Cluster node fails only the limits on its slots.
type failKeyHook struct {
	tag string
	on  *atomic.Bool
}

func (h failKeyHook) fails(cmd redis.Cmder) bool {
	if !h.on.Load() {
		return false
	}
	for _, a := range cmd.Args() {
		if s, ok := a.(string); ok && strings.Contains(s, h.tag) {
			return true
		}
	}
	return false
}

func (failKeyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h failKeyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.fails(cmd) {
			cmd.SetErr(errors.New("CLUSTERDOWN node down"))
			return cmd.Err()
		}
		return next(ctx, cmd)
	}
}

func (h failKeyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var rest []redis.Cmder
		var failed error
		for _, c := range cmds {
			if h.fails(c) {
				failed = errors.New("CLUSTERDOWN node down")
				c.SetErr(failed)
			} else {
				rest = append(rest, c)
			}
		}
		return cmp.Or(next(ctx, rest), failed)
	}
}

// keptUntil is when the others stop keeping this instance's share of l
// (server clock, µs), and the server's now.
func keptUntil(t *testing.T, c redis.UniversalClient, src *Source, l *limit) (until, now int64) {
	t.Helper()
	v, err := c.HGet(t.Context(), l.hash(), src.field()).Result()
	require.NoError(t, err)
	parts := strings.Split(v, ",")
	require.Len(t, parts, 3, "presence %q", v)
	until, err = strconv.ParseInt(parts[2], 10, 64)
	require.NoError(t, err)
	tm, err := c.Time(t.Context()).Result()
	require.NoError(t, err)
	return until, tm.UnixMicro()
}

// TestFailingLimitKeepsOthersShares: one limit of a Source fails (its
// Cluster node is down) and falls back. The renewal must tell only that
// limit that this instance fell back: healthy limits told so kept this
// instance's share from the others for a window at every renewal, half
// their threshold with two instances. And the failing limit, skipped while
// it backs off, must still be told once it is back: a flag for the whole
// Source was cleared by the renewal that skipped it.
func TestFailingLimitKeepsOthersShares(t *testing.T) {
	srv := redistest.Start(t)
	down := atomic.NewBool(false)
	c := srv.Client()
	c.AddHook(failKeyHook{tag: hashTag("id:a"), on: down})
	src := newSource(t, c, WithPresenceTTL(time.Minute), WithTimeout(time.Second), WithCallTimeout(time.Second), WithBackoff(50*time.Millisecond), WithMaxBatch(1))
	bind := func(id string) (flow.BoundSource, *limit) {
		r := flow.GlobalRequest{Key: "id:" + id, Resource: id, Threshold: 100, Interval: time.Second, LocalShare: 0.5}
		b := src.Bind(r)
		ok, err := b.Acquire(t.Context(), 1)
		require.NoError(t, err)
		require.True(t, ok)
		return b, src.limitFor(r)
	}
	a, la := bind("a")
	_, lb := bind("b")
	src.renew()
	check := srv.Client()

	down.Store(true)
	require.Eventually(t, func() bool {
		_, err := a.Acquire(t.Context(), 1)
		return errors.Is(err, ErrUnavailable)
	}, 5*time.Second, time.Millisecond, "the failing limit backs off")
	src.renew()
	until, now := keptUntil(t, check, src, lb)
	assert.LessOrEqual(t, until, now, "the healthy limit is not told this instance fell back")
	assert.True(t, la.fellBack.Load(), "the failing limit keeps its flag while it is not renewed")

	down.Store(false)
	require.Eventually(t, func() bool {
		_, _ = a.Acquire(t.Context(), 1) // probes once the backoff ends
		return la.downUntil.Load() == 0
	}, 5*time.Second, time.Millisecond, "the probe ends the backoff")
	src.renew()
	until, now = keptUntil(t, check, src, la)
	assert.Greater(t, until, now, "the limit that fell back is told so once it is back")
	assert.False(t, la.fellBack.Load())
}
