package stats

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

const ms = int64(time.Millisecond)

// collect polls r at now and returns what it handed out, by resource and
// second start.
func collect(r *Registry, now int64, partial bool) map[string]map[int64]stat.Second {
	out := map[string]map[int64]stat.Second{}
	r.Seconds(now, partial, func(s stat.Second) {
		if out[s.Resource] == nil {
			out[s.Resource] = map[int64]stat.Second{}
		}
		if _, dup := out[s.Resource][s.Start]; dup {
			panic("a second handed out twice in one call")
		}
		out[s.Resource][s.Start] = s
	})
	return out
}

// registry returns a registry whose feed started (nothing handed out yet).
func registry(t *testing.T, clock stat.Clock) *Registry {
	t.Helper()
	r, err := NewRegistry(100, NodeConfig{}, clock)
	require.NoError(t, err)
	r.Seconds(clock.Now(), false, func(stat.Second) { panic("nothing to hand out yet") })
	return r
}

// TestSecondsStepByStep: on a fake clock, a second is handed out a window
// after it ends, once, with exact counts; an idle resource's last busy
// second goes out by time; empty seconds are skipped.
func TestSecondsStepByStep(t *testing.T) {
	clock := stattest.NewClock(0)
	r := registry(t, clock)
	n, err := r.Node("api")
	require.NoError(t, err)
	w := n.Second()
	w.Add(100*ms, metric.Pass, 3)
	w.Add(100*ms, metric.Block, 1)
	w.Complete(300*ms, 1, 10*ms, false)
	w.Complete(800*ms, 1, 30*ms, true)
	w.RecordConcurrency(800*ms, 2)
	w.Add(1300*ms, metric.Pass, 1)

	assert.Empty(t, collect(r, 1999*ms, false), "second 0 completes a window after it ends")
	got := collect(r, 2000*ms, false)
	assert.Equal(t, map[string]map[int64]stat.Second{"api": {0: {
		Resource: "api", Start: 0, Pass: 3, Block: 1, Success: 2, Exception: 1,
		RT: 40 * time.Millisecond, MinRT: 10 * time.Millisecond, MaxConcurrency: 2,
	}}}, got)
	assert.Empty(t, collect(r, 2500*ms, false), "once")
	got = collect(r, 10_000*ms, false)
	assert.Equal(t, stat.Second{Resource: "api", Start: 1000 * ms, Pass: 1}, got["api"][1000*ms],
		"an idle resource's last busy second goes out by time")
	assert.Len(t, got["api"], 1, "empty seconds are skipped")
	assert.Empty(t, collect(r, 20_000*ms, false))
}

// TestSecondsPartialOnClose: a final call hands out every second not
// handed out yet, the current one marked partial, and nothing after.
func TestSecondsPartialOnClose(t *testing.T) {
	r := registry(t, stattest.NewClock(0))
	n, _ := r.Node("api")
	n.Second().Add(500*ms, metric.Pass, 1)
	n.Second().Add(1500*ms, metric.Pass, 2)
	n.Second().Add(2100*ms, metric.Pass, 4)
	got := collect(r, 2200*ms, true)
	assert.Equal(t, map[int64]stat.Second{
		0:         {Resource: "api", Start: 0, Pass: 1},
		1000 * ms: {Resource: "api", Start: 1000 * ms, Pass: 2},
		2000 * ms: {Resource: "api", Start: 2000 * ms, Pass: 4, Partial: true},
	}, got["api"])
	n.Second().Add(2300*ms, metric.Pass, 1) // after the final call: not ours to hand out again
	assert.Empty(t, collect(r, 2400*ms, true))
}

// TestSecondsMatchAnOracle: random counts at random times, polled at
// random times, match a brute-force count per second exactly, each second
// once (the property the metric log and the dashboard rely on).
func TestSecondsMatchAnOracle(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 7))
		clock := stattest.NewClock(0)
		r := registry(t, clock)
		names := []string{"a", "b", "c"}
		want := map[string]map[int64]*stat.Second{}
		got := map[string]map[int64]stat.Second{}
		take := func(m map[string]map[int64]stat.Second) {
			for res, secs := range m {
				if got[res] == nil {
					got[res] = map[int64]stat.Second{}
				}
				for s, sec := range secs {
					_, dup := got[res][s]
					require.False(t, dup, "seed %d: %s second %d handed out twice", seed, res, s)
					got[res][s] = sec
				}
			}
		}
		now := int64(0)
		for range 400 {
			now += rng.Int64N(400 * ms) // idle gaps of up to 0.4 s, sometimes many in a row
			if rng.IntN(20) == 0 {
				now += rng.Int64N(5000 * ms)
			}
			clock.Set(time.Duration(now))
			res := names[rng.IntN(len(names))]
			n, err := r.Node(res)
			require.NoError(t, err)
			if want[res] == nil {
				want[res] = map[int64]*stat.Second{}
			}
			s := now - now%int64(time.Second)
			o := want[res][s]
			if o == nil {
				o = &stat.Second{Resource: res, Start: s}
				want[res][s] = o
			}
			k := 1 + rng.Int64N(3)
			switch rng.IntN(4) {
			case 0:
				n.Second().Add(now, metric.Pass, k)
				o.Pass += k
			case 1:
				n.Second().Add(now, metric.Block, k)
				o.Block += k
			case 2:
				rt := rng.Int64N(50 * ms)
				failed := rng.IntN(3) == 0
				n.Second().Complete(now, k, rt, failed)
				o.Success += k
				o.RT += time.Duration(rt)
				if failed {
					o.Exception += k
				}
				if m := time.Duration(rt / k); o.MinRT == 0 && o.Success == k || m < o.MinRT {
					o.MinRT = m
				}
			case 3:
				if rng.IntN(2) == 0 {
					take(collect(r, now, false))
				}
			}
		}
		take(collect(r, now, true))
		for res, secs := range want {
			for s, o := range secs {
				g, ok := got[res][s]
				if *o == (stat.Second{Resource: res, Start: s}) {
					assert.False(t, ok, "seed %d: %s second %d was empty", seed, res, s)
					continue
				}
				g.Partial = false
				assert.Equal(t, *o, g, "seed %d: %s second %d", seed, res, s)
			}
			assert.Len(t, got[res], countNonEmpty(secs), "seed %d: %s", seed, res)
		}
	}
}

