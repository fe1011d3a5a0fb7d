package flow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestRegressAllocsSpanExactAndWaits: Entry/Exit on span-exact rules (pass and
// block) and waits that really borrow, take ahead and queue (and align)
// allocate nothing once warm.
func TestRegressAllocsSpanExactAndWaits(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		rules []Rule
		opts  []EntryOption
		fill  int
	}{
		{"span-pass", []Rule{{Resource: "api", Threshold: 1e12, SpanExact: true}}, nil, 0},
		{"span-block", []Rule{{Resource: "api", Threshold: 0, SpanExact: true}}, nil, 0},
		{"span+plain", []Rule{{Resource: "api", Threshold: 1e12, SpanExact: true}, {Resource: "api", Threshold: 1e12}}, nil, 0},
		{"span-wait", []Rule{{Resource: "api", Threshold: 1e6, SpanExact: true}}, []EntryOption{WithWait(2 * time.Second)}, 1e6},
		{"reject-wait", []Rule{{Resource: "api", Threshold: 1e6}}, []EntryOption{WithWait(2 * time.Second)}, 1e6},
		{"gcra-wait", []Rule{{Resource: "api", Threshold: 1e8, Behavior: GCRA, Burst: 1}}, []EntryOption{WithWait(2 * time.Second)}, 0},
		{"throttle-wait", []Rule{{Resource: "api", Threshold: 1e8, Behavior: Throttle}}, []EntryOption{WithWait(2 * time.Second)}, 0},
		{"combo-wait", []Rule{
			{Resource: "api", Threshold: 1e6, SpanExact: true},
			{Resource: "api", Threshold: 1e6 + 1},
			{Resource: "api", Threshold: 1e8, Behavior: GCRA, Burst: 1},
			{Resource: "api", Threshold: 1e8, Behavior: Throttle}}, []EntryOption{WithWait(2 * time.Second)}, 0},
		{"priority", []Rule{{Resource: "api", Threshold: 1e6, SpanExact: true}}, []EntryOption{WithPriority()}, 1e6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clock, _ := waitEngine(t)
			// A sleeper that records nothing (the clockSleeper appends).
			// The clock stays put (a bucket made costs an allocation, once
			// per bucket, not per request): every wait is real, in the
			// engine's eyes, and ends at once.
			waits := 0
			e.sleep = func(ctx context.Context, d time.Duration) error {
				waits++
				return nil
			}
			load(t, e, tc.rules...)
			clock.Set(time.Second)
			f := func() {
				en, err := e.Entry("api", tc.opts...)
				if err == nil {
					en.Exit(nil)
				}
			}
			if tc.fill > 0 {
				en, err := e.Entry("api", WithCount(tc.fill))
				if err == nil {
					en.Exit(nil)
				}
			}
			for range 100 {
				f()
			}
			before := waits
			assert.Zero(t, testing.AllocsPerRun(500, f))
			r, _ := e.Resource("api")
			assert.Zero(t, testing.AllocsPerRun(500, func() {
				en, err := r.Wait(ctx, tc.opts...)
				if err == nil {
					en.Exit(nil)
				}
			}))
			if tc.opts != nil {
				assert.GreaterOrEqual(t, waits-before, 500, "the requests measured waited")
			}
		})
	}
}

// TestRegressAllocsWarmUp: Entry/Exit on WarmUp and WarmUpThrottle rules
// allocate nothing, passed or refused: the warm-up bucket reads the
// previous second's passes through a closure that stays on the stack.
func TestRegressAllocsWarmUp(t *testing.T) {
	for _, r := range []Rule{
		{Resource: "api", Threshold: 300, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second},
		{Resource: "api", Threshold: 300, Behavior: WarmUpThrottle, WarmUpPeriod: 10 * time.Second, MaxQueueing: time.Millisecond},
	} {
		t.Run(r.Behavior.String(), func(t *testing.T) {
			clock := stattest.NewClock(0)
			e, _ := newEngine(t, clock)
			load(t, e, r)
			passed := 0
			f := func() {
				en, err := e.Entry("api")
				if err == nil {
					passed++
					en.Exit(nil)
				}
			}
			clock.Set(time.Second)
			for range 100 {
				f()
			}
			assert.Zero(t, testing.AllocsPerRun(500, f), "within a second")
			assert.Positive(t, passed)
		})
	}
}
