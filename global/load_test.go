package global

import (
	"context"
	"fmt"
	"runtime"
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

// spin runs g goroutines in a tight loop of Entry and Exit on resource
// "api" for d, and returns how many were admitted. sample, if set, runs
// every 50 ms meanwhile.
func spin(eng *flow.Engine, g int, d time.Duration, sample func()) int64 {
	var admitted atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if en, err := eng.Entry("api"); err == nil {
					admitted.Inc()
					en.Exit(nil)
				}
			}
		}()
	}
	for sample != nil && time.Now().Before(end) {
		time.Sleep(50 * time.Millisecond)
		sample()
	}
	wg.Wait()
	return admitted.Load()
}

// waitingOnMutex counts the goroutines inside the Source that wait on a
// mutex: parked in Lock, not merely runnable in it (a goroutine the
// scheduler preempted on an uncontended Lock of a busy machine waits for a
// core, not for the lock).
func waitingOnMutex() (n int, stack string) {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		header, _, _ := strings.Cut(g, "\n")
		parked := !strings.Contains(header, "[runnable") && !strings.Contains(header, "[running")
		if parked && strings.Contains(g, "global.(*Source)") && strings.Contains(g, "sync.(*Mutex).Lock") {
			n, stack = n+1, g
		}
	}
	return n, stack
}

// TestNoConvoy hammers one global rule near its limit from 64 goroutines,
// leasing on and off: no request waits on a lock inside the Source, and
// the limit never has more than one call to Redis in flight from the
// instance. A per-limit mutex used to hold 39 of 64 goroutines, each
// making its own call in turn.
func TestNoConvoy(t *testing.T) {
	srv := redistest.Start(t)
	for _, batch := range []int64{1, 100_000} {
		t.Run(fmt.Sprintf("maxbatch=%d", batch), func(t *testing.T) {
			src := newSource(t, srv.Client(), WithMaxBatch(batch))
			eng, err := flow.New(flow.WithTokenSource(src))
			require.NoError(t, err)
			require.NoError(t, eng.LoadRules([]flow.Rule{{ID: fmt.Sprintf("convoy-%d", batch), Resource: "api", Threshold: 2000, Global: true, Fallback: flow.FallbackClosed}}))
			blocked, samples := 0, 0
			var stack string
			admitted := spin(eng, 64, 1500*time.Millisecond, func() {
				n, s := waitingOnMutex()
				blocked, samples = blocked+n, samples+1
				if n > 0 {
					stack = s
				}
			})
			st := src.Stats()
			t.Logf("admitted %d, %d stack samples, most calls in flight %d, %+v", admitted, samples, src.mostInFlight.Load(), st)
			assert.Positive(t, samples)
			assert.Zero(t, blocked, "a request waited on a mutex:\n%s", stack)
			assert.Equal(t, int64(1), src.mostInFlight.Load(), "at most one call per limit in flight")
			assert.Positive(t, admitted)
		})
	}
}

// TestSaturatedCPUKeepsRedis: with Redis healthy, 64 and then 256
// goroutines spin on a global rule on a saturated CPU. The goroutine that
// reads a reply may not run for long after it arrives; that used to time
// the call out, back off Redis and put the rule on its fallback (millions
// admitted against 1000/s under FallbackOpen). No request may fall back,
// and no server window may hold more than the threshold.
// It runs in real time, longer than 5 s, as an exception: the point is a
// real scheduler starving real Redis replies.
func TestSaturatedCPUKeepsRedis(t *testing.T) {
	srv := redistest.Start(t)
	for _, g := range []int{64, 256} {
		t.Run(fmt.Sprintf("goroutines=%d", g), func(t *testing.T) {
			audit := NewAudit()
			src, err := New(srv.Client(), WithOnAdmit(audit.Record)) // default timeouts
			require.NoError(t, err)
			t.Cleanup(func() { _ = src.Close() })
			eng, err := flow.New(flow.WithTokenSource(src))
			require.NoError(t, err)
			require.NoError(t, eng.LoadRules([]flow.Rule{{ID: fmt.Sprintf("busy-%d", g), Resource: "api", Threshold: 1000, Global: true, Fallback: flow.FallbackOpen}}))
			admitted := spin(eng, g, 3*time.Second, nil)
			snap, _ := eng.Snapshot("api")
			st := src.Stats()
			t.Logf("%d goroutines: admitted %d, counted %d, fullest window %d, fallbacks %d, %+v", g, admitted, audit.Total(), audit.Fullest(time.Second), snap.Fallbacks, st)
			assert.Zero(t, snap.Fallbacks, "no fallback with Redis healthy")
			assert.Zero(t, st.Errors, "no call failed")
			assert.Equal(t, admitted, audit.Total(), "every admission counted by Redis")
			assert.LessOrEqual(t, audit.Fullest(time.Second), int64(1000), "no server window over the threshold")
		})
	}
}

// TestLeaseTakeAllocatesNothing: a request admitted from a lease, the hot
// path of a global rule, allocates nothing.
func TestLeaseTakeAllocatesNothing(t *testing.T) {
	srv := redistest.Start(t)
	src := newSource(t, srv.Client())
	r := req("allocs", 1e9, time.Second, 1)
	b := src.Bind(r)
	ctx := t.Context()
	// A lease of 1000 tokens on every P, spendable for a minute.
	l := src.limitFor(r)
	for i := range l.leases {
		ls := &lease{deadline: src.opts.Clock.Now() + int64(time.Minute), installed: src.opts.Clock.Now()}
		ls.size.Store(1000)
		ls.left.Store(1000)
		l.leases[i].Store(ls)
	}
	calls := src.Stats().Calls
	allocs := testing.AllocsPerRun(50, func() {
		if ok, err := b.Acquire(ctx, 1); !ok || err != nil {
			panic("refused")
		}
	})
	assert.Zero(t, allocs)
	assert.Equal(t, calls, src.Stats().Calls, "all from the lease")
}

// lateHook delays every command, as a saturated CPU delays the goroutine
// that sends it or reads its reply.
type lateHook struct{ delay time.Duration }

func (lateHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h lateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		time.Sleep(h.delay)
		return next(ctx, cmd)
	}
}
func (h lateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestLateRepliesKeepRedis: every call answers 150 ms late, three times the
// time a request waits, as when the CPU is saturated. A late call used to
// count as a failure: the Source backed off and the rule fell back (with
// FallbackOpen, admitting without limit). Now the call completes in the
// background and its lease serves the requests after it: no fallback, no
// window over the threshold.
func TestLateRepliesKeepRedis(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	client.AddHook(lateHook{150 * time.Millisecond})
	audit := NewAudit()
	src, err := New(client, WithTimeout(50*time.Millisecond), WithOnAdmit(audit.Record))
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "late", Resource: "api", Threshold: 1000, Global: true, Fallback: flow.FallbackOpen}}))
	admitted := spin(eng, 8, 2*time.Second, nil)
	snap, _ := eng.Snapshot("api")
	st := src.Stats()
	t.Logf("admitted %d, counted %d, fullest window %d, fallbacks %d, %+v", admitted, audit.Total(), audit.Fullest(time.Second), snap.Fallbacks, st)
	assert.Zero(t, snap.Fallbacks, "no fallback: Redis answered every call")
	assert.Equal(t, admitted, audit.Total(), "every admission counted by Redis")
	assert.LessOrEqual(t, audit.Fullest(time.Second), int64(1000))
	assert.Positive(t, admitted)
}
