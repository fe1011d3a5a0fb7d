package flow

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat/stattest"
)

// resettingSource admits everything and records the callers it is asked
// to reset; err fails the reset.
type resettingSource struct {
	reset []string
	err   error
}

func (s *resettingSource) ResetKey(_ context.Context, caller string) error {
	s.reset = append(s.reset, caller)
	return s.err
}

// boundResetting is resettingSource bound to a rule.
type boundResetting struct{ *resettingSource }

func (b boundResetting) Acquire(context.Context, int64) (bool, error) { return true, nil }

// resettingBinder binds every rule to its source.
type resettingBinder struct{ s *resettingSource }

func (b resettingBinder) Acquire(context.Context, GlobalRequest) (bool, error) { return true, nil }

func (b resettingBinder) Bind(GlobalRequest) BoundSource { return boundResetting{b.s} }

// TestResetKeyStartsTheKeyAfresh: after ResetKey a key is admitted as a
// key never seen under every PerKey rate rule of the resource (window,
// Throttle, a listed key, a key evicted to the table's memory, a PerKey
// Global rule's source), other keys keep their counts, PerKey Concurrency
// counts stay, and bad calls are errors.
func TestResetKeyStartsTheKeyAfresh(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	src := &resettingSource{}
	e, _ := newEngine(t, clock, WithTokenSource(resettingBinder{src}))
	load(t, e,
		Rule{Resource: "win", Threshold: 2, PerKey: true, MaxKeys: 16, Keys: []KeyLimit{{Key: "vip", Threshold: 3}}},
		Rule{Resource: "paced", Threshold: 1, Behavior: Throttle, PerKey: true},
		Rule{Resource: "conc", Metric: Concurrency, Threshold: 1, PerKey: true},
		Rule{Resource: "global", Threshold: 2, PerKey: true, Global: true},
	)
	use := func(res, key string, n int) int {
		admitted := 0
		for range n {
			if en, err := e.Entry(res, WithKey(key)); err == nil {
				admitted++
				en.Exit(nil)
			}
		}
		return admitted
	}
	require.Equal(t, 2, use("win", "a", 3))
	require.Equal(t, 2, use("win", "b", 3))
	require.Equal(t, 3, use("win", "vip", 4))
	require.NoError(t, e.ResetKey(context.Background(), "win", "a"))
	require.NoError(t, e.ResetKey(context.Background(), "win", "vip"))
	assert.Equal(t, 2, use("win", "a", 3), "a starts afresh")
	assert.Equal(t, 0, use("win", "b", 1), "b keeps its counts")
	assert.Equal(t, 3, use("win", "vip", 4), "a listed key, at its own threshold")

	// Evicted to the table's memory (16 keys, 40 others since), reset,
	// back: afresh.
	for i := range 40 {
		use("win", "k"+strings.Repeat("x", i), 1)
	}
	require.NoError(t, e.ResetKey(context.Background(), "win", "b"))
	assert.Equal(t, 2, use("win", "b", 3), "b's remembered counts are gone")

	require.Equal(t, 1, use("paced", "a", 2), "one a second, no queue")
	require.NoError(t, e.ResetKey(context.Background(), "paced", "a"))
	assert.Equal(t, 1, use("paced", "a", 1), "its timeline is idle again")

	held, err := e.Entry("conc", WithKey("a"))
	require.NoError(t, err)
	assert.ErrorIs(t, e.ResetKey(context.Background(), "conc", "a"), ErrNoPerKeyRule, "no PerKey rate rule")
	_, err = e.Entry("conc", WithKey("a"))
	assert.ErrorIs(t, err, ErrBlocked, "in flight is not reset")
	held.Exit(nil)

	require.NoError(t, e.ResetKey(context.Background(), "global", "a"))
	assert.Equal(t, []string{"a"}, src.reset, "the source is asked")
	src.err = errors.New("redis down")
	err = e.ResetKey(context.Background(), "global", "a")
	assert.ErrorIs(t, err, src.err)
	assert.Contains(t, err.Error(), "global")

	assert.ErrorIs(t, e.ResetKey(context.Background(), "nowhere", "a"), ErrNoPerKeyRule)
	assert.ErrorIs(t, e.ResetKey(context.Background(), "win", ""), ErrInvalidOption)
	assert.ErrorIs(t, e.ResetKey(context.Background(), "win", strings.Repeat("x", 1025)), ErrInvalidOption)
}

