package rls

import (
	"fmt"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
)

// The day limits flow can hold: a day limit is a GCRA bucket of
// requests_per_unit tokens refilling at requests_per_unit per 24 h, and
// flow's GCRA buckets hold at most 2^30 tokens and refill at least one
// per 1000 s.
const (
	maxBurst    = 1 << 30
	minDayLimit = 87
)

// Rules returns the flow rules that enforce c: one per limit, on a
// resource named after the limit's descriptor path (the domain, then each
// entry as key=value, or key alone for a wildcard, joined by '/').
//
//   - second, minute and hour limits are window rules (Reject) of that
//     StatInterval and requests_per_unit per window: sliding windows, so no
//     window of the unit admits more than the limit (span-exact with
//     Options.SpanExact where flow allows it);
//   - a day limit is a GCRA rule of requests_per_unit per 24 h with a
//     bucket of requests_per_unit: steady, it admits the limit per day, and
//     in any span of length L at most requests_per_unit x (1 + L/24h) (flow
//     counts windows of at most an hour; a GCRA bucket needs no window). A
//     day limit is from 87 (flow's slowest GCRA rate, one per 1000 s) to
//     2^30, and not per distinct value (flow has no per-key GCRA);
//   - a limit under a wildcard (an entry key without a value, one limit
//     per distinct value) is PerKey: the request's values at the
//     wildcards are its key;
//   - shadow_mode is DryRun: the rule counts what it would refuse, the
//     answer is OK.
//
// With Options.Global every rule is Global, counted on the engine's token
// source (the global package on Redis), FallbackLocal with
// Options.LocalShare while the source fails.
func (c *Config) Rules(o Options) ([]flow.Rule, error) {
	rules := make([]flow.Rule, 0, len(c.limits))
	for _, n := range c.limits {
		if len(n.path) > stat.MaxNameLen {
			return nil, &ConfigError{Descriptor: n.path[:64] + "...", Msg: fmt.Sprintf("the descriptor path is longer than %d bytes", stat.MaxNameLen)}
		}
		l := n.limit
		r := flow.Rule{ID: l.Name, Resource: n.path, PerKey: n.perKey, DryRun: n.shadow}
		switch {
		case l.Unit == Day && l.RequestsPerUnit > 0:
			r.Behavior = flow.GCRA
			r.Threshold = float64(l.RequestsPerUnit) / (24 * time.Hour).Seconds()
			r.Burst = int(l.RequestsPerUnit)
		case l.Unit == Day:
			r.StatInterval = time.Hour // 0 per day: refuses everything
		default:
			r.StatInterval = l.Unit.Duration()
			r.Threshold = float64(l.RequestsPerUnit) / l.Unit.Duration().Seconds()
			r.SpanExact = o.SpanExact && !n.perKey
		}
		if n.perKey && o.MaxKeys > 0 {
			r.MaxKeys = o.MaxKeys
		}
		if o.Global {
			r.Global = true
			r.Fallback = flow.FallbackLocal
			r.LocalShare = o.LocalShare
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// Options are how a Server maps limits to rules.
type Options struct {
	// Global counts every limit on the engine's token source (several
	// replicas sharing limits through Redis).
	Global bool
	// LocalShare is the part of each limit a replica enforces alone while
	// the token source fails (FallbackLocal; default 1).
	LocalShare float64
	// SpanExact makes second, minute and hour limits that are not per
	// value hold in every continuous span of their unit (see
	// flow.Rule.SpanExact).
	SpanExact bool
	// MaxKeys is the most distinct values a per-value limit tracks (flow's
	// default when 0).
	MaxKeys int
	// Headers adds RateLimit-Policy, RateLimit and (over the limit)
	// Retry-After to each answer's response_headers_to_add.
	Headers bool
}

// checkOwnRules refuses rules of a leapflow rule file that the protocol
// cannot serve: those that count requests until they complete
// (Concurrency, PerKey Concurrency) and circuit breakers, which need each
// request's outcome. ShouldRateLimit has no completion call.
func checkOwnRules(rules []flow.Rule) error {
	for i := range rules {
		r := &rules[i]
		switch {
		case r.Metric == flow.Concurrency:
			return fmt.Errorf("rls: rules[%d] (resource %q): a Concurrency rule needs each request's completion, which the rate limit protocol does not send", i, r.Resource)
		case r.Breaker != flow.NotBreaker:
			return fmt.Errorf("rls: rules[%d] (resource %q): a circuit breaker needs each request's outcome, which the rate limit protocol does not send", i, r.Resource)
		case r.System != flow.NotSystem:
			return fmt.Errorf("rls: rules[%d] (resource %q): a System rule protects the process it runs in, not a gateway's upstream", i, r.Resource)
		}
	}
	return nil
}
