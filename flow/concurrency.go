package flow

import (
	"runtime"

	"github.com/leapflow/leapflow/internal/stats"
)

var concurrencyKind = kind{
	is:       func(r *Rule) bool { return r.Metric == Concurrency },
	validate: validateConcurrency,
	compile:  compileConcurrency,
	describe: func(*Rule) string { return " in flight" },
}

// compileConcurrency keeps the resource's smallest Concurrency limit.
func compileConcurrency(c *compiling) {
	limit := int64(c.r.Threshold) // at most maxThreshold: no overflow
	if rr := c.rr; rr.concLimit < 0 || limit < rr.concLimit {
		rr.concLimit, rr.concBE = limit, newBlockError(c.r, ReasonConcurrency)
	}
}

// takeConcurrency counts the request in flight against the resource's
// Concurrency limit.
func (rr *resourceRules) takeConcurrency(h *held, now, n int64, rf *refusal) bool {
	node := rr.node
	for rr.adopting.Load() {
		// The rule is new: what is in flight is being counted (adopt),
		// and this request would not see it. Nothing is counted yet.
		runtime.Gosched()
	}
	seen, ok := node.AcquireConcurrency(n, rr.concLimit)
	if !ok {
		*rf = refusal{rr.concBE, float64(seen), unknownRoom, 0}
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

// toAdopt returns the resources next gives a Concurrency rule that old did
// not (or gives a new node), each marked adopting: their requests under
// next wait until adopt has counted what is in flight. It runs before next
// is published.
func toAdopt(old, next *ruleSet) []*resourceRules {
	var out []*resourceRules
	for name, rr := range next.byResource {
		if was := old.byResource[name]; rr.concLimit < 0 || (was != nil && was.concLimit >= 0 && was.node == rr.node) {
			continue
		}
		rr.adopting.Store(true)
		out = append(out, rr)
	}
	return out
}

// adopt counts, in the concurrency of each resource of toAdopt, the
// requests in flight there that no rule counted (the node's Inflight
// gauge: passes minus completions), so that the new rule sees them; their
// Exits end the count (see Entry.Exit). It runs after next is published;
// a request under next waits for it before it counts anything (see
// takeConcurrency), so that it is never counted twice nor admitted
// without the count. A request that was admitted under old at that
// instant, its pass not yet counted, is missed until it exits.
func (e *Engine) adopt(rrs []*resourceRules) {
	for _, rr := range rrs {
		// Counted before the node holds any adopted: an Exit that finds
		// e.adopting at 0 completed before the gauge was read.
		e.adopting.Inc()
		if added, first := e.pins.Adopt(rr.node); added == 0 || !first {
			e.adopting.Dec()
		}
		rr.adopting.Store(false)
	}
}

// releaseAdopted ends, for the Exit of n requests on node that no rule
// counted, as many of node's adopted requests.
func (e *Engine) releaseAdopted(node *stats.Node, n int64) {
	if e.pins.ReleaseAdopted(node, n) {
		e.adopting.Dec()
	}
}
