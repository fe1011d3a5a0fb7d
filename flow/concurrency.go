package flow

import "github.com/leapflow/leapflow/stat"

var concurrencyKind = kind{
	is:       func(r *Rule) bool { return r.Metric == Concurrency },
	validate: validateConcurrency,
	compile:  compileConcurrency,
	describe: func(*Rule) string { return " in flight" },
}

// compileConcurrency keeps the resource's smallest Concurrency limit.
func compileConcurrency(c *compiling) {
	limit := int64(c.r.Threshold) // at most MaxThreshold: no overflow
	if rr := c.rr; rr.concLimit < 0 || limit < rr.concLimit {
		rr.concLimit, rr.concBE = limit, newBlockError(c.r, ReasonConcurrency)
	}
}

// takeConcurrency counts the request in flight against the resource's
// Concurrency limit.
func (rr *resourceRules) takeConcurrency(h *held, now, n int64, rf *refusal) bool {
	node := rr.node
	seen, ok := node.AcquireConcurrency(n, rr.concLimit)
	if !ok {
		*rf = refusal{rr.concBE, float64(seen), unknownRoom}
		return false
	}
	h.conc = true
	// The second's most in flight (stat.Second.MaxConcurrency): one load
	// of the bucket's maximum, a store only when it rises.
	second(node).RecordConcurrency(now, seen)
	return true
}

// validateConcurrency checks what a Concurrency rule may combine with.
func validateConcurrency(r *Rule, i int) error {
	if r.Metric != Concurrency {
		return nil
	}
	switch {
	case r.Behavior != Reject:
		return r.errorf(i, "Behavior", r.Behavior, "must be Reject for a Concurrency rule")
	case r.StatInterval != 0:
		return r.errorf(i, "StatInterval", r.StatInterval, "must be 0 for a Concurrency rule")
	case r.Global:
		return r.errorf(i, "Global", r.Global, "is not supported for Concurrency rules")
	}
	return nil
}

// adopt counts, in the concurrency of each resource that next gives a
// Concurrency rule and old did not, the requests in flight there that no
// rule counted (the node's Inflight gauge: passes minus completions), so
// that the new rule sees them; their Exits end the count (see
// Entry.Exit). It runs after next is published: a request admitted under
// next counts itself. A request that was admitted under old at that
// instant, its pass not yet counted, is missed until it exits.
func (e *Engine) adopt(old, next *ruleSet) {
	for name, rr := range next.byResource {
		if was := old.byResource[name]; rr.concLimit < 0 || (was != nil && was.concLimit >= 0 && was.node == rr.node) {
			continue
		}
		// Counted before the node holds any adopted: an Exit that finds
		// e.adopting at 0 completed before the gauge was read.
		e.adopting.Inc()
		if added, first := e.pins.Adopt(rr.node); added == 0 || !first {
			e.adopting.Dec()
		}
	}
}

// releaseAdopted ends, for the Exit of n requests on node that no rule
// counted, as many of node's adopted requests.
func (e *Engine) releaseAdopted(node *stat.Node, n int64) {
	if e.pins.ReleaseAdopted(node, n) {
		e.adopting.Dec()
	}
}
