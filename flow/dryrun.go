package flow

import (
	"time"

	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/metric"

	"go.uber.org/atomic"
)

// shadow is a dry-run rule's state, kept across reloads that keep the
// rule: what it would have blocked, and, by the rule's kind, its own
// window (a QPS Reject rule) or its own node (any other kind but
// Concurrency, whose rules count there as if in force: windows, key
// tables, cells and queues of their own).
type shadow struct {
	w       *window.Window
	node    *stats.Node
	blocked atomic.Int64
}

// shadowRule is a dry-run rule in a rule set: limit on the shadow's
// window, conc on the resource's in-flight count (-1: not a Concurrency
// rule), or rr, the rule compiled as if in force on the shadow's node.
type shadowRule struct {
	s     *shadow
	limit int64
	conc  int64
	rr    *resourceRules
	rule  *Rule
}

// plainDryRun reports whether dry-run rule r is a QPS Reject rule on its
// own resource's rate: it runs in a window of its own, borrowing as a rule
// in force would.
func plainDryRun(r *Rule) bool {
	return r.Metric == QPS && r.Behavior == Reject && !r.PerKey && !r.Global && r.RelatedResource == "" && !r.SpanExact
}

// addShadow adds c's dry-run rule: its window or node kept while its
// shape is, what it would have blocked kept while it is the same rule.
func addShadow(c *compiling) {
	r := c.r
	plain := plainDryRun(r)
	fresh := func() *shadow {
		if !plain {
			// A node of its own, in no registry: the rule's state lives
			// there, apart from the resource's.
			n, err := stats.NewNode(r.Resource, stats.NodeConfig{SampleCount: c.e.sampleCount})
			if err != nil {
				panic(err) // the resource's name was validated
			}
			return &shadow{node: n}
		}
		w, err := window.NewWindow(c.e.buckets(r.StatInterval), r.StatInterval)
		if err != nil {
			panic(err) // validated
		}
		return &shadow{w: w}
	}
	s := keep(c, c.old.shadows, c.next.shadows, func(s *shadow, was *Rule) (*shadow, bool) {
		if plain == plainDryRun(was) && (!plain || was.StatInterval == r.StatInterval) {
			return s, true
		}
		ns := fresh()
		ns.blocked.Store(s.blocked.Load())
		return ns, true
	}, fresh)
	sr := shadowRule{s: s, conc: -1, rule: r}
	switch {
	case plain:
		sr.limit = perWindow(r.Threshold, r.StatInterval)
	case r.Metric == Concurrency:
		sr.conc = int64(r.Threshold)
	default:
		// The rule as if in force, on the shadow's node: compiled by its
		// kind, the rule itself (a Global one's limit is then its own:
		// see globalKey).
		inner := *r
		inner.DryRun = false
		rr := &resourceRules{node: s.node, concLimit: -1}
		ic := *c
		ic.rr = rr
		kindOf(&inner).compile(&ic)
		rr.rules = 1
		rr.rateRules = len(rr.groups) + len(rr.gcras) + len(rr.paced) + len(rr.keyed)
		sr.rr = rr
	}
	c.rr.shadows = append(c.rr.shadows, sr)
}

// shade checks an admitted request against the resource's dry-run rules,
// each as if it were in force, counting what they would have blocked:
//   - a QPS Reject rule in its own window (a request that may wait may
//     borrow from a later bucket, as a rule in force lets it: borrow is
//     its wait then);
//   - a Concurrency rule against the resource's in-flight count
//     (Snapshot's Inflight: what the resource has in flight without it);
//   - any other kind through its own checks on its own state (a Throttle
//     rule queues it up to its MaxQueueing, no further; nothing waits).
//
// ran is the instant the request goes; counted says its pass is counted
// on the node already.
func (e *Engine) shade(rr *resourceRules, p int, ran int64, q *request, counted bool) {
	n, borrow := q.n, time.Duration(q.wait)
	for i := range rr.shadows {
		sr := &rr.shadows[i]
		switch {
		case sr.conc >= 0:
			inflight := rr.node.Inflight()
			if counted {
				inflight -= n
			}
			if inflight+n > sr.conc {
				sr.s.blocked.Add(n)
			}
		case sr.rr != nil:
			sq := request{n: n, hasKey: q.hasKey, key: q.key, ctx: q.ctx, noQueue: q.noQueue}
			var h held
			if _, _, _, err := e.take(sr.rr, &h, p, ran, &sq); err != nil {
				sr.s.blocked.Add(n)
			} else if !sr.rr.countsNode {
				// Its pass on its node, as finish counts one: a warm-up
				// model reads the node's passes.
				second(sr.s.node).AddOn(p, ran, metric.Pass, n)
			}
		default:
			if _, ok := sr.s.w.AdmitOn(p, ran, n, sr.limit); ok {
				continue
			}
			if borrow > 0 {
				if _, ok := sr.s.w.Borrow(ran, n, sr.limit, borrow); ok {
					continue
				}
			}
			sr.s.blocked.Add(n)
		}
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

// dryRunKind's compile and describe are set at init: they are another
// kind's (they call kindOf, which reads the kinds).
func init() {
	dryRunKind.compile = addShadow
	dryRunKind.describe = func(r *Rule) string {
		inner := *r
		inner.DryRun = false
		return kindOf(&inner).describe(&inner) + " (dry run)"
	}
}

var dryRunKind = kind{
	is:       func(r *Rule) bool { return r.DryRun },
	validate: validateDryRun,
}

// validateDryRun checks that a dry-run rule is one a dry run can run:
// every kind but PerKey Concurrency, whose count of a key would need each
// request's Exit.
func validateDryRun(r *Rule, i int) error {
	if r.DryRun && r.PerKey && r.Metric == Concurrency {
		return r.errorf(i, "DryRun", r.DryRun, "is not for PerKey Concurrency rules (a key's count needs each request's Exit): load it in force, or dry-run a Concurrency rule on the resource")
	}
	return nil
}
