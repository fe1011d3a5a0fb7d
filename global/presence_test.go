package global

import (
	"sync"
	"testing"
	"time"

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
		src, err := New(proxies[i].Client(), Options{
			PresenceTTL: 300 * time.Millisecond, CallTimeout: 200 * time.Millisecond,
			OnAdmit: func(time.Time, int64) { counted[i].Inc() },
		})
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
