package flow

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"
)

// TestFeedStepByStep: on a fake clock, the engine's feed delivers each
// resource's completed seconds once, with wall-clock times one second
// apart, the most in flight under a Concurrency rule, and on Close the
// current second marked partial.
func TestFeedStepByStep(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 100}, Rule{Resource: "conc", Metric: Concurrency, Threshold: 5})
	f := e.Feed()
	require.Same(t, f, e.Feed(), "one feed per engine")
	var got []stat.Second
	cancel := f.Subscribe(func(b []stat.Second) { got = append(got, b...) })
	f.Poll() // starts the feed: seconds from 11 s on are whole
	clock.Set(11*time.Second + 100*time.Millisecond)
	for range 3 {
		require.True(t, try(e, "api"))
	}
	held := make([]Entry, 3)
	for i := range held {
		en, err := e.Entry("conc")
		require.NoError(t, err)
		held[i] = en
	}
	clock.Set(12*time.Second + 500*time.Millisecond)
	for _, en := range held {
		en.Exit(nil)
	}
	require.True(t, try(e, "api"))
	clock.Set(13 * time.Second)
	f.Poll()
	byRes := map[string][]stat.Second{}
	for _, s := range got {
		byRes[s.Resource] = append(byRes[s.Resource], s)
	}
	require.Len(t, byRes["api"], 1)
	require.Len(t, byRes["conc"], 1)
	assert.Equal(t, int64(3), byRes["api"][0].Pass)
	assert.Equal(t, int64(3), byRes["api"][0].Success)
	assert.Equal(t, int64(3), byRes["conc"][0].MaxConcurrency)
	assert.Equal(t, int64(11*time.Second), byRes["api"][0].Start)
	first := byRes["api"][0].Time
	assert.Equal(t, first, first.Truncate(time.Second), "whole wall seconds")

	got = nil
	clock.Set(13*time.Second + 200*time.Millisecond)
	require.True(t, try(e, "api"))
	f.Close()
	require.Len(t, got, 3, "the exits of conc at 12.5 s, api's second 12, and the partial 13")
	var partial, twelve stat.Second
	for _, s := range got {
		switch {
		case s.Partial:
			partial = s
		case s.Resource == "api":
			twelve = s
		}
	}
	assert.Equal(t, int64(1), twelve.Pass)
	assert.Equal(t, first.Add(time.Second), twelve.Time, "the next engine second is the next wall second")
	assert.Equal(t, int64(13*time.Second), partial.Start)
	assert.Equal(t, int64(1), partial.Pass)
	got = nil
	f.Poll()
	f.Close()
	assert.Empty(t, got, "nothing after Close")
	cancel()
}

// TestFeedStartAndClose: Start polls at every tick (a second) on its own
// goroutine; a second Start changes nothing; Close stops it (goleak checks
// the package) and delivers what is left.
func TestFeedStartAndClose(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, err := New(WithClock(clock))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Threshold: 1000})
	f := e.Feed()
	ticks := make(chan time.Time)
	f.tick = func() (<-chan time.Time, func()) { return ticks, func() {} }
	var mu sync.Mutex
	var pass, polls int64
	f.Subscribe(func(b []stat.Second) {
		mu.Lock()
		defer mu.Unlock()
		polls++
		for _, s := range b {
			pass += s.Pass
		}
	})
	f.Start()
	f.Start()
	clock.Advance(time.Second)
	ticks <- time.Time{} // the first poll starts the feed
	for range 30 {
		require.True(t, try(e, "api"))
	}
	clock.Advance(2 * time.Second)
	ticks <- time.Time{} // second 11 is whole: delivered
	ticks <- time.Time{} // the goroutine took the tick before: the poll above has run
	for range 20 {
		require.True(t, try(e, "api"))
	}
	mu.Lock()
	assert.Equal(t, int64(30), pass, "delivered by a tick")
	assert.GreaterOrEqual(t, polls, int64(2), "a poll a tick")
	mu.Unlock()
	f.Close()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, int64(50), pass, "Close delivers the rest")
}

