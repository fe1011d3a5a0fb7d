package otelflow

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
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

// exporter makes an Exporter of eng on a meter read by a ManualReader.
func exporter(t *testing.T, eng *flow.Engine, opts ...Option) (*Exporter, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	x, err := New(eng, provider.Meter("leapflow"), opts...)
	require.NoError(t, err)
	return x, reader
}

// point is one data point: its kind and value.
type point struct {
	kind  string // counter, updown, gauge
	value float64
}

// collect reads every data point, by instrument name and then attributes
// ("k=v,k=v", sorted), and checks each instrument's unit is set.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]map[string]point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	out := map[string]map[string]point{}
	attrs := func(s attribute.Set) string {
		var kv []string
		for _, a := range s.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.Emit())
		}
		sort.Strings(kv)
		return strings.Join(kv, ",")
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if strings.HasPrefix(m.Name, "leapflow.requests.") {
				assert.Equal(t, "{request}", m.Unit, m.Name)
			}
			if m.Name == "leapflow.request.duration" {
				assert.Equal(t, "s", m.Unit)
			}
			pts := map[string]point{}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				kind := "updown"
				if d.IsMonotonic {
					kind = "counter"
				}
				assert.Equal(t, metricdata.CumulativeTemporality, d.Temporality, m.Name)
				for _, p := range d.DataPoints {
					pts[attrs(p.Attributes)] = point{kind, float64(p.Value)}
				}
			case metricdata.Sum[float64]:
				require.True(t, d.IsMonotonic, m.Name)
				for _, p := range d.DataPoints {
					pts[attrs(p.Attributes)] = point{"counter", p.Value}
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					pts[attrs(p.Attributes)] = point{"gauge", float64(p.Value)}
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					pts[attrs(p.Attributes)] = point{"gauge", p.Value}
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
			if len(pts) > 0 {
				out[m.Name] = pts
			}
		}
	}
	return out
}

// The counters are the completed seconds' sums, exact; the in-flight
// count and the thresholds are read when collected; each instrument is
// of its kind.
func TestExactCountsOnAFakeClock(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock,
		flow.Rule{ID: "api-qps", Resource: "api", Threshold: 3},
		flow.Rule{Resource: "api", Metric: flow.Concurrency, Threshold: 10},
		flow.Rule{Resource: "idle", Threshold: 5},
	)
	x, r := exporter(t, eng)
	defer x.Close()
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
	_, err := eng.Entry("api")
	require.ErrorIs(t, err, flow.ErrBlocked, "the window is full")
	other, err := eng.Entry("idle") // in flight when collected
	require.NoError(t, err)
	defer other.Exit(nil)
	clock.Set(13 * time.Second)
	eng.Feed().Poll()

	got := collect(t, r)
	api, idle := "resource=api", "resource=idle"
	want := map[string]map[string]point{
		"leapflow.requests.passed":    {api: {"counter", 3}, idle: {"counter", 1}},
		"leapflow.requests.blocked":   {api: {"counter", 2}, idle: {"counter", 0}},
		"leapflow.requests.occupied":  {api: {"counter", 0}, idle: {"counter", 0}},
		"leapflow.requests.completed": {api: {"counter", 3}, idle: {"counter", 0}},
		"leapflow.requests.failed":    {api: {"counter", 1}, idle: {"counter", 0}},
		"leapflow.requests.inflight":  {api: {"updown", 0}, idle: {"updown", 1}},
		"leapflow.fallback.decisions": {api: {"counter", 0}, idle: {"counter", 0}},
		"leapflow.key.evictions":      {api: {"counter", 0}, idle: {"counter", 0}},
		"leapflow.keys.forgotten":     {api: {"counter", 0}, idle: {"counter", 0}},
		"leapflow.rule.threshold": {
			"metric=qps,resource=api,rule=api-qps":     {"gauge", 3},
			"metric=concurrency,resource=api,rule=api": {"gauge", 10},
			"metric=qps,resource=idle,rule=idle":       {"gauge", 5},
		},
	}
	for name, pts := range want {
		assert.Equal(t, pts, got[name], name)
	}
	require.Contains(t, got, "leapflow.request.duration")
	assert.InDelta(t, 0.3, got["leapflow.request.duration"][api].value, 1e-9, "the three completions' 100 ms each")
}

// An exporter made in the middle of a second counts every pass, from
// the first request (in the second it was made in) to the last (in the
// second the feed's Close ends), and collections between deliveries
// never go back.
func TestNothingIsLostAtTheFirstOrTheLastSecond(t *testing.T) {
	clock := stattest.NewClock(5*time.Second + 300*time.Millisecond)
	eng := engine(t, clock, flow.Rule{Resource: "api", Threshold: 1000})
	x, r := exporter(t, eng)
	defer x.Close()
	passed := func() float64 { return collect(t, r)["leapflow.requests.passed"]["resource=api"].value }
	want, last := 0.0, 0.0
	for i, at := range []time.Duration{300, 700, 1200, 2600, 3900} {
		clock.Set(5*time.Second + at*time.Millisecond)
		for range i + 1 {
			en, err := eng.Entry("api")
			require.NoError(t, err)
			en.Exit(nil)
			want++
		}
		eng.Feed().Poll()
		now := passed()
		assert.GreaterOrEqual(t, now, last, "a counter never goes back")
		last = now
	}
	assert.Less(t, last, want, "the last second is not complete before Close")
	eng.Feed().Close()
	assert.Equal(t, want, passed())
}

// reloads is a Reloader a test sets.
type reloads struct {
	n   int64
	err error
}

