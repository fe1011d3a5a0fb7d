// Package otelflow exports a leapflow engine's statistics through the
// OpenTelemetry metrics API:
//
//	exp, err := otelflow.New(eng, otel.Meter("leapflow"))
//	...
//	defer exp.Close()
//
// Counters come from the engine's completed seconds (flow.Feed), summed
// since the exporter was made: each second counted once and whole, a
// second or two after it ends, and the feed's Close delivers the seconds
// not delivered yet (the last one too). A collection reads those totals
// under a lock of the exporter's own, never the engine's hot path; gauges
// are read from the engine when collected. The core packages import
// nothing of OpenTelemetry: this package is a module of its own.
//
// The instruments have promflow's names in OpenTelemetry's form (dots, a
// unit instead of a suffix), and promflow's label names as attributes
// (resource, rule, metric, to): an OpenTelemetry Prometheus exporter shows
// promflow's names, but for the response times, a counter there
// (leapflow_request_duration_seconds_total) where promflow has a summary
// (its _sum, and leapflow_requests_completed_total for its _count):
//   - leapflow.requests.passed, .blocked, .occupied, .completed, .failed
//     (counters, {request});
//   - leapflow.request.duration (a counter, s): the sum of the completed
//     requests' response times. The engine keeps sums per bucket, no
//     histogram;
//   - leapflow.requests.inflight (an up-down counter, {request}): admitted
//     and not exited, now;
//   - leapflow.fallback.decisions, leapflow.key.evictions,
//     leapflow.keys.forgotten (counters);
//   - leapflow.rule.threshold{rule, metric} (a gauge: requests a second,
//     or in flight), leapflow.rule.would_block{rule} (a counter),
//     leapflow.rule.unreached{rule} (a gauge, 1);
//   - leapflow.breaker.state{rule} (a gauge: 0 closed, 1 open, 2
//     half-open), leapflow.breaker.transitions{rule, to} (a counter);
//   - leapflow.system.cpu_usage (a gauge, in [0, 1]),
//     leapflow.system.bbr_limit and leapflow.system.shedding (gauges);
//   - with WithReloads: leapflow.rule.reloads (a counter) and
//     leapflow.rule.reload_failed (a gauge, 1 while the latest update
//     failed).
//
// Counters never go back: what the engine counts since a rule was loaded
// or a resource registered (transitions, fallbacks, evictions, dry-run
// refusals) starts again at zero after a reload or a return, and the
// exporter adds what it had counted before; a resource the engine's
// registry lets go leaves the collection, and its counters go on from
// where they were if it comes back within about 60 collections (an hour
// at a minute's interval), from zero after.
//
// The OpenTelemetry SDK keeps at most 2,000 series an instrument by
// default and folds the rest into one overflow series: an engine with
// more resources (its cap is 10,000) needs a MeterProvider made with
// sdkmetric.WithCardinalityLimit.
package otelflow

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/ruleview"
	"github.com/leapflow/leapflow/stat"
)

// Reloader is what a rule source reports (rulefile.Sync has it).
type Reloader interface {
	Reloads() int64
	LastError() error
}

// Option configures an Exporter.
type Option func(*Exporter)

// WithReloads exports a rule source's reload count and whether its latest
// update failed.
func WithReloads(r Reloader) Option { return func(x *Exporter) { x.reloader = r } }

// totals are a resource's sums over its delivered seconds.
type totals struct {
	ruleview.Totals
	goneAt int64 // the collection that found the resource gone (0: live)
}

