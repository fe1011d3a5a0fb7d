package flow

import "fmt"

// A rule kind is everything the engine does with one kind of rule, in one
// file of its own: validate, compile, take (admit or refuse), give back,
// what it holds, retake after a wait (align), and describe. The steps that
// run when rules load go through this table; the steps that run per
// request are methods in the kind's file that check.go calls by name, so
// that the per-request loop makes no indirect call per rule.
type kind struct {
	name string
	// is reports whether r is of this kind; a rule is of the first kind
	// in kinds that says so.
	is func(r *Rule) bool
	// validate checks what the kind adds to the checks every rule gets
	// (nil: nothing); r has its defaults.
	validate func(r *Rule, i int) error
	// compile adds the rule to the set being built.
	compile func(c *compiling)
	// describe is the kind's part of a rule's description (Rule.String),
	// after its metric and threshold.
	describe func(r *Rule) string
}

// kinds lists every rule kind, in the order they are told apart: a new
// kind is one file and one line here.
var kinds = [...]*kind{
	&dryRunKind,
	&perKeyKind,
	&concurrencyKind,
	&relatedKind,
	&globalKind,
	&gcraKind,
	&pacedKind,
	&warmUpKind,
	&windowKind,
}

// kindOf returns the kind of rule r.
func kindOf(r *Rule) *kind {
	for _, k := range kinds {
		if k.is(r) {
			return k
		}
	}
	panic("flow: no kind takes the rule") // windowKind takes every rule
}

var gcraKind = kind{
	name:     "gcra",
	is:       func(r *Rule) bool { return r.Behavior == GCRA },
	validate: validateGCRA,
	compile:  compileGCRA,
	describe: describeRate,
}

// compileGCRA adds a local GCRA rule: its cell kept across reloads that
// keep the rule.
func compileGCRA(c *compiling) {
	g := reuse(c.old.gcras, c.k, func() *gcra { return &gcra{} })
	c.next.gcras[c.k] = g
	c.rr.gcras = append(c.rr.gcras, newGCRARule(g, c.r))
}

var perKeyKind = kind{
	name:     "per-key",
	is:       func(r *Rule) bool { return r.PerKey && !r.Global },
	validate: validatePerKeyKind,
	compile:  func(c *compiling) { c.e.addKeyed(c.next, c.old, c.rr, c.r, c.id) },
	describe: func(r *Rule) string {
		if r.Metric == Concurrency {
			return " in flight per key"
		}
		return describeRate(r) + " per key"
	},
}

var dryRunKind = kind{
	name:     "dry run",
	is:       func(r *Rule) bool { return r.DryRun },
	validate: validateDryRun,
	compile:  func(c *compiling) { c.e.addShadow(c.next, c.old, c.rr, c.r, c.k) },
	describe: func(r *Rule) string { return describeRate(r) + " (dry run)" },
}

// takeGCRAs takes the request's tokens from each GCRA rule, ahead within
// its wait.
func (rr *resourceRules) takeGCRAs(h *held, now, wait int64, q *request) (int64, refusal, bool) {
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		d, tok, ok, rm := gr.take(now, q.n, q.wait)
		if !ok {
			return wait, refusal{gr.be, 0, rm}, false
		}
		h.gcra[i] = tok
		wait = max(wait, d)
	}
	return wait, refusal{}, true
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
func (rr *resourceRules) alignGCRAs(h *held, t, n int64) (refusal, bool) {
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		if h.gcra[i] != 0 {
			gr.give(n, h.gcra[i])
			h.gcra[i] = 0
		}
		_, tok, ok, _ := gr.take(t, n, 0)
		if !ok {
			return refusal{gr.be, 0, unknownRoom}, false
		}
		h.gcra[i] = tok
	}
	return refusal{}, true
}

// takeKeyConcurrency counts the request in flight under its key of the
// PerKey Concurrency rule.
func (rr *resourceRules) takeKeyConcurrency(h *held, q *request) (refusal, bool) {
	st, seen, ok := rr.keyConc.acquire(q)
	if !ok {
		return refusal{rr.keyConc.blockError(q), float64(seen), unknownRoom}, false
	}
	h.kc = st
	return refusal{}, true
}

