// Package promflow exports a leapflow engine's statistics to Prometheus:
//
//	prometheus.MustRegister(promflow.New(eng))
//
// Counters come from the engine's completed seconds (flow.Feed), summed
// since the collector was made: each second is counted once and whole, a
// second or two after it ends, and a scrape reads those totals under a
// lock of the collector's own, never the engine's hot path. Gauges (in
// flight, rule thresholds) and the fallback and eviction counters are read
// from the engine at scrape time.
//
// Metrics (namespace leapflow, label resource):
//   - leapflow_requests_passed_total, leapflow_requests_blocked_total:
//     admission decisions; leapflow_requests_occupied_total: passes
//     admitted against a future window (priority borrowing), also in
//     passed.
//   - leapflow_requests_completed_total: requests that exited;
//     leapflow_requests_failed_total: those that exited with an error
//     (exceptions), also in completed.
//   - leapflow_request_duration_seconds: a summary without quantiles, its
//     _sum the response times of the completed requests and its _count
//     their number (the engine keeps sums and minima per bucket, no
//     histogram: a histogram would cost the hot path a shared word per
//     bucket of it).
//   - leapflow_requests_inflight: admitted and not exited, now.
//   - leapflow_fallback_decisions_total: requests global rules decided by
//     their fallback; leapflow_key_evictions_total: keys a PerKey rule
//     evicted while active, and leapflow_keys_forgotten_total: evicted keys
//     it forgot while their window mattered (all since the resource was
//     registered).
//   - leapflow_rule_threshold{rule, metric}: each rule's threshold.
//   - leapflow_rule_would_block_total{rule}: what each dry-run rule
//     would have blocked (flow.Rule.DryRun).
//   - With WithReloads (a rule source's rulefile.Sync):
//     leapflow_rule_reloads_total, the rule sets applied, and
//     leapflow_rule_reload_failed, 1 while the latest update failed (the
//     rules in force are older than the source).
//
// Cardinality is bounded by the engine's registry cap (flow.WithMaxResources,
// default 10,000 resources): a resource the registry lets go (idle a
// minute, to make room) leaves the scrape, and starts again from zero if it
// comes back (a counter reset, which rate() handles).
package promflow

import (
	"sort"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/ruleview"
	"github.com/leapflow/leapflow/stat"
)

// Collector is a prometheus.Collector over one engine.
type Collector struct {
	eng    *flow.Engine
	cancel func()

	mu     sync.Mutex
	totals map[string]*ruleview.Totals

	passed, blocked, occupied, completed, failed *prometheus.Desc
	duration, inflight, fallbacks, evictions     *prometheus.Desc
	forgotten                                    *prometheus.Desc
	threshold                                    *prometheus.Desc
	reloads, reloadFailed, wouldBlock            *prometheus.Desc
	unreached                                    *prometheus.Desc
	breakerState, breakerTransitions             *prometheus.Desc
	systemCPU, systemLimit, systemShedding       *prometheus.Desc
	reloader                                     Reloader
}

// Reloader is what a rule source reports (rulefile.Sync has it).
type Reloader interface {
	Reloads() int64
	LastError() error
}

// Option configures a Collector.
type Option func(*Collector)

// WithReloads exports a rule source's reload count and whether its latest
// update failed.
func WithReloads(r Reloader) Option { return func(c *Collector) { c.reloader = r } }

