package flow

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat/stattest"
)

// fakeMeter is a CPU reading a test sets.
type fakeMeter struct{ bits atomic.Uint64 }

func (m *fakeMeter) CPUUsage() float64 { return math.Float64frombits(m.bits.Load()) }
func (m *fakeMeter) set(v float64)     { m.bits.Store(math.Float64bits(v)) }

// serve runs a steady service on resource "in" of e for d: every 10 ms, k
// requests enter and the ones of 10 ms before exit (an RT of 10 ms, k in
// flight, 100k completions per second). It returns how many were
// refused.
func serve(t *testing.T, e *Engine, clock *stattest.Clock, k int, d time.Duration) (refused int) {
	t.Helper()
	var inflight []Entry
	for end := clock.Advance(0) + d; clock.Advance(0) < end; clock.Advance(10 * time.Millisecond) {
		for _, en := range inflight {
			en.Exit(nil)
		}
		inflight = inflight[:0]
		for range k {
			en, err := e.Entry("in")
			if err != nil {
				refused++
				continue
			}
			inflight = append(inflight, en)
		}
	}
	for _, en := range inflight {
		en.Exit(nil)
	}
	return refused
}

// servedBBR is an engine of rules on a fake clock, with a CPU reading of
// 0.3 (cool), whose resource "in" served 2 s of serve's steady traffic,
// none refused: 800 completions a second of 10 ms.
func servedBBR(t *testing.T, rules ...Rule) (*Engine, *stattest.Clock, *fakeMeter) {
	t.Helper()
	clock := stattest.NewClock(time.Hour)
	m := &fakeMeter{}
	m.set(0.3)
	e, _ := newEngine(t, clock, WithCPU(m))
	load(t, e, rules...)
	require.Zero(t, serve(t, e, clock, 8, 2*time.Second))
	return e, clock, m
}

// enterAll enters n requests on "in", each required to be admitted.
func enterAll(t *testing.T, e *Engine, n int) []Entry {
	t.Helper()
	held := make([]Entry, 0, n)
	for range n {
		en, err := e.Entry("in")
		require.NoError(t, err)
		held = append(held, en)
	}
	return held
}

// A SystemBBR rule admits everything while the CPU is cool; hot, it
// refuses requests past what the resource has shown it completes in
// flight (most completions per second x least RT), with ReasonSystem and
// a retry of the least RT; cooled, it keeps checking for a second, then
// admits everything again.
func TestSystemBBRShedsPastWhatTheResourceCompletes(t *testing.T) {
	e, clock, m := servedBBR(t, Rule{Resource: "in", Threshold: 1e12}, Rule{Resource: "in", System: SystemBBR, Threshold: 0.8})
	// Cool: 8 per 10 ms of 10 ms each (servedBBR), then 30 at once: all
	// admitted.
	require.Zero(t, serve(t, e, clock, 30, 20*time.Millisecond))
	require.Zero(t, serve(t, e, clock, 8, time.Second))
	st := e.Systems()
	require.Len(t, st, 1)
	assert.Equal(t, int64(8), st[0].Limit, "800 completions per second x 10 ms")
	assert.False(t, st[0].Shedding)

	// Hot: admitted while no more are in flight than the estimate (8),
	// so 9 are; the 10th is refused.
	m.set(0.9)
	clock.Advance(2 * time.Millisecond)
	held := enterAll(t, e, 9)
	clock.Advance(2 * time.Millisecond) // the verdict sees the 9
	refused, err := e.Entry("in")
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonSystem, be.Reason)
	assert.Equal(t, SystemBBR, be.Rule.System)
	assert.Equal(t, 10*time.Millisecond, refused.Refusal().RetryAfter, "the least RT")
	st = e.Systems()
	assert.True(t, st[0].Shedding && st[0].Refusing)
	assert.Equal(t, int64(9), st[0].Inflight)
	assert.InDelta(t, 0.9, st[0].CPU, 1e-9)

	// One exits (after 10 ms: the least RT stays): room for one again.
	clock.Advance(10 * time.Millisecond)
	held[0].Exit(nil)
	held = held[1:]
	clock.Advance(3 * time.Millisecond)
	en, err := e.Entry("in")
	require.NoError(t, err)
	held = append(held, en)

	// Cooled, but within a second of the hot reading: still checked.
	m.set(0.2)
	clock.Advance(500 * time.Millisecond)
	_, err = e.Entry("in")
	require.ErrorAs(t, err, &be, "half a second after the CPU cooled, 9 in flight")
	// A second after: admitted whatever is in flight.
	clock.Advance(600 * time.Millisecond)
	en, err = e.Entry("in")
	require.NoError(t, err)
	held = append(held, en)
	assert.False(t, e.Systems()[0].Shedding)
	for _, en := range held {
		en.Exit(nil)
	}
}

