package promflow

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The default clock's ticker lives as long as the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/leapflow/leapflow/internal/clocks.(*Coarse).run"))
}

func engine(t *testing.T, clock *stattest.Clock, rules ...flow.Rule) *flow.Engine {
	t.Helper()
	e, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(8))
	require.NoError(t, err)
	require.NoError(t, e.LoadRules(rules))
	t.Cleanup(e.Feed().Close)
	return e
}

// TestCollectOnAFakeClock: the counters are the completed seconds' sums,
// exact; gauges are read at scrape time; the collector passes the
// client_golang lint.
func TestCollectOnAFakeClock(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock,
		flow.Rule{ID: "api-qps", Resource: "api", Threshold: 3},
		flow.Rule{Resource: "api", Metric: flow.Concurrency, Threshold: 10},
		flow.Rule{Resource: "idle", Threshold: 5},
	)
	c := New(eng)
	defer c.Close()
	clock.Set(11 * time.Second)
	for i := range 4 {
		en, err := eng.Entry("api")
		if i == 3 {
			require.ErrorIs(t, err, flow.ErrBlocked)
			continue
		}
		require.NoError(t, err)
		clock.Advance(100 * time.Millisecond)
		var exitErr error
		if i == 0 {
			exitErr = errors.New("failed")
		}
		en.Exit(exitErr)
	}
	held, err := eng.Entry("api")
	require.ErrorIs(t, err, flow.ErrBlocked, "the window is full")
	_ = held
	clock.Set(13 * time.Second)
	eng.Feed().Poll()

	want := `
# HELP leapflow_requests_passed_total Requests admitted.
# TYPE leapflow_requests_passed_total counter
leapflow_requests_passed_total{resource="api"} 3
# HELP leapflow_requests_blocked_total Requests blocked by a rule.
# TYPE leapflow_requests_blocked_total counter
leapflow_requests_blocked_total{resource="api"} 2
# HELP leapflow_requests_completed_total Admitted requests that exited.
# TYPE leapflow_requests_completed_total counter
leapflow_requests_completed_total{resource="api"} 3
# HELP leapflow_requests_failed_total Admitted requests that exited with an error, also counted as completed.
# TYPE leapflow_requests_failed_total counter
leapflow_requests_failed_total{resource="api"} 1
# HELP leapflow_request_duration_seconds Response times of the completed requests.
# TYPE leapflow_request_duration_seconds summary
leapflow_request_duration_seconds_sum{resource="api"} 0.3
leapflow_request_duration_seconds_count{resource="api"} 3
# HELP leapflow_requests_inflight Requests admitted and not exited.
# TYPE leapflow_requests_inflight gauge
leapflow_requests_inflight{resource="api"} 0
leapflow_requests_inflight{resource="idle"} 0
# HELP leapflow_rule_threshold A rule's threshold: requests per second (metric qps) or in flight (metric concurrency).
# TYPE leapflow_rule_threshold gauge
leapflow_rule_threshold{metric="concurrency",resource="api",rule="api"} 10
leapflow_rule_threshold{metric="qps",resource="api",rule="api-qps"} 3
leapflow_rule_threshold{metric="qps",resource="idle",rule="idle"} 5
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want),
		"leapflow_requests_passed_total", "leapflow_requests_blocked_total", "leapflow_requests_completed_total",
		"leapflow_requests_failed_total", "leapflow_request_duration_seconds", "leapflow_requests_inflight",
		"leapflow_rule_threshold"))

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestCountersOnlyGrow: scrapes between deliveries never go back, and
// every second is counted once.
func TestCountersOnlyGrow(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{Resource: "api", Threshold: 1000})
	c := New(eng)
	defer c.Close()
	clock.Set(time.Second) // the feed keeps seconds from the one after it was made
	last := 0.0
	for i := range 50 {
		clock.Advance(230 * time.Millisecond)
		for range i % 4 {
			en, err := eng.Entry("api")
			require.NoError(t, err)
			en.Exit(nil)
		}
		eng.Feed().Poll()
		v := passed(t, c)
		assert.GreaterOrEqual(t, v, last)
		last = v
	}
	clock.Advance(3 * time.Second)
	eng.Feed().Poll()
	total := 0
	for i := range 50 {
		total += i % 4
	}
	assert.Equal(t, float64(total), passed(t, c))
}

// passed reads the passed counter of "api" from a collection (0 before
// its first second).
func passed(t *testing.T, c *Collector) float64 {
	all := make(chan prometheus.Metric, 64)
	go func() {
		c.Collect(all)
		close(all)
	}()
	v := 0.0
	for m := range all {
		if m.Desc() == c.passed {
			var out dto.Metric
			require.NoError(t, m.Write(&out))
			v = out.GetCounter().GetValue()
		}
	}
	return v
}

type reloads struct {
	n   int64
	err error
}

func (r *reloads) Reloads() int64   { return r.n }
func (r *reloads) LastError() error { return r.err }

// TestReloadMetrics: a rule source's reload count and failure are
// exported.
func TestReloadMetrics(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	r := &reloads{n: 3}
	c := New(eng, WithReloads(r))
	defer c.Close()
	want := `
