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
// its share has left, and it is told to the source (LocalCounter). For a
// window after the rule last fell back, the local window applies on top of
// the source: an instance back first admits no more than its share while
// the others may still admit theirs on their own; after that, the source
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
	assert.Equal(t, 10, admitN(e, "api", 30), "the fallback admits what the share has left: 50 - 40")
	assert.Equal(t, int64(10), src.local.Load(), "the source heard of each")

	src.err.Store(nil)
	clock.Set(600 * time.Millisecond)
	calls := src.calls.Load()
	_, err := e.Entry("api")
	var be *BlockError
	require.ErrorAs(t, err, &be, "back on the source within a window of the fallback: the share is spent")
	assert.Equal(t, ReasonFlow, be.Reason, "refused by the local window")
	assert.Equal(t, calls+1, src.calls.Load(), "the first request asks the source, which answers again")
	_, err = e.Entry("api")
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonFlow, be.Reason)
	assert.Equal(t, calls+1, src.calls.Load(), "the next is refused by the share without asking the source")

	clock.Set(1050 * time.Millisecond) // the source's 40 left the window, the fallback's 10 not
	src.allow.Store(false)
	_, err = e.Entry("api")
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonGlobal, be.Reason, "the source refuses")
	src.allow.Store(true)
	assert.Equal(t, 40, admitN(e, "api", 50), "the source's refusal took nothing from the share")

	clock.Set(1150 * time.Millisecond)
	assert.Equal(t, 200, admitN(e, "api", 200), "a window after the last fallback the source alone decides")
	assert.Equal(t, int64(10), src.local.Load(), "nothing more admitted on its own")

	src.err.Store(errors.New("down"))
	calls = src.calls.Load()
	assert.Zero(t, admitN(e, "api", 5), "the local window counted what the source admitted: the fallback has no room")
	assert.Equal(t, calls+5, src.calls.Load(), "while the source fails, each request asks it (a request after a backoff probes)")
	clock.Set(2200 * time.Millisecond)
	assert.Equal(t, 50, admitN(e, "api", 60), "a window later, the share")
	assert.Equal(t, int64(60), src.local.Load())
}
