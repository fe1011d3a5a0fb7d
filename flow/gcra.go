package flow

import (
	"fmt"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/gcra"
)

// gcraRule is a GCRA rule in a rule set: a limiter on its bucket (which
// is kept across reloads; see package gcra). The limiter comes first, so
// take passes the rule's own pointer on.
type gcraRule struct {
	l  gcra.Limiter
	be *BlockError
}

// newGCRARule is r's rule on bucket c: Threshold 0 refuses everything.
func newGCRARule(c *gcra.Cell, r *Rule) gcraRule {
	return gcraRule{l: gcra.New(c, r.Threshold, int64(r.Burst)), be: newBlockError(r, ReasonFlow)}
}

// take takes n tokens at now if they are there within maxWait, and
// returns how long the caller waits for them and the arrival time it set
// (its token for give); refused, it reports when they would be there (the
// wait, -1 when never: more than Burst) and how long until the bucket is
// full again.
func (r *gcraRule) take(now, n, maxWait int64) (wait, tok int64, ok bool, rm room) {
	wait, tok, ok, rm.retry, rm.reset = r.l.Take(now, n, maxWait)
	return
}

// takeOn is take by a request on P p: from p's lane of the bucket while
// the bucket is contended (see gcra.Cell).
func (r *gcraRule) takeOn(p int, now, n, maxWait int64) (wait, tok int64, ok bool, rm room) {
	wait, tok, ok, rm.retry, rm.reset = r.l.TakeOn(p, now, n, maxWait)
	return
}

// give gives back n tokens that take or takeOn took, setting arrival
// time tok, if no request has taken tokens since (see gcra.Limiter.Give):
// to the caller's P's lane if they came from it (a request that moved to
// another P since leaves them spent).
func (r *gcraRule) give(n, tok int64) { r.l.GiveOn(cpu.Pin(), n, tok) }

var gcraKind = kind{
	is:       func(r *Rule) bool { return r.Behavior == GCRA },
	validate: validateGCRA,
	compile:  compileGCRA,
	describe: describeRate,
}

// compileGCRA adds a local GCRA rule: its cell kept across reloads that
// keep the rule.
func compileGCRA(c *compiling) {
	c.rr.gcras = append(c.rr.gcras, newGCRARule(keepCell(c, c.r.Threshold, func(was *Rule) float64 { return was.Threshold }), c.r))
}

// keepCell is the GCRA cell of c's rule, limiting at rate: the old one if
// the rule stays the same rule, what it owes stretched to the new rate
// (rateOf is the rate the old rule limited at).
func keepCell(c *compiling, rate float64, rateOf func(was *Rule) float64) *gcra.Cell {
	return keep(c, c.old.gcras, c.next.gcras, func(g *gcra.Cell, was *Rule) (*gcra.Cell, bool) {
		g.Rescale(c.now, slower(rateOf(was), rate))
		return g, true
	}, func() *gcra.Cell { return &gcra.Cell{} })
}

// validateGCRA checks Burst on every rule, and what a GCRA rule needs.
func validateGCRA(r *Rule, i int) error {
	bad := func(field string, value any, reason string) error { return r.errorf(i, field, value, reason) }
	if r.Behavior != GCRA {
		if r.Burst != 0 {
			return bad("Burst", r.Burst, "is for GCRA rules (leave it zero otherwise)")
		}
		return nil
	}
	switch {
	case r.Burst < 1 || r.Burst > maxBurst:
		return bad("Burst", r.Burst, fmt.Sprintf("must be in [1, %d]", maxBurst))
	case r.PerKey || r.RelatedResource != "":
		return bad("Behavior", r.Behavior, "GCRA is for plain local or Global rules (not PerKey or related)")
	case r.Threshold > 0 && r.Threshold < minPacedRate:
		return bad("Threshold", r.Threshold, "must be 0 or at least 0.001 (one request per 1000 s) for GCRA")
	case r.StatInterval != defaultStatInterval:
		return bad("StatInterval", r.StatInterval, "must be 1s (or left zero) for GCRA rules, which have no window")
	case r.Threshold > 0 && float64(r.Burst)/r.Threshold > maxGCRARefill.Seconds():
		return bad("Burst", r.Burst, fmt.Sprintf("takes %.4g s to refill at Threshold %g, more than a GCRA rule allows (%v)", float64(r.Burst)/r.Threshold, r.Threshold, maxGCRARefill))
	case r.Global && r.Fallback == FallbackLocal && r.Threshold > 0 && r.Threshold*r.LocalShare < minPacedRate:
		return bad("LocalShare", r.LocalShare, fmt.Sprintf("leaves a local rate of %g/s, below 0.001 (one request per 1000 s), for a GCRA rule of Threshold %g", r.Threshold*r.LocalShare, r.Threshold))
	}
	return nil
}

// takeGCRAs takes the request's tokens from each GCRA rule, ahead within
// its wait.
func (rr *resourceRules) takeGCRAs(h *held, p int, now, wait int64, q *request, rf *refusal) (int64, bool) {
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		d, tok, ok, rm := gr.takeOn(p, now, q.n, q.wait)
		if !ok {
			*rf = refusal{gr.be, 0, rm, i}
			return wait, false
		}
		h.gcra[i] = tok
		wait = max(wait, d)
	}
	return wait, true
}

// releaseGCRAs gives back the tokens the request took (see gcraRule.give).
func (rr *resourceRules) releaseGCRAs(h *held, n int64) {
	for i := range rr.gcras {
		if h.gcra[i] != 0 {
			rr.gcras[i].give(n, h.gcra[i])
		}
	}
}

// alignGCRAs takes each GCRA rule's tokens again at t.
func (rr *resourceRules) alignGCRAs(h *held, p int, t, n int64, rf *refusal) bool {
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		if h.gcra[i] != 0 {
			gr.give(n, h.gcra[i])
			h.gcra[i] = 0
		}
		_, tok, ok, _ := gr.takeOn(p, t, n, 0)
		if !ok {
			*rf = refusal{gr.be, 0, unknownRoom, i}
			return false
		}
		h.gcra[i] = tok
	}
	return true
}
