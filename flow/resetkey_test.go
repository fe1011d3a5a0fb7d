package flow

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
