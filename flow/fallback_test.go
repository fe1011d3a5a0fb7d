package flow

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat/stattest"
)

// sharedSource is a Binder whose bound sources admit or fail as it is set,
// and hear what the local fallback admitted (LocalCounter).
type sharedSource struct {
	allow atomic.Bool
	err   atomic.Error
	calls atomic.Int64
	local atomic.Int64
}

func (s *sharedSource) Acquire(context.Context, GlobalRequest) (bool, error) {
	panic("bound: never asked through the TokenSource")
}

func (s *sharedSource) Bind(GlobalRequest) BoundSource { return sharedBound{s} }

type sharedBound struct{ s *sharedSource }

func (b sharedBound) Acquire(context.Context, int64) (bool, error) {
	b.s.calls.Inc()
	if err := b.s.err.Load(); err != nil {
		return false, err
	}
	return b.s.allow.Load(), nil
}

func (b sharedBound) CountLocal(n int64) { b.s.local.Add(n) }

// admitN enters resource up to n times and returns how many were admitted.
func admitN(e *Engine, resource string, n int) int {
	got := 0
	for range n {
		if try(e, resource) {
			got++
		}
	}
	return got
}

// TestLocalFallbackSharesTheInstancesPartWithTheSource: a window rule's
// local fallback (LocalShare of its threshold) counts what the source
// admitted in its window, so an instance that falls back admits only what
// its share has left, and it is told to the source (LocalCounter). After
// an outage (fallbacks over a bucket or more), once the source answers
// again, the local window applies on top of the source, and first, for a
// window: an instance back first admits no more than its share while the
// others may still admit theirs on their own; after that, the source
// alone decides. Before, the fallback started from an empty window (each
// instance admitted its share on top of a window the source had just
// filled) and the source decided alone at once.
func TestLocalFallbackSharesTheInstancesPartWithTheSource(t *testing.T) {
	src := &sharedSource{}
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithTokenSource(src), WithSampleCount(10))                    // buckets of 100 ms
	load(t, e, Rule{ID: "g", Resource: "api", Threshold: 100, Global: true, LocalShare: 0.5}) // 50 locally

	src.allow.Store(true)
	require.Equal(t, 40, admitN(e, "api", 40), "the source admits")

	src.err.Store(errors.New("down"))
	clock.Set(100 * time.Millisecond)
	assert.Equal(t, 5, admitN(e, "api", 5), "the fallback admits")
	clock.Set(200 * time.Millisecond) // still down: an outage
	assert.Equal(t, 5, admitN(e, "api", 30), "the fallback admits what the share has left: 50 - 40 - 5")
	assert.Equal(t, int64(10), src.local.Load(), "the source heard of each")

	src.err.Store(nil)
	clock.Set(600 * time.Millisecond)
	calls := src.calls.Load()
	_, err := e.Entry("api")
	var be *BlockError
	require.ErrorAs(t, err, &be, "back on the source within a window of the outage: the share is spent")
	assert.Equal(t, ReasonFlow, be.Reason, "refused by the local window")
	assert.Equal(t, calls+1, src.calls.Load(), "the first request asks the source, which answers again")
	_, err = e.Entry("api")
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonFlow, be.Reason)
	assert.Equal(t, calls+1, src.calls.Load(), "the next is refused by the share without asking the source")

	clock.Set(1150 * time.Millisecond) // the window holds the fallback's last 5 only
	src.allow.Store(false)
	_, err = e.Entry("api")
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonGlobal, be.Reason, "the source refuses")
	src.allow.Store(true)
	assert.Equal(t, 45, admitN(e, "api", 50), "the source's refusal took nothing from the share")

	clock.Set(1300 * time.Millisecond)
	assert.Equal(t, 200, admitN(e, "api", 200), "a window after the outage the source alone decides")
	assert.Equal(t, int64(10), src.local.Load(), "nothing more admitted on its own")

	src.err.Store(errors.New("down"))
	calls = src.calls.Load()
	assert.Zero(t, admitN(e, "api", 5), "the local window counted what the source admitted: the fallback has no room")
	assert.Equal(t, calls+5, src.calls.Load(), "while the source fails, each request asks it (a request after a backoff probes)")
	clock.Set(2400 * time.Millisecond)
	assert.Equal(t, 50, admitN(e, "api", 60), "a window later, the share")
	assert.Equal(t, int64(60), src.local.Load())
}