// A SystemBBR rule's estimate is at least 1: hot, a resource that has
// completed nothing in the last second (stalled, or just started) admits
// a request while at most one is in flight, and sheds the rest.
func TestSystemBBRShedsAStalledService(t *testing.T) {
	e, clock, m := servedBBR(t, Rule{Resource: "in", Threshold: 1e12}, Rule{Resource: "in", System: SystemBBR, Threshold: 0.8})
	m.set(0.95)
	var held []Entry
	for range 300 { // 3 s of 8 arrivals per 10 ms; nothing completes
		for range 8 {
			if en, err := e.Entry("in"); err == nil {
				held = append(held, en)
			}
		}
		clock.Advance(10 * time.Millisecond)
	}
	st := e.Systems()[0]
	assert.Equal(t, int64(1), st.Limit, "no completion in the last second")
	assert.Less(t, len(held), 40, "admitted while stalled")
	for _, en := range held {
		en.Exit(nil)
	}
}

// A rule set that keeps a SystemBBR rule (a reload, of this resource's
// rules or another's) keeps its hot reading: its second of cooling goes
// on, and what is in flight past the estimate is still refused.
func TestSystemBBRCoolingSurvivesAReload(t *testing.T) {
	rules := []Rule{{Resource: "in", Threshold: 1e12}, {Resource: "in", System: SystemBBR, Threshold: 0.8}, {Resource: "other", Threshold: 10}}
	e, clock, m := servedBBR(t, rules...)
	m.set(0.95)
	clock.Advance(2 * time.Millisecond)
	held := enterAll(t, e, 9)
	m.set(0.2) // cooled: the rule keeps checking for a second
	clock.Advance(100 * time.Millisecond)
	require.False(t, try(e, "in"))
	rules[2].Threshold = 20
	load(t, e, rules...)
	clock.Advance(100 * time.Millisecond)
	assert.False(t, try(e, "in"), "a reload ended the cooling")
	assert.True(t, e.Systems()[0].Shedding)
	for _, en := range held {
		en.Exit(nil)
	}
}

// Two SystemBBR rules of different thresholds on one resource each keep
// their own hot reading: at a CPU usage between them, the refusal is the
// lower one's.
func TestSystemBBRRulesKeepTheirOwnThresholds(t *testing.T) {
	e, clock, m := servedBBR(t, Rule{Resource: "in", Threshold: 1e12}, Rule{Resource: "in", ID: "bbr90", System: SystemBBR, Threshold: 0.9},
		Rule{Resource: "in", ID: "bbr50", System: SystemBBR, Threshold: 0.5})
	m.set(0.6)
	clock.Advance(2 * time.Millisecond)
	held := enterAll(t, e, 9)
	clock.Advance(2 * time.Millisecond)
	_, err := e.Entry("in")
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, "bbr50", be.Rule.ID)
	for _, en := range held {
		en.Exit(nil)
	}
}

// A system rule is no QPS rule: Engine.Policy names the resource's own
// QPS rule, and none on a resource with only system rules.
func TestSystemRulesAreNoPolicy(t *testing.T) {
	e, _ := newEngine(t, stattest.NewClock(time.Hour), WithCPU(&fakeMeter{}))
	load(t, e, Rule{Resource: "in", ID: "q", Threshold: 100}, Rule{Resource: "in", ID: "sys", System: SystemCPU, Threshold: 0.8},
		Rule{Resource: "only", System: SystemBBR, Threshold: 0.8})
	name, quota, window, ok := e.Policy("in")
	assert.True(t, ok)
	assert.Equal(t, "q", name)
	assert.Equal(t, int64(100), quota)
	assert.Equal(t, time.Second, window)
	_, _, _, ok = e.Policy("only")
	assert.False(t, ok)
}

// A SystemCPU rule refuses while the CPU usage is over its threshold,
// from the first refresh after the reading turned (at most 1 ms), and
// admits from the first refresh after it fell back.
func TestSystemCPURefusesWhileTheCPUIsHot(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	m := &fakeMeter{}
	m.set(0.5)
	e, _ := newEngine(t, clock, WithCPU(m))
	load(t, e, Rule{Resource: "in", System: SystemCPU, Threshold: 0.9})
	require.True(t, try(e, "in"))
	m.set(0.95)
	clock.Advance(time.Millisecond)
	en, err := e.Entry("in")
	var be *BlockError
	require.ErrorAs(t, err, &be)
	assert.Equal(t, ReasonSystem, be.Reason)
	assert.Equal(t, "system", be.Reason.String())
	assert.Equal(t, cpuRetry, en.Refusal().RetryAfter)
	// Through the general path too (an option on the request).
	require.False(t, try(e, "in", WithCount(2)))
	m.set(0.9) // at the threshold: admitted
	clock.Advance(time.Millisecond)
	require.True(t, try(e, "in"))
	require.True(t, try(e, "in", WithCount(2)))
}