// A queued request cancelled before its second is delivered: its rate rules
// count it at the instant it would go (second 12, where its throttle slot
// is) and the cancel gives that back before delivery. No second is
// delivered twice, none is negative, and the cancelled request is in none.
func TestFeedDeliversEachSecondOnce(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	sleeping := make(chan struct{}, 1)
	e, err := New(WithClock(clock), WithSleep(func(ctx context.Context, d time.Duration) error {
		sleeping <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}))
	require.NoError(t, err)
	load(t, e, Rule{ID: "qps", Resource: "api", Threshold: 100},
		Rule{ID: "pace", Resource: "api", Behavior: Throttle, Threshold: 1, MaxQueueing: 10 * time.Second})
	f := e.Feed()
	type key struct {
		res   string
		start int64
	}
	seen := map[key]int{}
	var all []stat.Second
	f.Subscribe(func(b []stat.Second) {
		for _, s := range b {
			seen[key{s.Resource, s.Start}]++
			all = append(all, s)
		}
	})
	clock.Set(11*time.Second + 100*time.Millisecond)
	require.True(t, try(e, "api"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := e.Entry("api", WithContext(ctx))
		done <- err
	}()
	<-sleeping
	clock.Set(13 * time.Second)
	f.Poll() // second 11 of api: 2 passes
	cancel()
	require.Error(t, <-done)
	clock.Set(13*time.Second + 500*time.Millisecond)
	f.Poll() // the correction
	f.Close()
	var pass int64
	for _, s := range all {
		t.Logf("%+v", s)
		pass += s.Pass
		assert.GreaterOrEqual(t, s.Pass, int64(0), "a second with negative passes")
	}
	assert.Equal(t, int64(1), pass, "the cancelled request is in no second")
	for k, n := range seen {
		assert.Equal(t, 1, n, "second %v delivered %d times", k, n)
	}
}

// A priority request borrows from the next bucket and is admitted when that
// bucket starts. While it is in flight and the resource is otherwise idle,
// the feed still delivers its pass (and Occupied) by time, and Inflight
// reads the one request in flight.
func TestFeedDeliversABorrowedPassByTime(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, err := New(WithClock(clock), WithSleep(func(ctx context.Context, d time.Duration) error {
		clock.Advance(d)
		return ctx.Err()
	}))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Threshold: 1})
	f := e.Feed()
	var got []stat.Second
	f.Subscribe(func(b []stat.Second) { got = append(got, b...) })
	clock.Set(11 * time.Second)
	require.True(t, try(e, "api"))
	clock.Set(11*time.Second + 900*time.Millisecond)          // full until 12 s
	en, err := e.Entry("api", WithWait(500*time.Millisecond)) // borrows 12.0, waits 100 ms
	require.NoError(t, err)
	require.Equal(t, int64(12*time.Second), en.Start())
	for s := 13; s <= 20; s++ {
		clock.Set(time.Duration(s) * time.Second)
		f.Poll()
	}
	snap, ok := e.Snapshot("api")
	require.True(t, ok)
	assert.Equal(t, int64(1), snap.Inflight, "one request is in flight")
	var pass, occ int64
	for _, s := range got {
		t.Logf("%+v", s)
		pass += s.Pass
		occ += s.Occupied
	}
	assert.Equal(t, int64(2), pass, "second 12's borrowed pass, delivered by time")
	assert.Equal(t, int64(1), occ)
	en.Exit(nil)
}

// Close after Start may be called twice (metriclog.Writer.Close closes the
// engine's feed, and promflow's doc asks the user to close it too): the
// second Close does nothing.
func TestFeedClosesTwiceAfterStart(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	f := e.Feed()
	f.Start()
	f.Close()
	assert.NotPanics(t, f.Close)
}

// A subscriber may unsubscribe from inside its callback (after the delivery
// it waited for): the feed does not hold, while a callback runs, the lock
// that cancel takes.
func TestFeedSubscriberMayCancelInsideItsCallback(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, _ := newEngine(t, clock)
	f := e.Feed()
	var cancel func()
	cancel = f.Subscribe(func([]stat.Second) { cancel() })
	done := make(chan struct{})
	go func() {
		f.Poll()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Poll deadlocked on a subscriber that cancels itself")
	}
}

// A clock that steps back a little across a second boundary (under
// WithClock's 100 ms tolerance, so writes clamp into the newest bucket, in
// the next second): Close delivers the seconds up to the newest bucket's,
// so nothing written is lost.
func TestFeedCloseDeliversTheNewestBucketAfterAStepBack(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, _ := newEngine(t, clock)
	f := e.Feed()
	var pass, success int64
	f.Subscribe(func(b []stat.Second) {
		for _, s := range b {
			pass += s.Pass
			success += s.Success
		}
	})
	clock.Set(13 * time.Second)
	require.True(t, try(e, "api")) // the newest bucket starts at 13 s
	clock.Set(13*time.Second - 20*time.Millisecond)
	require.True(t, try(e, "api")) // clamped into it
	f.Close()
	assert.Equal(t, int64(2), pass, "nothing is lost on Close")
	assert.Equal(t, int64(2), success)
}

