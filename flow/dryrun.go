package flow

import (
	"time"

	"github.com/leapflow/leapflow/internal/window"

	"go.uber.org/atomic"
)

// shadow is a dry-run rule's state, kept across reloads that keep the
// rule: its own window, and what it would have blocked.
type shadow struct {
	w       *window.Window
	blocked atomic.Int64
}

// shadowRule is a dry-run rule in a rule set.
type shadowRule struct {
	s     *shadow
	limit int64
	rule  *Rule
}

// addShadow adds c's dry-run rule: its window kept while its interval is,
// what it would have blocked kept while it is the same rule.
func addShadow(c *compiling) {
	r := c.r
	fresh := func() *shadow {
		w, err := window.NewWindow(c.e.buckets(r.StatInterval), r.StatInterval)
		if err != nil {
			panic(err) // validated
		}
		return &shadow{w: w}
	}
	s := keep(c, c.old.shadows, c.next.shadows, func(s *shadow, was *Rule) (*shadow, bool) {
		if was.StatInterval == r.StatInterval {
			return s, true
		}
		ns := fresh()
		ns.blocked.Store(s.blocked.Load())
		return ns, true
	}, fresh)
	c.rr.shadows = append(c.rr.shadows, shadowRule{s: s, limit: perWindow(r.Threshold, r.StatInterval), rule: r})
}

// shade checks an admitted request against the resource's dry-run rules,
// each in its own window as if it were in force (a request that may wait
// may borrow from a later bucket, as a rule in force lets it: borrow is
// its wait then), counting what they would have blocked.
func shade(rr *resourceRules, p int, now, n int64, borrow time.Duration) {
	for i := range rr.shadows {
		sr := &rr.shadows[i]
		if _, ok := sr.s.w.AdmitOn(p, now, n, sr.limit); ok {
			continue
		}
		if borrow > 0 {
			if _, ok := sr.s.w.Borrow(now, n, sr.limit, borrow); ok {
				continue
			}
		}
		sr.s.blocked.Add(n)
	}
}

// DryRun is what a dry-run rule would have blocked.
type DryRun struct {
	Rule Rule
	// WouldBlock counts the requests it would have blocked since it was
	// loaded (kept by reloads that keep the rule: see LoadRules).
	WouldBlock int64
}

// DryRuns returns the dry-run rules in force, in load order, with what
// each would have blocked.
func (e *Engine) DryRuns() []DryRun {
	set := e.ruleSet()
	var out []DryRun
	counted := map[*shadow]bool{}
	for i := range set.rules {
		r := &set.rules[i]
		if !r.DryRun {
			continue
		}
		for _, sr := range set.byResource[r.Resource].shadows {
			if sr.rule == r && !counted[sr.s] {
				counted[sr.s] = true
				out = append(out, DryRun{Rule: *r, WouldBlock: sr.s.blocked.Load()})
			}
		}
	}
	return out
}

var dryRunKind = kind{
	is:       func(r *Rule) bool { return r.DryRun },
	validate: validateDryRun,
	compile:  addShadow,
	describe: func(r *Rule) string { return describeRate(r) + " (dry run)" },
}

// validateDryRun checks that a dry-run rule is one the shadow window can
// run.
func validateDryRun(r *Rule, i int) error {
	if r.DryRun && (r.Metric != QPS || r.Behavior != Reject || r.PerKey || r.Global || r.RelatedResource != "") {
		return r.errorf(i, "DryRun", r.DryRun, "is for QPS rules with Behavior Reject on their own resource's rate (not PerKey, Global or related)")
	}
	return nil
}
