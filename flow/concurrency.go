package flow

import "go.uber.org/atomic"

// gate is a one-time barrier: open once done is set (the channel is closed
// then, for those already waiting).
type gate struct {
	done atomic.Bool
	ch   chan struct{}
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() {
	g.done.Store(true)
	close(g.ch)
}

// wait waits for the gate to open: the walk of one rule load, a pass over
// the engine's slots, so it does not take the request's context.
func (g *gate) wait() {
	if !g.done.Load() {
		<-g.ch
	}
}

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
	if g := rr.counting; g != nil {
		g.wait() // the rule is new: until what is in flight is counted
	}
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