// hookClock is a manual clock that runs hook once, inside the read
// it is armed for, and returns the reading taken before the hook: a
// request that read the clock and was descheduled while others ran.
type hookClock struct {
	t     atomic.Int64
	armed atomic.Bool
	hook  func()
}

func (c *hookClock) Now() int64 {
	v := c.t.Load()
	if c.armed.CompareAndSwap(true, false) {
		c.hook()
	}
	return v
}

// A request reads the clock just before a second boundary; meanwhile the
// registry lets its idle resource go (a new resource needed the room), so
// flow counts its pass again on the node Replace makes, at the request's
// time, in the second before that node was made. The feed still delivers
// that pass, once.
func TestFeedDeliversARecountedPass(t *testing.T) {
	clock := &hookClock{}
	clock.t.Store(int64(10 * time.Second))
	e, err := New(WithClock(clock), WithMaxResources(1))
	require.NoError(t, err)
	f := e.Feed()
	var pass, success int64
	f.Subscribe(func(b []stat.Second) {
		for _, s := range b {
			if s.Resource == "victim" {
				pass += s.Pass
				success += s.Success
			}
		}
	})
	clock.t.Store(int64(11 * time.Second))
	require.True(t, try(e, "victim"))
	for s := 12; s <= 75; s++ {
		clock.t.Store(int64(time.Duration(s) * time.Second))
		f.Poll()
	}
	clock.t.Store(int64(75*time.Second + 900*time.Millisecond))
	clock.hook = func() {
		clock.t.Store(int64(76*time.Second + 100*time.Millisecond))
		require.True(t, try(e, "other"), "the registry lets victim go")
	}
	clock.armed.Store(true)
	before := e.registry.Lookup("victim")
	en, err := e.Entry("victim") // reads 75.9 s
	require.NoError(t, err)
	require.NotSame(t, before, e.registry.Lookup("victim"), "recounted on a new node")
	en.Exit(nil)
	for s := 77; s <= 80; s++ {
		clock.t.Store(int64(time.Duration(s) * time.Second))
		f.Poll()
	}
	f.Close()
	assert.Equal(t, int64(2), success)
	assert.Equal(t, int64(2), pass, "every pass is delivered once")
}

// TestFeedLosesNothingFromItsFirstSecond: a feed made in the middle of a
// second, on resources made before it (a rule's) and after it, delivers
// every request counted from that second to Close: the second it was made
// in goes out whole, counts from before the feed included.
func TestFeedLosesNothingFromItsFirstSecond(t *testing.T) {
	clock := stattest.NewClock(10*time.Second + 100*time.Millisecond)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 1000})
	require.True(t, try(e, "api"), "before the feed, in its second")
	clock.Set(10*time.Second + 400*time.Millisecond)
	f := e.Feed()
	totals := map[string]int64{}
	f.Subscribe(func(b []stat.Second) {
		for _, s := range b {
			totals[s.Resource] += s.Pass + s.Block
		}
	})
	want := map[string]int64{"api": 1}
	for i, at := range []time.Duration{450, 900, 1300, 2100, 2950, 4000} {
		clock.Set(10*time.Second + at*time.Millisecond)
		for _, res := range []string{"api", "later"} {
			for range i + 1 {
				try(e, res)
				want[res]++
			}
		}
		if i%2 == 1 {
			f.Poll()
		}
	}
	f.Close()
	assert.Equal(t, want, totals)
}