// TestAFailedCallIsNotAnOutage: requests of one failed call fall back (a
// connection reset), but the source answers again at once: the instance
// goes on with the source, even though its share is spent, and a rule
// with a long window is not held to its share for that window. Only a
// run of fallbacks a bucket long or more is an outage.
func TestAFailedCallIsNotAnOutage(t *testing.T) {
	src := &sharedSource{}
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithTokenSource(src))
	load(t, e, Rule{ID: "g", Resource: "api", Threshold: 1000, StatInterval: time.Hour, Global: true, LocalShare: 0.5})
	src.allow.Store(true)
	require.Equal(t, 400, admitN(e, "api", 400))
	clock.Set(time.Minute)
	src.err.Store(errors.New("reset"))
	assert.Equal(t, 3, admitN(e, "api", 3), "the failed call's requests fall back")
	src.err.Store(nil)
	clock.Set(2 * time.Minute)
	assert.Equal(t, 300, admitN(e, "api", 300), "the source decides alone: 700 in the hour, over the share of 500")

	// The last request before an idle spell fell back, and so does the
	// first after it: two failed calls, not an outage.
	src.err.Store(errors.New("reset"))
	admitN(e, "api", 1)
	clock.Set(30 * time.Minute)
	admitN(e, "api", 1)
	src.err.Store(nil)
	assert.Equal(t, 200, admitN(e, "api", 200), "the source decides alone")
}

// TestFallbackAdmissionsGivenBackAreToldToTheSource: a request the
// fallback admitted and a later rule of its resource refused is given
// back to the share, and to the source as -1: the source hears of what
// was admitted, not of what got past the Global rule.
func TestFallbackAdmissionsGivenBackAreToldToTheSource(t *testing.T) {
	src := &sharedSource{}
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithTokenSource(src))
	load(t, e, Rule{ID: "g", Resource: "api", Threshold: 100, Global: true, LocalShare: 0.5},
		Rule{Resource: "api", Threshold: 10})
	src.err.Store(errors.New("down"))
	assert.Equal(t, 10, admitN(e, "api", 100))
	assert.Equal(t, int64(10), src.local.Load(), "told of the 10 admitted, not of the 90 the second rule refused")
}

// TestReloadKeepsTheFallbacksState: a reload of the same rule in the
// middle of an outage keeps what its fallbacks did: once the source is
// back, the share still applies on top of it.
func TestReloadKeepsTheFallbacksState(t *testing.T) {
	src := &sharedSource{}
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock, WithTokenSource(src), WithSampleCount(10))
	rule := Rule{ID: "g", Resource: "api", Threshold: 100, Global: true, LocalShare: 0.5}
	load(t, e, rule)
	src.err.Store(errors.New("down"))
	admitN(e, "api", 1)
	clock.Set(100 * time.Millisecond)
	admitN(e, "api", 1)
	clock.Set(200 * time.Millisecond)
	assert.Equal(t, 48, admitN(e, "api", 60))
	load(t, e, rule)
	src.err.Store(nil)
	src.allow.Store(true)
	clock.Set(300 * time.Millisecond)
	assert.Zero(t, admitN(e, "api", 10), "the share, spent before the reload, still applies")
	clock.Set(1300 * time.Millisecond)
	assert.Equal(t, 100, admitN(e, "api", 100), "until a window after the outage")
}

// TestFallbackAllocatesNothing: a request of a window rule whose source
// fails, admitted on its own and told to the source, and one refused by
// the share, allocate nothing; nor does one back on the source while the
// share applies on top of it.
func TestFallbackAllocatesNothing(t *testing.T) {
	src := &sharedSource{}
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock, WithTokenSource(src), WithSampleCount(10))
	load(t, e, Rule{ID: "g", Resource: "api", Threshold: 1e9, Global: true, LocalShare: 0.5})
	h, err := e.Resource("api")
	require.NoError(t, err)
	enter := func() {
		if en, err := h.Entry(); err == nil {
			en.Exit(nil)
		}
	}
	src.allow.Store(true)
	enter()
	assert.Zero(t, testing.AllocsPerRun(100, enter), "on the source, counted locally too")
	src.err.Store(errors.New("down"))
	enter()
	clock.Set(1050 * time.Millisecond)
	enter()
	clock.Set(1100 * time.Millisecond) // an outage: fallbacks over a bucket
	assert.Zero(t, testing.AllocsPerRun(100, enter), "fallen back")
	assert.Greater(t, e.rules.Load().byResource["api"].globals[0].fb.rejoin.Load(), clock.Now(), "an outage")
	src.err.Store(nil)
	enter()
	assert.Zero(t, testing.AllocsPerRun(100, enter), "back, the share on top")
	assert.Positive(t, src.local.Load())
}