// A SystemRT rule refuses while the resource's average RT over its second
// window is over MaxRT, and admits once slow completions left it.
func TestSystemRTRefusesWhileTheAverageIsOver(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "in", System: SystemRT, MaxRT: 50 * time.Millisecond})
	en, err := e.Entry("in")
	require.NoError(t, err)
	clock.Advance(200 * time.Millisecond)
	en.Exit(nil)
	clock.Advance(time.Millisecond)
	_, err = e.Entry("in")
	var be *BlockError
	require.ErrorAs(t, err, &be, "an average of 200 ms")
	assert.Equal(t, SystemRT, be.Rule.System)
	clock.Advance(1100 * time.Millisecond) // the slow completion left the window
	require.True(t, try(e, "in"))
}

// Bad system rules are refused with an error naming the field and value,
// and the rules in force stay.
func TestSystemRulesValidate(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	m := &fakeMeter{}
	withCPU, _ := newEngine(t, clock, WithCPU(m))
	without, _ := newEngine(t, clock)
	load(t, withCPU, Rule{Resource: "in", Threshold: 5})
	for _, c := range []struct {
		e    *Engine
		r    Rule
		want string
	}{
		{withCPU, Rule{Resource: "in", System: SystemBBR, Threshold: 1.5}, "Threshold"},
		{withCPU, Rule{Resource: "in", System: SystemCPU, Threshold: -0.1}, "Threshold"},
		{withCPU, Rule{Resource: "in", System: SystemCPU, Threshold: math.NaN()}, "Threshold"},
		{withCPU, Rule{Resource: "in", System: SystemCPU}, "Threshold"},
		{withCPU, Rule{Resource: "in", System: SystemRT}, "MaxRT"},
		{withCPU, Rule{Resource: "in", System: SystemRT, MaxRT: -time.Second}, "MaxRT"},
		{withCPU, Rule{Resource: "in", System: SystemRT, MaxRT: time.Second, Threshold: 500}, "Threshold"},
		{withCPU, Rule{Resource: "in", System: SystemCheck(9), Threshold: 0.5}, "System"},
		{withCPU, Rule{Resource: "in", System: SystemBBR, Threshold: 0.5, PerKey: true}, "System"},
		{withCPU, Rule{Resource: "in", System: SystemBBR, Threshold: 0.5, Metric: Concurrency}, "System"},
		{without, Rule{Resource: "in", System: SystemBBR, Threshold: 0.5}, "WithCPU"},
		{without, Rule{Resource: "in", System: SystemCPU, Threshold: 0.5}, "WithCPU"},
	} {
		err := c.e.LoadRules([]Rule{{Resource: "in", Threshold: 1}, c.r})
		require.Error(t, err, "%+v", c.r)
		assert.Contains(t, err.Error(), c.want, "%+v", c.r)
		var re *RuleError
		assert.True(t, errors.As(err, &re), "%v", err)
	}
	assert.Equal(t, 5.0, withCPU.Rules()[0].Threshold, "a refused set changes nothing")
	// SystemRT needs no meter.
	load(t, without, Rule{Resource: "in", System: SystemRT, MaxRT: time.Second})
	assert.True(t, strings.Contains(without.Rules()[0].String(), "SystemRT"), without.Rules()[0].String())
}

// Entry and Exit on a resource with system rules allocate nothing,
// admitted or refused, through the short path and the general one.
func TestSystemRulesAllocateNothing(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	m := &fakeMeter{}
	m.set(0.95)
	e, _ := newEngine(t, clock, WithCPU(m))
	load(t, e, Rule{Resource: "in", Threshold: 1e12}, Rule{Resource: "in", System: SystemBBR, Threshold: 0.8},
		Rule{Resource: "hot", System: SystemCPU, Threshold: 0.9})
	serve(t, e, clock, 4, 100*time.Millisecond)
	h, err := e.Resource("in")
	require.NoError(t, err)
	for _, f := range []func(){
		func() { en, _ := h.Entry(); en.Exit(nil) },
		func() { en, _ := e.Entry("in", WithCount(1)); en.Exit(nil) },
		func() { en, _ := e.Entry("hot"); en.Exit(nil) },
		func() { _, _ = e.Allow("in") },
	} {
		f()
		assert.Zero(t, testing.AllocsPerRun(200, f))
	}
	assert.False(t, try(e, "hot"), "the refused path was measured")
}

