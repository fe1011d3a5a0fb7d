package global

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
)

// TestSpanExactOnTheServer: goroutines of four instances take from one
// span-exact limit until well past several windows; every continuous span
// of the interval, on the server's clock (each grant's time as the script
// read it), holds at most the threshold. The same load on the plain limit
// of the same key counts in a hash of its own.
func TestSpanExactOnTheServer(t *testing.T) {
	srv := redistest.Start(t)
	const interval = 400 * time.Millisecond
	const threshold = 40 // per interval: 100/s
	var srcs []*Source
	for range 4 {
		srcs = append(srcs, newSource(t, srv.Client(), WithBuckets(4), WithExactBelow(1)))
	}
	r := req("span", threshold/interval.Seconds(), interval, 1)
	r.SpanExact = true
	var mu sync.Mutex
	var grants []int64 // server µs, one per admission
	stop := time.Now().Add(1500 * time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := srcs[i%4]
			for time.Now().Before(stop) {
				d, err := s.takeFor(r, 0)
				if err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					mu.Lock()
					grants = append(grants, d.ServerTime.UnixMicro())
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Greater(t, len(grants), 2*threshold, "several windows' worth")
	slices.Sort(grants)
	w := interval.Microseconds()
	most, lo := 0, 0
	for hi := range grants {
		for grants[hi]-grants[lo] >= w {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	assert.LessOrEqual(t, most, threshold, "the most granted in any continuous %v of server time", interval)
	// Span-exact and plain limits of one key are two hashes.
	span, plain := srcs[0].limitFor(r), srcs[0].limitFor(req("span", threshold/interval.Seconds(), interval, 1))
	assert.NotEqual(t, span.keys.window, plain.keys.window)
	assert.True(t, span.span)
	assert.False(t, plain.span)
}

// TestSpanExactThroughTheEngine: a Global span-exact rule admits through
// Redis with leasing on, three instances saturating it for 3.15 s: the
// server grants T in a bucket, then nothing until that bucket has left
// every span of a second, 1.1 s later (10 buckets and one), so at most
// 3T in all, where a plain window would admit 4T (at 0, 1, 2 and 3 s).
// Admission stamps read before the call are no measure of when the
// server counted a grant on a busy machine, so the span bound itself is
// checked on the server's clock (TestSpanExactOnTheServer).
func TestSpanExactThroughTheEngine(t *testing.T) {
	srv := redistest.Start(t)
	const threshold = 50.0 // per second
	var engs []*flow.Engine
	for range 3 {
		src := newSource(t, srv.Client())
		e, err := flow.New(flow.WithTokenSource(src))
		require.NoError(t, err)
		require.NoError(t, e.LoadRules([]flow.Rule{{Resource: "api", Threshold: threshold, Global: true, SpanExact: true}}))
		engs = append(engs, e)
	}
	var mu sync.Mutex
	var stamps []int64
	stop := time.Now().Add(3150 * time.Millisecond)
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := engs[i%3]
			for time.Now().Before(stop) {
				if en, err := e.Entry("api"); err == nil {
					mu.Lock()
					stamps = append(stamps, en.Start())
					mu.Unlock()
					en.Exit(nil)
				}
			}
		}()
	}
	wg.Wait()
	require.GreaterOrEqual(t, len(stamps), int(threshold), "a window's worth at least")
	assert.LessOrEqual(t, len(stamps), 3*int(threshold))
	for _, e := range engs {
		snap, _ := e.Snapshot("api")
		assert.Zero(t, snap.Fallbacks, "Redis decided every request")
	}
}