# HELP leapflow_rule_reloads_total Rule sets a rule source applied.
# TYPE leapflow_rule_reloads_total counter
leapflow_rule_reloads_total 3
# HELP leapflow_rule_reload_failed 1 while the rule source's latest update failed (the rules in force stay), else 0.
# TYPE leapflow_rule_reload_failed gauge
leapflow_rule_reload_failed 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "leapflow_rule_reloads_total", "leapflow_rule_reload_failed"))
	r.err = errors.New("bad file")
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(strings.Replace(want, "failed 0", "failed 1", 1)),
		"leapflow_rule_reloads_total", "leapflow_rule_reload_failed"))
	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

// TestWouldBlock: a dry-run rule's would-block count is exported.
func TestWouldBlock(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{ID: "trial", Resource: "api", Threshold: 1, DryRun: true})
	c := New(eng)
	defer c.Close()
	for range 3 {
		en, err := eng.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	want := `
# HELP leapflow_rule_would_block_total Requests a dry-run rule would have blocked (it blocks nothing).
# TYPE leapflow_rule_would_block_total counter
leapflow_rule_would_block_total{resource="api",rule="trial"} 2
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "leapflow_rule_would_block_total", "leapflow_rule_threshold"))
}

func passedOf(t *testing.T, reg *prometheus.Registry, res string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "leapflow_requests_passed_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "resource" && l.GetValue() == res {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// A Throttle request queued behind a Reject rule, cancelled after its
// second was delivered: no Prometheus counter goes down.
func TestCountersNeverDecreaseOnALateCancel(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	sleeping := make(chan struct{}, 1)
	eng, err := flow.New(flow.WithClock(clock), flow.WithSleep(func(ctx context.Context, d time.Duration) error {
		sleeping <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: "qps", Resource: "api", Threshold: 100},
		{ID: "pace", Resource: "api", Behavior: flow.Throttle, Threshold: 1, MaxQueueing: 10 * time.Second},
	}))
	c := New(eng)
	defer eng.Feed().Close()
	defer c.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	clock.Set(11*time.Second + 100*time.Millisecond)
	en, err := eng.Entry("api") // no wait
	require.NoError(t, err)
	en.Exit(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := eng.Entry("api", flow.WithContext(ctx)) // queued 1 s
		done <- err
	}()
	<-sleeping
	clock.Set(14 * time.Second)
	eng.Feed().Poll()
	before := passedOf(t, reg, "api")
	require.Equal(t, 2.0, before, "second 11: both passes")
	cancel()
	require.Error(t, <-done)
	clock.Set(16 * time.Second)
	eng.Feed().Poll()
	after := passedOf(t, reg, "api")
	require.GreaterOrEqual(t, after, before, "a counter must never decrease across scrapes")
}

// Resource names are arbitrary bytes (stat only checks the length; an
// httpflow.WithResource may use request paths): one that is not valid UTF-8
// does not fail the scrape: Gather succeeds with every resource in it.
func TestInvalidUTF8ResourceNameIsExported(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock, flow.Rule{Resource: "ok", Threshold: 100})
	c := New(eng)
	defer c.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	clock.Set(11*time.Second + time.Millisecond)
	for _, res := range []string{"bad\xff", "ok"} {
		en, err := eng.Entry(res)
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Set(13 * time.Second)
	eng.Feed().Poll()
	_, err := reg.Gather()
	require.NoError(t, err, "one hostile name must not fail the whole scrape")
}

// TestUnreachedRules: a rule whose resource sees no request while
// requests go to http:unmatched is exported as unreached; once its
// resource counts one, it is not.
func TestUnreachedRules(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{ID: "items", Resource: "GET /items/{id}", Threshold: 10})
	c := New(eng)
	defer c.Close()
	en, err := eng.Entry("http" + flow.CatchAllSuffix)
	require.NoError(t, err)
	en.Exit(nil)
	clock.Set(11 * time.Second)
	want := `
# HELP leapflow_rule_unreached 1 for a rule that cannot take effect as named: its resource saw no request while requests went to a catch-all resource such as http:unmatched (flow.Engine.Unreached).
# TYPE leapflow_rule_unreached gauge
leapflow_rule_unreached{resource="GET /items/{id}",rule="items"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "leapflow_rule_unreached"))
	en, err = eng.Entry("GET /items/{id}")
	require.NoError(t, err)
	en.Exit(nil)
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(""), "leapflow_rule_unreached"))
}

