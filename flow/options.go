package flow

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/stat"
)

// Option configures an Engine.
type Option func(*config)

// config is every engine setting: defaults are set in defaultConfig and
// checked in validate, and nowhere else.
type config struct {
	clock        stat.Clock
	maxResources int
	sampleCount  int
	spanBuckets  int
	source       TokenSource
	sleep        sleepFunc
	maxKeys      int
	// breakerListener is WithBreakerListener's function (nil: none).
	breakerListener func(BreakerChange)
	// cpu is WithCPU's meter (nil: none).
	cpu CPUMeter
}

// sleepFunc waits for d or until ctx ends.
type sleepFunc func(ctx context.Context, d time.Duration) error

func defaultConfig() config {
	return config{
		clock:        stat.DefaultClock(),
		maxResources: stats.DefaultMaxResources,
		sampleCount:  stats.DefaultSampleCount,
		spanBuckets:  defaultSpanBuckets,
		sleep:        sleep,
		maxKeys:      defaultEngineMaxKeys,
	}
}

// validate names the option and value that is out of range.
func (c *config) validate() error {
	switch {
	case c.clock == nil:
		return fmt.Errorf("flow: WithClock: clock must not be nil")
	case c.maxResources < 1:
		return fmt.Errorf("flow: WithMaxResources must be >= 1, got %d", c.maxResources)
	case c.sampleCount < 1 || int64(time.Second)%int64(c.sampleCount) != 0:
		return fmt.Errorf("flow: WithSampleCount must divide 1s into whole nanoseconds, got %d", c.sampleCount)
	case c.spanBuckets < 1 || c.spanBuckets > maxSpanBuckets || int64(time.Millisecond)%int64(c.spanBuckets) != 0:
		return fmt.Errorf("flow: WithSpanBuckets must divide 1ms into whole nanoseconds and be at most %d, got %d", maxSpanBuckets, c.spanBuckets)
	case c.sleep == nil:
		return fmt.Errorf("flow: WithSleep: function must not be nil")
	}
	return validateMaxKeys(c.maxKeys)
}

// WithClock sets the engine's clock (default stat.DefaultClock(): a shared
// 1 ms coarse clock; stat.NewMonotonic() gives nanosecond RTs at the price
// of a clock read per Entry and per Exit). The engine keeps its own time
// moving forward over a clock that steps back: a step back of 100 ms or
// more is absorbed into an offset, so engine time continues from where it
// was and admission neither stalls for the size of the step nor reopens a
// full window; a smaller one is clamped to the newest bucket (admission
// waits at most its size). Readings below 0 start the engine at 0.
func WithClock(c stat.Clock) Option {
	return func(cfg *config) { cfg.clock = c }
}

// WithMaxResources caps the resources the engine keeps statistics for
// (default stats.DefaultMaxResources). At the cap, resources that no rule
// names and that have been idle for a minute make room; past that, Entry on
// a new resource returns an error matching stat.ErrTooManyResources.
func WithMaxResources(n int) Option { return func(cfg *config) { cfg.maxResources = n } }

// WithSampleCount sets the bucket count of every resource's 1 s window
// (default stats.DefaultSampleCount); it must divide one second into whole
// nanoseconds.
func WithSampleCount(n int) Option { return func(cfg *config) { cfg.sampleCount = n } }

// WithSpanBuckets sets the bucket count n of span-exact rules' windows
// (default 10): they admit against n+1 buckets of W/n, so
// they hold the threshold in every span of W and admit a steady n/(n+1)
// of it. More buckets admit closer to the threshold and cost about 0.4 KB
// each per resource on two cores (a bucket keeps a cache line of counts
// per CPU stripe). It must divide one millisecond into whole nanoseconds
// (so every whole-millisecond StatInterval divides into n buckets), at
// most 1000.
func WithSpanBuckets(n int) Option { return func(cfg *config) { cfg.spanBuckets = n } }

// defaultSpanBuckets is the bucket count of span-exact windows when
// WithSpanBuckets is not given: 10 buckets admit a steady 10/11 (91%) of
// the threshold, where the 4 of the plain second window would admit 80%
// (see the bench's precision table).
const defaultSpanBuckets = 10

// maxSpanBuckets bounds WithSpanBuckets.
const maxSpanBuckets = 1000

// WithTokenSource sets the source that global rules consult.
func WithTokenSource(s TokenSource) Option { return func(cfg *config) { cfg.source = s } }

// WithSleep replaces how the engine waits (throttling, borrowing); tests
// pass one that moves a manual clock. It must return ctx.Err() if ctx ends
// first.
func WithSleep(fn func(ctx context.Context, d time.Duration) error) Option {
	return func(cfg *config) { cfg.sleep = fn }
}

// sleep is the default wait: a timer, cut short by ctx.
func sleep(ctx context.Context, d time.Duration) error {
	// A timer from the pool: a wait allocates nothing (since Go 1.23 a
	// stopped timer delivers nothing stale, so it can be reset for the
	// next wait).
	t := timers.Get().(*time.Timer)
	t.Reset(d)
	defer putTimer(t)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

func putTimer(t *time.Timer) {
	if !t.Stop() {
		// Fired: with asynchronous timer channels (a main module before
		// Go 1.23, or GODEBUG asynctimerchan=1) the value may wait in
		// the channel; the next wait must not find it.
		select {
		case <-t.C:
		default:
		}
	}
	timers.Put(t)
}

// defaultEngineMaxKeys is the most keys an engine's PerKey rules may track
// together (the sum of their MaxKeys) unless WithMaxKeys says otherwise.
const defaultEngineMaxKeys = 1_000_000

// WithMaxKeys bounds the sum of MaxKeys over an engine's PerKey rules
// (default 1,000,000): each tracked key costs about 230 bytes,
// so the default bounds per-key state near 230 MB.
func WithMaxKeys(n int) Option { return func(cfg *config) { cfg.maxKeys = n } }

func validateMaxKeys(n int) error {
	if n < 1 || n > 1<<30 {
		return fmt.Errorf("flow: WithMaxKeys must be in [1, 2^30], got %d", n)
	}
	return nil
}