// Exporter observes one engine's statistics for a meter.
type Exporter struct {
	eng      *flow.Engine
	reloader Reloader
	cancel   func()
	reg      metric.Registration

	mu     sync.Mutex
	totals map[string]*totals
	// series keep the counters read from the engine monotonic, and
	// collections counts the callback's runs (see mono).
	observing   sync.Mutex
	series      map[string]*mono
	collections int64

	passed, blocked, occupied, completed, failed metric.Int64ObservableCounter
	duration                                     metric.Float64ObservableCounter
	inflight                                     metric.Int64ObservableUpDownCounter
	fallbacks, evictions, forgotten              metric.Int64ObservableCounter
	threshold                                    metric.Float64ObservableGauge
	wouldBlock                                   metric.Int64ObservableCounter
	unreached                                    metric.Int64ObservableGauge
	breakerState                                 metric.Int64ObservableGauge
	transitions                                  metric.Int64ObservableCounter
	cpu                                          metric.Float64ObservableGauge
	bbrLimit, shedding                           metric.Int64ObservableGauge
	reloads                                      metric.Int64ObservableCounter
	reloadFailed                                 metric.Int64ObservableGauge
}

// New makes the instruments on meter and observes eng's statistics for
// them. It subscribes to the engine's feed and starts it (flow.Feed.Start):
// close the feed (eng.Feed().Close()) when the engine is done with, which
// delivers its last seconds, then collect once more.
func New(eng *flow.Engine, meter metric.Meter, opts ...Option) (*Exporter, error) {
	x := &Exporter{eng: eng, totals: map[string]*totals{}, series: map[string]*mono{}}
	for _, o := range opts {
		if o != nil {
			o(x)
		}
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	fgauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	x.passed = counter("leapflow.requests.passed", "{request}", "Requests admitted.")
	x.blocked = counter("leapflow.requests.blocked", "{request}", "Requests blocked by a rule.")
	x.occupied = counter("leapflow.requests.occupied", "{request}", "Requests admitted against a future window (priority borrowing), also counted as passed.")
	x.completed = counter("leapflow.requests.completed", "{request}", "Admitted requests that exited.")
	x.failed = counter("leapflow.requests.failed", "{request}", "Admitted requests that exited with an error, also counted as completed.")
	var err error
	x.duration, err = meter.Float64ObservableCounter("leapflow.request.duration", metric.WithUnit("s"),
		metric.WithDescription("The sum of the completed requests' response times."))
	errs = append(errs, err)
	x.inflight, err = meter.Int64ObservableUpDownCounter("leapflow.requests.inflight", metric.WithUnit("{request}"),
		metric.WithDescription("Requests admitted and not exited."))
	errs = append(errs, err)
	x.fallbacks = counter("leapflow.fallback.decisions", "{request}", "Requests a global rule decided by its fallback because its token source failed.")
	x.evictions = counter("leapflow.key.evictions", "{key}", "Keys a per-key rule evicted from its table while their window held admissions.")
	x.forgotten = counter("leapflow.keys.forgotten", "{key}", "Evicted keys a per-key rule forgot while their window held admissions: seen again, they start afresh.")
	x.threshold = fgauge("leapflow.rule.threshold", "{request}", "A rule's threshold: requests per second (metric qps) or in flight (metric concurrency).")
	x.wouldBlock = counter("leapflow.rule.would_block", "{request}", "Requests a dry-run rule would have blocked (it blocks nothing).")
	x.unreached = gauge("leapflow.rule.unreached", "", "1 for a rule that cannot take effect as named: its resource saw no request while requests went to a catch-all resource (flow.Engine.Unreached).")
	x.breakerState = gauge("leapflow.breaker.state", "", "A circuit breaker's state: 0 closed, 1 open, 2 half-open.")
	x.transitions = counter("leapflow.breaker.transitions", "{transition}", "A circuit breaker's changes of state, by the state it went into, since its rule was loaded.")
	x.cpu = fgauge("leapflow.system.cpu_usage", "", "The CPU usage a resource's system rules last read, in [0, 1].")
	x.bbrLimit = gauge("leapflow.system.bbr_limit", "{request}", "The BBR estimate of how many requests may be in flight on a resource with system rules.")
	x.shedding = gauge("leapflow.system.shedding", "", "1 while a resource's SystemBBR rule checks requests, else 0.")
	observed := []metric.Observable{x.passed, x.blocked, x.occupied, x.completed, x.failed, x.duration, x.inflight,
		x.fallbacks, x.evictions, x.forgotten, x.threshold, x.wouldBlock, x.unreached, x.breakerState, x.transitions,
		x.cpu, x.bbrLimit, x.shedding}
	if x.reloader != nil {
		x.reloads = counter("leapflow.rule.reloads", "{reload}", "Rule sets a rule source applied.")
		x.reloadFailed = gauge("leapflow.rule.reload_failed", "", "1 while the rule source's latest update failed (the rules in force stay), else 0.")
		observed = append(observed, x.reloads, x.reloadFailed)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if x.reg, err = meter.RegisterCallback(x.observe, observed...); err != nil {
		return nil, err
	}
	feed := eng.Feed()
	x.cancel = feed.Subscribe(x.add)
	feed.Start()
	return x, nil
}

// Close stops observing: the callback is unregistered and the feed
// subscription cancelled (the feed goes on).
func (x *Exporter) Close() error {
	x.cancel()
	return x.reg.Unregister()
}

// add sums a delivery into the totals.
func (x *Exporter) add(batch []stat.Second) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for i := range batch {
		s := &batch[i]
		t := x.totals[s.Resource]
		if t == nil {
			t = &totals{}
			x.totals[s.Resource] = t
		}
		t.Add(s)
	}
}

// mono keeps a counter read from the engine monotonic: a count the engine
// keeps since a rule was loaded or a resource registered starts again
// from zero after a reload or a return, and a cumulative counter must
// not go back. Each series (instrument and attributes) reports what it
// read plus what it had counted before each such reset. Called under
// observe only (the SDK runs one callback at a time).
type mono struct {
	last, base int64
	seen       int64 // the collection that last saw it
}

// monotonic is raw as a series that never goes back; id names the series.
func (x *Exporter) monotonic(id string, raw int64) int64 {
	m := x.series[id]
	if m == nil {
		m = &mono{}
		x.series[id] = m
	}
	if raw < m.last {
		m.base += m.last
	}
	m.last, m.seen = raw, x.collections
	return m.base + raw
}

// forget drops the series no collection saw for an hour's worth of
// collections (a minute apart, say): bounded by what was live lately.
func (x *Exporter) forget() {
	for id, m := range x.series {
		if x.collections-m.seen > 60 {
			delete(x.series, id)
		}
	}
}

// res is the attribute set of a resource.
func res(name string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("resource", valid(name)))
}