// TestEveryPassReachesTheCollector: a collector made in the middle of a
// second, on a resource a rule made before it, counts every pass from the
// first request to the feed's Close.
func TestEveryPassReachesTheCollector(t *testing.T) {
	clock := stattest.NewClock(5*time.Second + 300*time.Millisecond)
	eng := engine(t, clock, flow.Rule{Resource: "api", Threshold: 1000})
	c := New(eng)
	defer c.Close()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	want := 0.0
	for i, at := range []time.Duration{300, 700, 1200, 2600, 3900} {
		clock.Set(5*time.Second + at*time.Millisecond)
		for range i + 1 {
			en, err := eng.Entry("api")
			require.NoError(t, err)
			en.Exit(nil)
			want++
		}
		eng.Feed().Poll()
	}
	eng.Feed().Close()
	assert.Equal(t, want, passedOf(t, reg, "api"))
}

// A circuit breaker's state is a gauge and its transitions a counter by
// the state it went into; two breakers without IDs on one resource share
// their name: the state that refuses most, the transitions summed. A
// breaker's threshold is not a rule threshold.
func TestBreakerStateAndTransitions(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	eng := engine(t, clock,
		flow.Rule{ID: "dep", Resource: "dep", Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: time.Second},
		flow.Rule{Resource: "pair", Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: time.Second},
		flow.Rule{Resource: "pair", Breaker: flow.SlowRatio, MaxRT: time.Second, Threshold: 0.5, MinRequests: 5, RetryTimeout: time.Second})
	c := New(eng)
	defer c.Close()
	for _, res := range []string{"dep", "pair"} {
		en, err := eng.Entry(res)
		require.NoError(t, err)
		en.Exit(errors.New("down")) // opens dep, and pair's ErrorCount breaker
	}
	clock.Advance(time.Second)
	en, err := eng.Entry("dep")
	require.NoError(t, err, "the probe")
	en.Exit(nil)
	want := `
# HELP leapflow_breaker_state A circuit breaker's state: 0 closed, 1 open, 2 half-open (flow.BreakerState).
# TYPE leapflow_breaker_state gauge
leapflow_breaker_state{resource="dep",rule="dep"} 0
leapflow_breaker_state{resource="pair",rule="pair"} 1
# HELP leapflow_breaker_transitions_total A circuit breaker's changes of state, by the state it went into (closed, open, half_open), since its rule was loaded.
# TYPE leapflow_breaker_transitions_total counter
leapflow_breaker_transitions_total{resource="dep",rule="dep",to="closed"} 1
leapflow_breaker_transitions_total{resource="dep",rule="dep",to="half_open"} 1
leapflow_breaker_transitions_total{resource="dep",rule="dep",to="open"} 1
leapflow_breaker_transitions_total{resource="pair",rule="pair",to="closed"} 0
leapflow_breaker_transitions_total{resource="pair",rule="pair",to="half_open"} 0
leapflow_breaker_transitions_total{resource="pair",rule="pair",to="open"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "leapflow_breaker_state", "leapflow_breaker_transitions_total", "leapflow_rule_threshold"))
}

// cpuAt is a CPU reading a test sets.
type cpuAt float64

func (c cpuAt) CPUUsage() float64 { return float64(c) }

// A resource with system rules shows the CPU reading, the BBR estimate and
// whether its SystemBBR rule sheds.
func TestSystemRulesShowCPUAndTheBBREstimate(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	eng, err := flow.New(flow.WithClock(clock), flow.WithCPU(cpuAt(0.9)))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "inbound", System: flow.SystemBBR, Threshold: 0.8}}))
	t.Cleanup(eng.Feed().Close)
	c := New(eng)
	defer c.Close()
	// 4 of 20 ms each: 200 completions a second in a 250 ms bucket x 20 ms.
	for range 10 {
		var held []flow.Entry
		for range 4 {
			en, err := eng.Entry("inbound")
			require.NoError(t, err)
			held = append(held, en)
		}
		clock.Advance(20 * time.Millisecond)
		for _, en := range held {
			en.Exit(nil)
		}
	}
	want := `
# HELP leapflow_system_bbr_limit The BBR estimate of how many requests may be in flight on a resource with system rules: its most completions per second times its least RT, at least 1.
# TYPE leapflow_system_bbr_limit gauge
leapflow_system_bbr_limit{resource="inbound"} 4
# HELP leapflow_system_cpu_usage The CPU usage a resource's system rules last read, in [0, 1] (flow.WithCPU).
# TYPE leapflow_system_cpu_usage gauge
leapflow_system_cpu_usage{resource="inbound"} 0.9
# HELP leapflow_system_shedding 1 while a resource's SystemBBR rule checks requests (its CPU usage over the threshold, or in the last second), else 0.
# TYPE leapflow_system_shedding gauge
leapflow_system_shedding{resource="inbound"} 1
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "leapflow_system_cpu_usage", "leapflow_system_bbr_limit", "leapflow_system_shedding"))
}

// A system rule's threshold is a CPU usage, not a QPS: it is not in
// leapflow_rule_threshold, and the resource's QPS rule shows as it is.
func TestSystemRulesAreNoRuleThreshold(t *testing.T) {
	eng, err := flow.New(flow.WithClock(stattest.NewClock(time.Second)), flow.WithCPU(cpuAt(0.1)))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "in", Threshold: 100},
		{Resource: "in", System: flow.SystemCPU, Threshold: 0.8},
		{Resource: "b", System: flow.SystemBBR, Threshold: 0.5},
		{Resource: "c", System: flow.SystemRT, MaxRT: time.Second}}))
	t.Cleanup(eng.Feed().Close)
	c := New(eng)
	defer c.Close()
	want := `
# HELP leapflow_rule_threshold A rule's threshold: requests per second (metric qps) or in flight (metric concurrency).
# TYPE leapflow_rule_threshold gauge
leapflow_rule_threshold{metric="qps",resource="in",rule="in"} 100
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "leapflow_rule_threshold"))
}
