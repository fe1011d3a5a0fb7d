package flow

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat"
)

// Helpers the tests of every topic share: an engine on a manual clock,
// loading rules, one request, and function-valued clocks and sources.

// sleeper records waits instead of sleeping; it honours ctx.
type sleeper struct {
	mu    sync.Mutex
	waits []time.Duration
}

func (s *sleeper) sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.waits = append(s.waits, d)
	s.mu.Unlock()
	return ctx.Err()
}

// newEngine is an engine on clock whose waits are recorded, not slept.
func newEngine(t testing.TB, clock stat.Clock, opts ...Option) (*Engine, *sleeper) {
	t.Helper()
	s := &sleeper{}
	e, err := New(append([]Option{WithClock(clock), WithSleep(s.sleep)}, opts...)...)
	require.NoError(t, err)
	return e, s
}

// load loads rules into e, which must accept them.
func load(t testing.TB, e *Engine, rules ...Rule) {
	t.Helper()
	require.NoError(t, e.LoadRules(rules))
}

// try enters resource with opts and exits at once; it reports whether the
// request was admitted.
func try(e *Engine, resource string, opts ...EntryOption) bool {
	en, err := e.Entry(resource, opts...)
	if err != nil {
		return false
	}
	en.Exit(nil)
	return true
}

// clockFunc is a Clock read through a function.
type clockFunc func() int64

func (f clockFunc) Now() int64 { return f() }

// sourceFunc is a TokenSource that answers through a function.
type sourceFunc func(ctx context.Context, req GlobalRequest) (bool, error)

func (f sourceFunc) Acquire(ctx context.Context, req GlobalRequest) (bool, error) { return f(ctx, req) }