// TestResetKeyRacingRequests: resets racing requests of the key, under
// the race detector, leave a key that, reset once more when they stop,
// admits exactly its threshold.
func TestResetKeyRacingRequests(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "win", Threshold: 5, PerKey: true}, Rule{Resource: "paced", Threshold: 5, Behavior: Throttle, PerKey: true})
	done := make(chan struct{})
	stopped := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { stopped <- struct{}{} }()
			for {
				select {
				case <-done:
					return
				default:
				}
				for _, res := range []string{"win", "paced"} {
					if en, err := e.Entry(res, WithKey("a")); err == nil {
						en.Exit(nil)
					}
				}
			}
		}()
	}
	for range 200 {
		require.NoError(t, e.ResetKey(context.Background(), "win", "a"))
		require.NoError(t, e.ResetKey(context.Background(), "paced", "a"))
	}
	close(done)
	for range 4 {
		<-stopped
	}
	require.NoError(t, e.ResetKey(context.Background(), "win", "a"))
	admitted := 0
	for range 10 {
		if try(e, "win", WithKey("a")) {
			admitted++
		}
	}
	assert.Equal(t, 5, admitted)
}

// TestResetKeyIsNotUndone: a request its key admitted before a reset,
// then refused by a later rule after it (a Global rule, asked last), gives
// back nothing of what the key admits after the reset: the key admits
// exactly its threshold afterwards.
func TestResetKeyIsNotUndone(t *testing.T) {
	const threshold = 3
	var e *Engine
	var inside atomic.Bool
	after := 0
	src := sourceFunc(func(context.Context, GlobalRequest) (bool, error) {
		if !inside.CompareAndSwap(false, true) {
			return true, nil
		}
		// The first request: its key admitted it; reset the key and use
		// it up, then refuse the request (its key admission goes back).
		if err := e.ResetKey(context.Background(), "r", "a"); err != nil {
			return false, err
		}
		for range threshold {
			if try(e, "r", WithKey("a")) {
				after++
			}
		}
		return false, nil
	})
	e, _ = newEngine(t, stattest.NewClock(time.Second), WithTokenSource(src))
	load(t, e, Rule{Resource: "r", Threshold: threshold, PerKey: true}, Rule{Resource: "r", Threshold: 1e6, Global: true, Fallback: FallbackOpen})
	require.False(t, try(e, "r", WithKey("a")), "the first request is refused by the Global rule")
	for try(e, "r", WithKey("a")) {
		after++
	}
	assert.Equal(t, threshold, after)
}

// TestResetKeyRacingEviction: a reset racing the eviction of its key (a
// table of 4 keys, other keys arriving) is never lost: right after it
// returns, the key, full before it, admits again. (Its threshold is 2: an
// admission racing its own key's eviction may be counted twice, in the
// memory of evicted keys and in the key's next state.)
func TestResetKeyRacingEviction(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Second))
	load(t, e, Rule{Resource: "r", Threshold: 2, PerKey: true, MaxKeys: 4})
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			try(e, "r", WithKey(string(rune('b'+i%8))))
		}
	}()
	lost := 0
	for range 3000 {
		try(e, "r", WithKey("a"))
		try(e, "r", WithKey("a"))
		require.NoError(t, e.ResetKey(context.Background(), "r", "a"))
		if !try(e, "r", WithKey("a")) {
			lost++
		}
	}
	close(done)
	<-stopped
	assert.Zero(t, lost)
}