// New returns a collector of eng's statistics. It subscribes to the
// engine's feed and starts it (flow.Feed.Start): close the feed
// (eng.Feed().Close()) when the engine is done with, to stop its
// goroutine.
func New(eng *flow.Engine, opts ...Option) *Collector {
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("leapflow_"+name, help, append([]string{"resource"}, labels...), nil)
	}
	c := &Collector{
		eng:          eng,
		totals:       map[string]*ruleview.Totals{},
		passed:       desc("requests_passed_total", "Requests admitted."),
		blocked:      desc("requests_blocked_total", "Requests blocked by a rule."),
		occupied:     desc("requests_occupied_total", "Requests admitted against a future window (priority borrowing), also counted as passed."),
		completed:    desc("requests_completed_total", "Admitted requests that exited."),
		failed:       desc("requests_failed_total", "Admitted requests that exited with an error, also counted as completed."),
		duration:     desc("request_duration_seconds", "Response times of the completed requests."),
		inflight:     desc("requests_inflight", "Requests admitted and not exited."),
		fallbacks:    desc("fallback_decisions_total", "Requests a global rule decided by its fallback because its token source failed."),
		evictions:    desc("key_evictions_total", "Keys a per-key rule evicted from its table while their window held admissions."),
		forgotten:    desc("keys_forgotten_total", "Evicted keys a per-key rule forgot while their window held admissions: seen again, they start afresh."),
		threshold:    desc("rule_threshold", "A rule's threshold: requests per second (metric qps) or in flight (metric concurrency).", "rule", "metric"),
		wouldBlock:   desc("rule_would_block_total", "Requests a dry-run rule would have blocked (it blocks nothing).", "rule"),
		unreached:    desc("rule_unreached", "1 for a rule that cannot take effect as named: its resource saw no request while requests went to a catch-all resource such as http:unmatched (flow.Engine.Unreached).", "rule"),
		breakerState: desc("breaker_state", "A circuit breaker's state: 0 closed, 1 open, 2 half-open (flow.BreakerState).", "rule"),
		breakerTransitions: desc("breaker_transitions_total",
			"A circuit breaker's changes of state, by the state it went into (closed, open, half_open), since its rule was loaded.", "rule", "to"),
		systemCPU: desc("system_cpu_usage", "The CPU usage a resource's system rules last read, in [0, 1] (flow.WithCPU)."),
		systemLimit: desc("system_bbr_limit",
			"The BBR estimate of how many requests may be in flight on a resource with system rules: its most completions per second times its least RT, at least 1."),
		systemShedding: desc("system_shedding", "1 while a resource's SystemBBR rule checks requests (its CPU usage over the threshold, or in the last second), else 0."),
		reloads:        prometheus.NewDesc("leapflow_rule_reloads_total", "Rule sets a rule source applied.", nil, nil),
		reloadFailed: prometheus.NewDesc("leapflow_rule_reload_failed",
			"1 while the rule source's latest update failed (the rules in force stay), else 0.", nil, nil),
	}
	for _, o := range opts {
		if o != nil {
			o(c)
		}
	}
	feed := eng.Feed()
	c.cancel = feed.Subscribe(c.add)
	feed.Start()
	return c
}

// Close stops the collector's subscription to the feed (the feed goes on).
func (c *Collector) Close() { c.cancel() }

// add sums a delivery into the totals.
func (c *Collector) add(batch []stat.Second) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range batch {
		s := &batch[i]
		t := c.totals[s.Resource]
		if t == nil {
			t = &ruleview.Totals{}
			c.totals[s.Resource] = t
		}
		t.Add(s)
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.passed, c.blocked, c.occupied, c.completed, c.failed,
		c.duration, c.inflight, c.fallbacks, c.evictions, c.forgotten, c.threshold, c.wouldBlock, c.unreached,
		c.breakerState, c.breakerTransitions, c.systemCPU, c.systemLimit, c.systemShedding} {
		ch <- d
	}
	if c.reloader != nil {
		ch <- c.reloads
		ch <- c.reloadFailed
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if r := c.reloader; r != nil {
		ch <- prometheus.MustNewConstMetric(c.reloads, prometheus.CounterValue, float64(r.Reloads()))
		failed := 0.0
		if r.LastError() != nil {
			failed = 1
		}
		ch <- prometheus.MustNewConstMetric(c.reloadFailed, prometheus.GaugeValue, failed)
	}
	type row struct {
		name string
		t    ruleview.Totals
	}
	c.mu.Lock()
	rows := make([]row, 0, len(c.totals))
	for name, t := range c.totals {
		rows = append(rows, row{name, *t})
	}
	c.mu.Unlock()
	sort.Slice(rows, func(i, j int) bool { return rows[i].name < rows[j].name })
	seen := make(map[string]bool, len(rows))
	counter := func(d *prometheus.Desc, v int64, res string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), label(res))
	}
	for _, r := range rows {
		snap, ok := c.eng.Snapshot(r.name)
		if !ok {
			// The registry let the resource go: so does the scrape.
			c.mu.Lock()
			delete(c.totals, r.name)
			c.mu.Unlock()
			continue
		}
		seen[r.name] = true
		counter(c.passed, r.t.Pass, r.name)
		counter(c.blocked, r.t.Block, r.name)
		counter(c.occupied, r.t.Occupied, r.name)
		counter(c.completed, r.t.Success, r.name)
		counter(c.failed, r.t.Exception, r.name)
		ch <- prometheus.MustNewConstSummary(c.duration, uint64(max(r.t.Success, 0)), r.t.RT, nil, label(r.name))
		c.live(ch, snap)
	}
	// Rules without IDs on one resource share a name: the strictest of
	// each (resource, name, metric) is the one shown, and dry-run counts
	// are summed.
	for _, w := range ruleview.WouldBlock(c.eng) {
		ch <- prometheus.MustNewConstMetric(c.wouldBlock, prometheus.CounterValue, float64(w.N), label(w.Resource), label(w.Rule))
	}
	for _, th := range ruleview.Thresholds(c.eng) {
		ch <- prometheus.MustNewConstMetric(c.threshold, prometheus.GaugeValue, th.Value, label(th.Resource), label(th.Rule), th.Metric)
		if !seen[th.Resource] {
			// A resource with rules and no delivered second yet.
			seen[th.Resource] = true
			if snap, ok := c.eng.Snapshot(th.Resource); ok {
				c.live(ch, snap)
			}
		}
	}
	c.unreachedRules(ch)
	c.breakers(ch)
	c.systems(ch)
}