// A subscriber made late (SubscribeRecent) starts with the last minute the
// engine keeps, seconds from before the feed was made too, then gets the
// deliveries: with them, every second of the last minute once, as a
// subscriber from the start got it.
func TestARecentSubscriberGetsTheLastMinuteOnce(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 1000})
	want := map[int64]int64{} // second -> passes
	traffic := func(from, to int) {
		for sec := from; sec < to; sec++ {
			clock.Set(time.Duration(sec)*time.Second + 300*time.Millisecond)
			for range sec % 7 {
				require.True(t, try(e, "api"))
				want[int64(sec)*int64(time.Second)]++
			}
			if e.feed != nil {
				e.Feed().Poll()
			}
		}
	}
	traffic(10, 40) // before any feed
	f := e.Feed()
	early := map[int64]int64{}
	f.SubscribeRecent(func(b []stat.Second) {
		for _, s := range b {
			early[s.Start] += s.Pass
		}
	})
	for sec := int64(0); sec < 40; sec++ {
		if sec < 39 { // the second the feed was made in comes later, whole
			assert.Equal(t, want[sec*int64(time.Second)], early[sec*int64(time.Second)], "second %d, before the feed", sec)
		}
	}
	traffic(40, 130)
	got := map[int64]int64{}
	var firstCall []stat.Second
	calls := 0
	f.SubscribeRecent(func(b []stat.Second) {
		if calls == 0 {
			firstCall = append(firstCall, b...)
		}
		calls++
		for _, s := range b {
			got[s.Start] += s.Pass
		}
	})
	require.Equal(t, 1, calls, "the recent seconds, before SubscribeRecent returns")
	require.NotEmpty(t, firstCall)
	assert.GreaterOrEqual(t, firstCall[0].Start, int64(68*time.Second), "a minute back at most")
	for i := 1; i < len(firstCall); i++ {
		assert.Less(t, firstCall[i-1].Start, firstCall[i].Start, "in order, each second once")
	}
	assert.False(t, firstCall[len(firstCall)-1].Time.IsZero(), "wall times")
	traffic(130, 140)
	clock.Set(142 * time.Second)
	f.Poll()
	for sec := firstCall[0].Start; sec < int64(140*time.Second); sec += int64(time.Second) {
		assert.Equal(t, want[sec], got[sec], "second %v: the late subscriber's", time.Duration(sec))
		assert.Equal(t, want[sec], early[sec], "second %v: the first subscriber's", time.Duration(sec))
	}
}

// The second before the feed is made, its last bucket still in the
// second window, reaches a SubscribeRecent subscriber whole; and a pass
// taken back after its second was delivered is counted once by a
// subscriber made between the two (its second shows it, the next delivery
// does not take it again).
func TestARecentSubscriberCountsEachPassOnce(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 1000})
	clock.Set(38*time.Second + 300*time.Millisecond)
	admit := func(n int) {
		for range n {
			require.True(t, try(e, "api"))
		}
	}
	admit(3)
	clock.Set(38*time.Second + 900*time.Millisecond)
	admit(5) // its bucket still in the second window when the feed is made
	clock.Set(39*time.Second + 300*time.Millisecond)
	got := map[int64]int64{}
	e.Feed().SubscribeRecent(func(b []stat.Second) {
		for _, s := range b {
			got[s.Start/int64(time.Second)] += s.Pass
		}
	})
	admit(1)
	clock.Set(42 * time.Second)
	e.Feed().Poll()
	assert.Equal(t, map[int64]int64{38: 8, 39: 1}, got)

	// A request queued at 41.9 s for a pass borrowed from second 42 gives
	// up after second 42 was delivered: the pass is taken back late.
	clock2 := stattest.NewClock(10 * time.Second)
	var giveUp func()
	e2, err := New(WithClock(clock2), WithSleep(func(ctx context.Context, d time.Duration) error {
		if giveUp != nil {
			g := giveUp
			giveUp = nil
			g()
			return context.Canceled
		}
		clock2.Advance(d)
		return ctx.Err()
	}))
	require.NoError(t, err)
	load(t, e2, Rule{Resource: "api", Threshold: 1})
	f := e2.Feed()
	first := map[int64]int64{}
	f.Subscribe(func(b []stat.Second) {
		for _, s := range b {
			first[s.Start] += s.Pass
		}
	})
	f.Poll()
	clock2.Set(11 * time.Second)
	require.True(t, try(e2, "api"))
	clock2.Set(11*time.Second + 900*time.Millisecond)
	giveUp = func() {
		clock2.Set(14 * time.Second)
		f.Poll() // delivers 11, and 12 with the borrowed pass
	}
	_, err = e2.Entry("api", WithWait(500*time.Millisecond))
	require.Error(t, err, "it gave up")
	late := map[int64]int64{}
	f.SubscribeRecent(func(b []stat.Second) {
		for _, s := range b {
			late[s.Start] += s.Pass
		}
	})
	clock2.Set(15*time.Second + 300*time.Millisecond)
	require.True(t, try(e2, "api"))
	clock2.Set(18 * time.Second)
	f.Poll()
	sum := func(m map[int64]int64) (n int64) {
		for _, v := range m {
			n += v
		}
		return n
	}
	snap, _ := e2.Snapshot("api")
	assert.Equal(t, snap.MinutePass, sum(late), "the late subscriber's minute is the engine's")
	assert.Equal(t, sum(first), sum(late), "and the first subscriber's")
}