// takeKeyed admits the request under its key of each PerKey rate rule;
// a key's window moves now to its newest bucket.
func (rr *resourceRules) takeKeyed(h *held, now, wait int64, q *request) (int64, int64, refusal, bool) {
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		d, seen, rm, ok := kr.admit(q, now, &h.keys[i])
		if !ok {
			return now, wait, refusal{kr.blockError(q), seen, rm}, false
		}
		if kr.t.kind == keyWindow {
			now = max(now, h.keys[i].b*kr.t.bucketLen)
		}
		wait = max(wait, d)
	}
	return now, wait, refusal{}, true
}

// releaseKeyed gives back what the request took under its keys.
func (rr *resourceRules) releaseKeyed(h *held, n int64) {
	if h.kc != nil {
		rr.keyConc.t.release(h.kc, n)
	}
	for i := range rr.keyed {
		rr.keyed[i].undo(h.keys[i], n)
	}
}

// keyedHold reports whether every key window of the request counts it at
// instant t.
func (h *held) keyedHold(rr *resourceRules, t int64) bool {
	for i := range rr.keyed {
		if kr := &rr.keyed[i]; kr.t.kind == keyWindow && h.keys[i].st != nil && t/kr.t.bucketLen != h.keys[i].b {
			return false
		}
	}
	return true
}

// alignKeyed checks that each key window holds t already (it cannot count
// ahead of its newest bucket) and takes each key's Throttle slot again at
// t.
func (rr *resourceRules) alignKeyed(h *held, t int64, q *request) (refusal, bool) {
	n := q.n
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		if kr.t.kind == keyWindow {
			if h.keys[i].st != nil && t/kr.t.bucketLen != h.keys[i].b {
				return refusal{kr.blockError(q), 0, unknownRoom}, false
			}
			continue
		}
		kr.undo(h.keys[i], n)
		h.keys[i] = keyHeld{}
		if _, seen, _, ok := kr.admitAt(q, t, &h.keys[i]); !ok {
			return refusal{kr.blockError(q), seen, unknownRoom}, false
		}
	}
	return refusal{}, true
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
	case r.Burst < 1 || r.Burst > MaxBurst:
		return bad("Burst", r.Burst, fmt.Sprintf("must be in [1, %d]", MaxBurst))
	case r.PerKey || r.RelatedResource != "" || r.DryRun:
		return bad("Behavior", r.Behavior, "GCRA is for plain local or Global rules (not PerKey, related or DryRun)")
	case r.Threshold > 0 && r.Threshold < minPacedRate:
		return bad("Threshold", r.Threshold, "must be 0 or at least 0.001 (one request per 1000 s) for GCRA")
	case r.StatInterval != DefaultStatInterval:
		return bad("StatInterval", r.StatInterval, "must be 1s (or left zero) for GCRA rules, which have no window")
	case r.Threshold > 0 && float64(r.Burst)/r.Threshold > maxGCRARefill.Seconds():
		return bad("Burst", r.Burst, fmt.Sprintf("takes %.4g s to refill at Threshold %g, more than a GCRA rule allows (%v)", float64(r.Burst)/r.Threshold, r.Threshold, maxGCRARefill))
	case r.Global && r.Fallback == FallbackLocal && r.Threshold > 0 && r.Threshold*r.LocalShare < minPacedRate:
		return bad("LocalShare", r.LocalShare, fmt.Sprintf("leaves a local rate of %g/s, below 0.001 (one request per 1000 s), for a GCRA rule of Threshold %g", r.Threshold*r.LocalShare, r.Threshold))
	}
	return nil
}

// validatePerKeyKind checks what a PerKey rule adds.
func validatePerKeyKind(r *Rule, i int) error {
	if !r.PerKey {
		return nil
	}
	return r.validatePerKey(i)
}

// validateDryRun checks that a dry-run rule is one the shadow window can
// run.
func validateDryRun(r *Rule, i int) error {
	if r.DryRun && (r.Metric != QPS || r.Behavior != Reject || r.PerKey || r.Global || r.RelatedResource != "") {
		return r.errorf(i, "DryRun", r.DryRun, "is for QPS rules with Behavior Reject on their own resource's rate (not PerKey, Global or related)")
	}
	return nil
}