// breakers sends each circuit breaker's state and transitions. Breakers
// without IDs on one resource share a name: their transitions are
// summed, and the state shown is the one that refuses most (open, then
// half-open).
func (c *Collector) breakers(ch chan<- prometheus.Metric) {
	to := [3]string{flow.BreakerClosed: "closed", flow.BreakerOpen: "open", flow.BreakerHalfOpen: "half_open"}
	for _, b := range ruleview.Breakers(c.eng) {
		ch <- prometheus.MustNewConstMetric(c.breakerState, prometheus.GaugeValue, float64(b.State), label(b.Resource), label(b.Rule))
		for i, n := range b.Into {
			ch <- prometheus.MustNewConstMetric(c.breakerTransitions, prometheus.CounterValue, float64(n), label(b.Resource), label(b.Rule), to[i])
		}
	}
}

// systems sends the CPU reading, the BBR estimate and whether it sheds, of
// each resource with system rules.
func (c *Collector) systems(ch chan<- prometheus.Metric) {
	for _, s := range c.eng.Systems() {
		shedding := 0.0
		if s.Shedding {
			shedding = 1
		}
		ch <- prometheus.MustNewConstMetric(c.systemCPU, prometheus.GaugeValue, s.CPU, label(s.Resource))
		ch <- prometheus.MustNewConstMetric(c.systemLimit, prometheus.GaugeValue, float64(s.Limit), label(s.Resource))
		ch <- prometheus.MustNewConstMetric(c.systemShedding, prometheus.GaugeValue, shedding, label(s.Resource))
	}
}

// unreachedRules sends a 1 for each rule that cannot take effect as
// named (rules without IDs on one resource share a name: one each).
func (c *Collector) unreachedRules(ch chan<- prometheus.Metric) {
	for _, u := range ruleview.Unreached(c.eng) {
		ch <- prometheus.MustNewConstMetric(c.unreached, prometheus.GaugeValue, 1, label(u.Resource), label(u.Rule))
	}
}

// live sends what is read from the engine at scrape time.
func (c *Collector) live(ch chan<- prometheus.Metric, snap stat.Snapshot) {
	res := label(snap.Resource)
	ch <- prometheus.MustNewConstMetric(c.inflight, prometheus.GaugeValue, float64(snap.Inflight), res)
	ch <- prometheus.MustNewConstMetric(c.fallbacks, prometheus.CounterValue, float64(snap.Fallbacks), res)
	ch <- prometheus.MustNewConstMetric(c.evictions, prometheus.CounterValue, float64(snap.KeyEvictions), res)
	ch <- prometheus.MustNewConstMetric(c.forgotten, prometheus.CounterValue, float64(snap.KeysForgotten), res)
}

// label is a name as a label value: label values must be UTF-8, and one
// name that is not must not fail the whole scrape (its bad bytes become
// U+FFFD; two such names could then share a label).
func label(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