// valid is a name as an attribute value: invalid UTF-8 becomes U+FFFD, so
// that one such name cannot fail an exporter.
func valid(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// observe is the callback: the totals, then what is read from the engine.
func (x *Exporter) observe(_ context.Context, o metric.Observer) error {
	x.observing.Lock() // two readers may collect at once
	defer x.observing.Unlock()
	x.collections++
	defer x.forget()
	if r := x.reloader; r != nil {
		o.ObserveInt64(x.reloads, x.monotonic("reloads", r.Reloads()))
		failed := int64(0)
		if r.LastError() != nil {
			failed = 1
		}
		o.ObserveInt64(x.reloadFailed, failed)
	}
	type row struct {
		name string
		t    totals
	}
	x.mu.Lock()
	rows := make([]row, 0, len(x.totals))
	for name, t := range x.totals {
		rows = append(rows, row{name, *t})
	}
	x.mu.Unlock()
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	seen := make(map[string]bool, len(rows))
	for _, r := range rows {
		snap, ok := x.eng.Snapshot(r.name)
		if !ok {
			// The registry let the resource go: so does the collection,
			// its totals kept for an hour in case it comes back (its
			// counters then go on from them).
			x.mu.Lock()
			if t := x.totals[r.name]; t.goneAt == 0 {
				t.goneAt = x.collections
			} else if x.collections-t.goneAt > 60 {
				delete(x.totals, r.name)
			}
			x.mu.Unlock()
			continue
		}
		x.mu.Lock()
		x.totals[r.name].goneAt = 0
		x.mu.Unlock()
		seen[r.name] = true
		a := res(r.name)
		o.ObserveInt64(x.passed, r.t.Pass, a)
		o.ObserveInt64(x.blocked, r.t.Block, a)
		o.ObserveInt64(x.occupied, r.t.Occupied, a)
		o.ObserveInt64(x.completed, r.t.Success, a)
		o.ObserveInt64(x.failed, r.t.Exception, a)
		o.ObserveFloat64(x.duration, r.t.RT, a)
		x.live(o, snap)
	}
	x.rules(o, seen)
	for _, b := range ruleview.Breakers(x.eng) {
		o.ObserveInt64(x.breakerState, int64(b.State), metric.WithAttributes(
			attribute.String("resource", valid(b.Resource)), attribute.String("rule", valid(b.Rule))))
		for i, n := range b.Into {
			o.ObserveInt64(x.transitions, x.monotonic("transitions\x00"+b.Resource+"\x00"+b.Rule+"\x00"+toState[i], n), metric.WithAttributes(attribute.String("resource", valid(b.Resource)),
				attribute.String("rule", valid(b.Rule)), attribute.String("to", toState[i])))
		}
	}
	for _, s := range x.eng.Systems() {
		shedding := int64(0)
		if s.Shedding {
			shedding = 1
		}
		a := res(s.Resource)
		o.ObserveFloat64(x.cpu, s.CPU, a)
		o.ObserveInt64(x.bbrLimit, s.Limit, a)
		o.ObserveInt64(x.shedding, shedding, a)
	}
	return nil
}

// live observes what is read from the engine at collection time.
func (x *Exporter) live(o metric.Observer, snap stat.Snapshot) {
	a := res(snap.Resource)
	o.ObserveInt64(x.inflight, snap.Inflight, a)
	o.ObserveInt64(x.fallbacks, x.monotonic("fallbacks\x00"+snap.Resource, snap.Fallbacks), a)
	o.ObserveInt64(x.evictions, x.monotonic("evictions\x00"+snap.Resource, snap.KeyEvictions), a)
	o.ObserveInt64(x.forgotten, x.monotonic("forgotten\x00"+snap.Resource, snap.KeysForgotten), a)
}

// rules observes each rule's threshold (rules without IDs on one resource
// share a name: the strictest), what each dry-run rule would have blocked
// (summed by name) and the rules that cannot take effect as named; a
// resource with rules and no delivered second yet is observed live too.
func (x *Exporter) rules(o metric.Observer, seen map[string]bool) {
	series := func(s ruleview.Series, more ...attribute.KeyValue) metric.MeasurementOption {
		return metric.WithAttributes(append([]attribute.KeyValue{attribute.String("resource", valid(s.Resource)),
			attribute.String("rule", valid(s.Rule))}, more...)...)
	}
	for _, w := range ruleview.WouldBlock(x.eng) {
		o.ObserveInt64(x.wouldBlock, x.monotonic("would_block\x00"+w.Resource+"\x00"+w.Rule, w.N), series(w.Series))
	}
	for _, th := range ruleview.Thresholds(x.eng) {
		o.ObserveFloat64(x.threshold, th.Value, series(th.Series, attribute.String("metric", th.Metric)))
		if !seen[th.Resource] {
			seen[th.Resource] = true
			if snap, ok := x.eng.Snapshot(th.Resource); ok {
				x.live(o, snap)
			}
		}
	}
	for _, u := range ruleview.Unreached(x.eng) {
		o.ObserveInt64(x.unreached, 1, series(u))
	}
}

// toState names the states a breaker goes into, by flow.BreakerState.
var toState = [3]string{flow.BreakerClosed: "closed", flow.BreakerOpen: "open", flow.BreakerHalfOpen: "half_open"}