// Under concurrent requests, a CPU reading that flips and a clock that
// moves, the verdict's refreshes race no request (race detector): each
// request is admitted or refused with ReasonSystem, some of each, and
// nothing is in flight at the end.
func TestSystemVerdictUnderConcurrency(t *testing.T) {
	// The CPU reads hot and cool in turn by the clock (hot from the
	// start), and every request moves the clock: whichever goroutines run
	// when, the verdict is refreshed, and the first requests, held before
	// anything completed, are past the estimate while hot.
	clock := stattest.NewClock(time.Hour)
	e, _ := newEngine(t, clock, WithCPU(flipMeter{clock}))
	load(t, e, Rule{Resource: "in", Threshold: 1e12}, Rule{Resource: "in", System: SystemBBR, Threshold: 0.5},
		Rule{Resource: "in", System: SystemRT, MaxRT: time.Second})
	var admitted, refused, wrong atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held []Entry
			for range 2000 {
				clock.Advance(10 * time.Microsecond)
				en, err := e.Entry("in")
				var be *BlockError
				switch {
				case err == nil:
					admitted.Inc()
					held = append(held, en)
				case errors.As(err, &be) && be.Reason == ReasonSystem:
					refused.Inc()
				default:
					wrong.Inc()
				}
				if len(held) > 40 {
					held[0].Exit(nil)
					held = held[1:]
				}
			}
			for _, en := range held {
				en.Exit(nil)
			}
		}()
	}
	wg.Wait()
	t.Logf("admitted %d, refused %d", admitted.Load(), refused.Load())
	assert.Zero(t, wrong.Load())
	assert.Equal(t, int64(16000), admitted.Load()+refused.Load())
	assert.Positive(t, refused.Load(), "40 held by each of 8: past the estimate while hot")
	clock.Advance(time.Millisecond)
	assert.Zero(t, e.Systems()[0].Inflight)
}

// A CPU reading out of [0, 1] is clamped: NaN and below 0 read as 0 (cool),
// above 1 as 1.
func TestSystemCPUReadingIsClamped(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	m := &fakeMeter{}
	e, _ := newEngine(t, clock, WithCPU(m))
	load(t, e, Rule{Resource: "in", System: SystemCPU, Threshold: 0.9})
	for _, c := range []struct{ in, want float64 }{{math.NaN(), 0}, {-3, 0}, {math.Inf(1), 1}, {7, 1}, {0.5, 0.5}} {
		m.set(c.in)
		clock.Advance(time.Millisecond)
		assert.Equal(t, c.want, e.Systems()[0].CPU, "%v", c.in)
	}
}

// A system refusal's retry time is the latest of the system rule's and
// the waits of the resource's rate rules, on the short path as on the
// general one.
func TestSystemRefusalRetriesWhenTheRateRulesWould(t *testing.T) {
	clock := stattest.NewClock(time.Hour)
	m := &fakeMeter{}
	e, _ := newEngine(t, clock, WithCPU(m))
	load(t, e, Rule{Resource: "api", Threshold: 1}, Rule{Resource: "api", System: SystemCPU, Threshold: 0.5})
	require.True(t, try(e, "api"))
	m.set(0.9)
	clock.Advance(2 * time.Millisecond)
	short, err := e.Entry("api")
	require.Error(t, err)
	general, err := e.Entry("api", WithCount(1))
	require.Error(t, err)
	assert.Equal(t, 998*time.Millisecond, short.Refusal().RetryAfter, "the window's wait, past the CPU rule's 200 ms")
	assert.Equal(t, short.Refusal().RetryAfter, general.Refusal().RetryAfter)
}

// Adding a system rule ahead of a WarmUp rule on its resource keeps the
// warm-up's state: after 30 s at twice the threshold, the second after
// the reload admits what it would without the system rule (a warm rule's
// threshold, not a cold one's).
func TestAddingASystemRuleKeepsOtherRulesState(t *testing.T) {
	warm := Rule{Resource: "in", Threshold: 1000, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second}
	second := func(clock *stattest.Clock, e *Engine) (n int) {
		for range 100 {
			for range 20 {
				if try(e, "in") {
					n++
				}
			}
			clock.Advance(10 * time.Millisecond)
		}
		return n
	}
	admitted := func(reload []Rule) int {
		clock := stattest.NewClock(time.Hour)
		e, _ := newEngine(t, clock)
		load(t, e, warm)
		for range 30 {
			second(clock, e)
		}
		load(t, e, reload...)
		return second(clock, e)
	}
	kept := admitted([]Rule{warm})
	assert.Equal(t, kept, admitted([]Rule{{Resource: "in", System: SystemRT, MaxRT: time.Hour}, warm}))
	assert.Greater(t, kept, 900, "warm")
}
