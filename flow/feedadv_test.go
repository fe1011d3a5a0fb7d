package flow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

// A late correction (a queued pass taken back after its second was
// delivered) reaching a resource with no newer pending second was emitted
// as second hi-1s; when hi had not moved since the previous poll, that was
// the second delivered last: the same second came out twice (the second
// time with Pass -1). Since a request's rate rules all count it at the
// instant it goes (align), the queued request here is counted in second
// 12, where its throttle slot is, and its cancel gives that back before
// the second is delivered: no second is delivered twice, none is
// negative, and the cancelled request is in none.
func TestFeedHostileFeedSecondDeliveredTwice(t *testing.T) {
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

// A priority request borrows from the next bucket and is admitted when
// that bucket starts; its Pass and Occupied are folded in only when some
// write makes a bucket. Settle makes one only if the head counted
// something, and a refused priority request writes nothing: while the
// request is in flight and the resource otherwise idle, the feed never
// delivers its pass (by time), and Inflight reads 0 with one request in
// flight. Only its Exit finally folds the pass, into the Exit's second.
func TestFeedHostileBorrowedPassNotDeliveredByTime(t *testing.T) {
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
	clock.Set(11*time.Second + 900*time.Millisecond) // full until 12 s
	en, err := e.Entry("api", WithPriority())        // borrows 12.0, waits 100 ms
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

// Close after Start, twice (metriclog.Writer.Close closes the engine's
// feed, and promflow's doc asks the user to close it too): the second
// Close closes the ticker's stop channel again and panics.
func TestFeedHostileFeedCloseTwiceAfterStart(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	f := e.Feed()
	f.Start()
	f.Close()
	assert.NotPanics(t, f.Close)
}

// A subscriber that unsubscribes from inside its callback (after the
// delivery it waited for) deadlocks the feed: subscribers run under the
// feed's lock, which cancel takes too.
func TestFeedHostileCancelInsideCallback(t *testing.T) {
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

// A clock that steps back a little (under WithClock's 100 ms tolerance,
// so engine time steps back too) across a second boundary: writes clamp
// into the newest bucket, in the next second. Close delivers the seconds
// up to now's, not the newest bucket's: what the newest bucket holds is
// never delivered.
func TestFeedHostileCloseAfterSmallStepBackLosesHead(t *testing.T) {
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
