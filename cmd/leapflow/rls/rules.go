package rls

import (
	"fmt"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
)

// maxEngineKeys is the keys an engine's PerKey rules hold in all (flow's
// default WithMaxKeys).
const maxEngineKeys = 1_000_000

// Rules returns the flow rules that enforce c: one per limit, on a
// resource named after the limit's descriptor path (the domain, then each
// entry as key=value, or key alone for a wildcard, joined by '/').
//
//   - each limit is a window rule (Reject) of StatInterval its unit (a
//     second, a minute, an hour or a day) admitting requests_per_unit per
//     window: a sliding window of the engine's buckets (4 by default; a
//     day's are 6 h), so no window of whole buckets admits more than the
//     limit, and no span of the unit more than twice it (envoyproxy/
//     ratelimit's fixed windows admit twice the limit across a boundary
//     too); with Options.SpanExact, no span of the unit admits more than
//     the limit (not for limits per value, which flow does not keep
//     span-exact);
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
	perValue := 0
	for _, n := range c.limits {
		if n.perKey {
			perValue++
		}
	}
	for _, n := range c.limits {
		if len(n.path) > stat.MaxNameLen {
			return nil, &ConfigError{Descriptor: n.path[:64] + "...", Msg: fmt.Sprintf("the descriptor path is longer than %d bytes", stat.MaxNameLen)}
		}
		l := n.limit
		// No ID from the limit's name: envoyproxy/ratelimit's names are
		// labels, which limits in two domains may share, and a rule's ID
		// names its count in Redis; the resource, the descriptor path, is
		// the limit's own.
		r := flow.Rule{Resource: n.path, PerKey: n.perKey, DryRun: n.shadow}
		r.StatInterval = l.Unit.Duration()
		r.Threshold = float64(l.RequestsPerUnit) / l.Unit.Duration().Seconds()
		r.SpanExact = o.SpanExact && !n.perKey
		if n.perKey {
			r.MaxKeys = o.MaxKeys
			if r.MaxKeys == 0 {
				// The engine's million keys (flow.WithMaxKeys) shared
				// among the limits per value, at most flow's 100,000
				// each.
				r.MaxKeys = min(100_000, maxEngineKeys/max(perValue, 1))
			}
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
