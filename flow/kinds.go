package flow

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