func (r *reloads) Reloads() int64   { return r.n }
func (r *reloads) LastError() error { return r.err }

// A rule source's reloads, dry-run rules' would-block counts, unreached
// rules and breakers are observed as promflow exports them.
func TestReloadsDryRunsUnreachedRulesAndBreakers(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	eng := engine(t, clock,
		flow.Rule{ID: "trial", Resource: "api", Threshold: 1, DryRun: true},
		flow.Rule{ID: "items", Resource: "GET /items/{id}", Threshold: 10},
		flow.Rule{ID: "dep", Resource: "dep", Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: time.Second},
	)
	rl := &reloads{n: 3}
	x, r := exporter(t, eng, WithReloads(rl))
	defer x.Close()
	for range 3 {
		en, err := eng.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	en, err := eng.Entry("http" + flow.CatchAllSuffix)
	require.NoError(t, err)
	en.Exit(nil)
	en, err = eng.Entry("dep")
	require.NoError(t, err)
	en.Exit(errors.New("down"))     // opens the breaker
	clock.Advance(10 * time.Second) // the catch-all's requests, none to items, for long enough
	got := collect(t, r)
	assert.Equal(t, map[string]point{"": {"counter", 3}}, got["leapflow.rule.reloads"])
	assert.Equal(t, map[string]point{"": {"gauge", 0}}, got["leapflow.rule.reload_failed"])
	assert.Equal(t, map[string]point{"resource=api,rule=trial": {"counter", 2}}, got["leapflow.rule.would_block"])
	assert.Equal(t, map[string]point{"resource=GET /items/{id},rule=items": {"gauge", 1}}, got["leapflow.rule.unreached"])
	assert.Equal(t, map[string]point{"resource=dep,rule=dep": {"gauge", float64(flow.BreakerOpen)}}, got["leapflow.breaker.state"])
	assert.Equal(t, map[string]point{
		"resource=dep,rule=dep,to=closed":    {"counter", 0},
		"resource=dep,rule=dep,to=half_open": {"counter", 0},
		"resource=dep,rule=dep,to=open":      {"counter", 1},
	}, got["leapflow.breaker.transitions"])
	assert.NotContains(t, fmt.Sprint(got["leapflow.rule.threshold"]), "dep", "a breaker's threshold is no rule threshold")
	rl.err = errors.New("bad file")
	assert.Equal(t, map[string]point{"": {"gauge", 1}}, collect(t, r)["leapflow.rule.reload_failed"])
}

// A resource name that is not valid UTF-8 is observed (its bad bytes as
// U+FFFD) without failing the collection.
func TestInvalidUTF8ResourceNamesAreObserved(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock)
	x, r := exporter(t, eng)
	defer x.Close()
	clock.Set(11*time.Second + time.Millisecond)
	en, err := eng.Entry("bad\xff")
	require.NoError(t, err)
	en.Exit(nil)
	clock.Set(13 * time.Second)
	eng.Feed().Poll()
	assert.Equal(t, 1.0, collect(t, r)["leapflow.requests.passed"]["resource=bad\uFFFD"].value)
}

// Closed, an exporter observes nothing more.
func TestCloseStopsObserving(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock, flow.Rule{Resource: "api", Threshold: 5})
	x, r := exporter(t, eng)
	require.NotEmpty(t, collect(t, r))
	require.NoError(t, x.Close())
	assert.Empty(t, collect(t, r))
}

// Counters never go back: a breaker's transitions and a dry-run rule's
// refusals survive a reload that starts the engine's counts again, and a
// resource the registry let go goes on from its totals when it returns.
func TestCountersNeverGoBack(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	eng, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(2))
	require.NoError(t, err)
	t.Cleanup(eng.Feed().Close)
	dep := flow.Rule{ID: "dep", Resource: "dep", Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: time.Second}
	require.NoError(t, eng.LoadRules([]flow.Rule{dep}))
	x, r := exporter(t, eng)
	defer x.Close()
	en, err := eng.Entry("dep")
	require.NoError(t, err)
	en.Exit(errors.New("down"))
	open := func() float64 {
		return collect(t, r)["leapflow.breaker.transitions"]["resource=dep,rule=dep,to=open"].value
	}
	require.Equal(t, 1.0, open())
	dep.RetryTimeout = 2 * time.Second // a changed rule: a new breaker, its counts from zero
	require.NoError(t, eng.LoadRules([]flow.Rule{dep}))
	assert.Equal(t, 1.0, open(), "after the reload")

	passed := func(res string) float64 { return collect(t, r)["leapflow.requests.passed"]["resource="+res].value }
	clock.Set(2*time.Second + 100*time.Millisecond)
	for range 5 {
		en, err := eng.Entry("a")
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Set(4 * time.Second)
	eng.Feed().Poll()
	require.Equal(t, 5.0, passed("a"))
	// Idle a minute and more, then another: the registry (2 resources,
	// one of them dep's) lets a go; a minute on, a comes back in b's place.
	clock.Set(70 * time.Second)
	en, err = eng.Entry("b")
	require.NoError(t, err)
	en.Exit(nil)
	clock.Set(72 * time.Second)
	eng.Feed().Poll()
	got := collect(t, r)["leapflow.requests.passed"]
	assert.NotContains(t, got, "resource=a", "gone with the registry's")
	assert.Contains(t, got, "resource=b")
	clock.Set(140 * time.Second)
	en, err = eng.Entry("a")
	require.NoError(t, err)
	en.Exit(nil)
	clock.Set(142 * time.Second)
	eng.Feed().Poll()
	assert.Equal(t, 6.0, passed("a"), "back: from its totals")
}