func countNonEmpty(secs map[int64]*stat.Second) int {
	k := 0
	for s, o := range secs {
		if *o != (stat.Second{Resource: o.Resource, Start: s}) {
			k++
		}
	}
	return k
}

// TestSecondsLateCountsGoOutOnce: a write that clamps into an old bucket
// after its second went out, and a correction of a delivered second, go
// out with the next second: totals stay exact.
func TestSecondsLateCountsGoOutOnce(t *testing.T) {
	r := registry(t, stattest.NewClock(0))
	n, _ := r.Node("api")
	w := n.Second()
	w.Add(100*ms, metric.Pass, 5)
	first := collect(r, 3000*ms, false)
	require.Equal(t, int64(5), first["api"][0].Pass)
	// A writer that read the clock at 100 ms and writes only now: it
	// clamps into the newest bucket (made at 3 s by the delivery).
	w.Add(100*ms, metric.Block, 2)
	n.handOver(100*ms, window.Counts{Pass: -1, MinRT: -1}) // a pass of second 0 taken back
	later := collect(r, 6000*ms, false)
	var pass, block int64
	for _, s := range later["api"] {
		pass += s.Pass
		block += s.Block
		assert.GreaterOrEqual(t, s.Pass, int64(0), "no second goes below zero")
	}
	assert.Equal(t, int64(0), pass, "the correction waits for passes to take it from")
	assert.Equal(t, int64(2), block, "the late write goes out once, later")
	w.Add(6500*ms, metric.Pass, 3)
	last := collect(r, 9000*ms, true)
	require.Len(t, last["api"], 1)
	assert.Equal(t, int64(2), last["api"][6000*ms].Pass, "3 passes less the pass taken back: sums stay exact")
}

// TestSecondsUnderWriters: goroutines count while a poller hands seconds
// out and the clock runs: every count goes out exactly once (race detector
// hammer).
func TestSecondsUnderWriters(t *testing.T) {
	clock := stattest.NewClock(0)
	r := registry(t, clock)
	const writers, perWriter = 4, 20000
	stop := make(chan struct{})
	var ticker sync.WaitGroup
	ticker.Add(1)
	go func() { // the clock: 1 ms per tick
		defer ticker.Done()
		for {
			select {
			case <-stop:
				return
			default:
				clock.Advance(time.Millisecond)
				time.Sleep(50 * time.Microsecond)
			}
		}
	}()
	var mu sync.Mutex
	totals := map[string]int64{}
	seen := map[string]map[int64]bool{}
	dup := false
	poll := func(partial bool) {
		r.Seconds(clock.Now(), partial, func(s stat.Second) {
			mu.Lock()
			defer mu.Unlock()
			if seen[s.Resource] == nil {
				seen[s.Resource] = map[int64]bool{}
			}
			dup = dup || seen[s.Resource][s.Start]
			seen[s.Resource][s.Start] = true
			totals[s.Resource+"/pass"] += s.Pass
			totals[s.Resource+"/success"] += s.Success
		})
	}
	var poller sync.WaitGroup
	poller.Add(1)
	go func() {
		defer poller.Done()
		for {
			select {
			case <-stop:
				return
			default:
				poll(false)
				time.Sleep(200 * time.Microsecond)
			}
		}
	}()
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := r.Node([]string{"x", "y"}[i%2])
			if err != nil {
				return
			}
			for range perWriter {
				now := clock.Now()
				n.Second().Add(now, metric.Pass, 1)
				n.Second().Complete(clock.Now(), 1, 1, false)
			}
		}()
	}
	wg.Wait()
	close(stop)
	ticker.Wait()
	poller.Wait()
	poll(true)
	assert.False(t, dup, "a second handed out twice")
	for _, res := range []string{"x", "y"} {
		assert.Equal(t, int64(writers/2*perWriter), totals[res+"/pass"], res)
		assert.Equal(t, int64(writers/2*perWriter), totals[res+"/success"], res)
	}
}
