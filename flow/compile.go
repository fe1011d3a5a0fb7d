package flow

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/gcra"
	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/internal/pace"
	"github.com/leapflow/leapflow/internal/slots"
	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/internal/warmup"
	"github.com/leapflow/leapflow/internal/window"
)

// ruleSet is an immutable compiled rule set, swapped in whole.
type ruleSet struct {
	rules      []Rule
	byResource map[string]*resourceRules
	// states holds shaping state by rule, so a reload that keeps a rule
	// keeps its warm-up tokens and throttle timeline.
	warm   map[ruleKey]*warmup.Bucket
	pacers map[ruleKey]*pace.Pacer
	locals map[ruleKey]*window.Window
	// tables holds per-key rules' keys, kept across reloads.
	tables map[tableID]*keytable.Table
	// shadows holds dry-run rules' windows and counts.
	shadows map[ruleKey]*shadow
	// gcras holds GCRA rules' arrival times (for a Global GCRA rule, its
	// local fallback's).
	gcras map[ruleKey]*gcra.Cell
}

// ruleKey identifies a rule's state across reloads: the rule (every field
// of it, printed: a Rule with Keys is not comparable), and which of the
// identical copies of it in the set it is (two identical Throttle rules are
// two timelines, and stay two when loaded again).
type ruleKey struct {
	rule string
	copy int
}

// fingerprint is a rule's every field, for ruleKey.
func fingerprint(r *Rule) string { return fmt.Sprintf("%#v", *r) }

// site is what the slot an Entry carries leads back to: the engine, and
// for a refusal by a resource's single window, the rules that refused.
type site struct {
	e  *Engine
	rr *resourceRules
	// be is the rule a refusal leads back to (see Entry.Refusal).
	be *BlockError
}

// resourceRules is everything Entry needs for one resource with rules.
type resourceRules struct {
	// single is set when the resource's only rules are Reject QPS rules on
	// its second window: Entry then takes a short path, reading the window,
	// limit and error copied here (no further pointer to chase), first in
	// the struct so that the short path reads one cache line of it.
	single      *window.Window
	singleLimit int64
	singleBE    *BlockError
	// singleApart is set when single is not the node's second window (a
	// span-exact rule's): passes and blocks are counted on the node too.
	singleApart bool
	// refusal is what the Entry of a request single refused carries, to
	// lead back to these rules when its retry time is read (site: e and
	// these rules).
	refusal *slots.Slot[site]
	site    site
	// singleKey is set when the resource's only rule is one PerKey Reject
	// QPS rule, singleGCRA when it is one GCRA rule: Entry then takes a
	// short path too.
	singleKey  *keyRule
	singleGCRA *gcraRule
	node       *stats.Node
	concLimit  int64 // -1: no concurrency rule
	concBE     *BlockError
	// adopting is set, from before the rule set is published until
	// Engine.adopt has counted what is in flight, on a resource that gains
	// a Concurrency rule: its requests wait for the count.
	adopting   atomic.Bool
	groups     []windowGroup
	countsNode bool // a group admits on the node's second window
	paced      []pacedRule
	related    []relatedRule
	globals    []globalRule
	// keyed are the PerKey QPS rules, keyConc the PerKey Concurrency rule
	// (t nil: none).
	keyed   []keyRule
	keyConc keyRule
	// keyedGlobal is set when a global rule is PerKey.
	keyedGlobal bool
	// rateRules counts the window groups, GCRA, Throttle and PerKey QPS
	// rules that a request takes from: when more than one does and one
	// makes it wait, check aligns them to the instant it goes.
	rateRules int
	// rules counts the resource's rules: a blocked request is told when
	// to retry only when one rule decides (with several, the one that
	// blocked first cannot speak for the others).
	rules int
	// shadows are the resource's dry-run rules; gcras its GCRA rules.
	shadows []shadowRule
	gcras   []gcraRule
	// policy is the quota of the resource's strictest QPS rule of its own
	// (the least per second; not a related-resource rule, which limits
	// another resource's rate), for Engine.Policy; nil: none.
	policy *BlockError
}

// hasKeyed reports whether the resource has PerKey rules.
func (rr *resourceRules) hasKeyed() bool {
	return len(rr.keyed) > 0 || rr.keyConc.t != nil || rr.keyedGlobal
}

// A resource's throttling and global rules are held on the stack during
// Entry, so their number per resource is bounded.
const (
	maxPacedRules  = 4
	maxGlobalRules = 4
	maxGCRARules   = 4
)

// compiling is what a kind's compile step gets for one rule: the set being
// built and the one it replaces (whose state a kept rule keeps), the rule,
// its resource's rules, and what identifies its state across reloads.
type compiling struct {
	e         *Engine
	next, old *ruleSet
	r         *Rule
	rr        *resourceRules
	k         ruleKey     // the rule's state
	id        tableID     // a PerKey rule's key table
	bound     BoundSource // a Global rule's bound token source, if any
	related   *stats.Node // a related-resource rule's other resource
}

// compile builds the rule set of valid rules norm, whose resources' nodes
// are in nodes. It cannot fail: everything that could was checked first.
func compile(e *Engine, norm []Rule, nodes map[string]*stats.Node, bounds []BoundSource, old *ruleSet) *ruleSet {
	next := &ruleSet{
		rules:      norm,
		byResource: map[string]*resourceRules{},
		warm:       map[ruleKey]*warmup.Bucket{},
		pacers:     map[ruleKey]*pace.Pacer{},
		locals:     map[ruleKey]*window.Window{},
		tables:     map[tableID]*keytable.Table{},
		shadows:    map[ruleKey]*shadow{},
		gcras:      map[ruleKey]*gcra.Cell{},
	}
	copies := map[string]int{}
	tableCopies := map[tableID]int{}
	for i := range norm {
		fp := fingerprint(&norm[i])
		r := &norm[i]
		c := compiling{e: e, next: next, old: old, r: r, k: ruleKey{fp, copies[fp]}, bound: bounds[i]}
		copies[fp]++
		c.rr = e.resourceRules(next, r, nodes)
		if !r.DryRun {
			c.rr.rules++
			if r.Metric == QPS && r.RelatedResource == "" && (c.rr.policy == nil || r.Threshold < c.rr.policy.Rule.Threshold) {
				c.rr.policy = newBlockError(r, ReasonFlow)
			}
		}
		if r.PerKey {
			c.id = tableID{resource: r.Resource, id: r.ID, metric: r.Metric, behavior: r.Behavior, interval: r.StatInterval,
				maxQueue: r.MaxQueueing, global: r.Global}
			c.id.copy = tableCopies[c.id]
			tableCopies[c.id]++
		}
		if r.RelatedResource != "" {
			c.related = nodes[r.RelatedResource]
		}
		kindOf(r).compile(&c)
	}
	for _, rr := range next.byResource {
		rr.rateRules = len(rr.groups) + len(rr.gcras) + len(rr.paced) + len(rr.keyed)
		e.shortPaths(rr)
	}
	return next
}

// resourceRules returns r's resource's rules in the set being built,
// adding them if needed.
func (e *Engine) resourceRules(next *ruleSet, r *Rule, nodes map[string]*stats.Node) *resourceRules {
	rr := next.byResource[r.Resource]
	if rr == nil {
		rr = &resourceRules{node: nodes[r.Resource], concLimit: -1}
		next.byResource[r.Resource] = rr
	}
	return rr
}

// perWindow is a per-second threshold as a count per window of interval.
// Thresholds are at most maxThreshold and intervals at most an hour, so the
// count stays far below the counters' headroom.
func perWindow(threshold float64, interval time.Duration) int64 {
	return int64(math.Floor(threshold * interval.Seconds()))
}

func reuse[V any](old map[ruleKey]V, k ruleKey, make func() V) V {
	if v, ok := old[k]; ok {
		return v
	}
	return make()
}

// shortPaths chooses the short paths Entry takes for rr's shape, if any:
// the one place that does (the general checker decides the same; see
// TestShortPathsDecideAsTheGeneralChecker, which turns them off here).
//   - single: one Reject window and nothing else (enterSingle);
//   - singleKey: one PerKey QPS Reject rule and nothing else;
//   - singleGCRA: one GCRA rule and nothing else.
func (e *Engine) shortPaths(rr *resourceRules) {
	if e.generalOnly {
		return
	}
	if len(rr.groups) == 1 && len(rr.groups[0].warm) == 0 && rr.concLimit < 0 &&
		len(rr.globals) == 0 && len(rr.related) == 0 && len(rr.paced) == 0 && !rr.hasKeyed() && len(rr.shadows) == 0 &&
		len(rr.gcras) == 0 {
		g := &rr.groups[0]
		rr.single, rr.singleLimit, rr.singleBE = g.w, g.static, g.staticBE
		rr.singleApart = !rr.countsNode
		rr.site = site{e: e, rr: rr, be: rr.singleBE}
		rr.refusal = slots.Sentinel(&rr.site)
	}
	if len(rr.groups) == 0 && rr.concLimit < 0 && len(rr.globals) == 0 && len(rr.related) == 0 && len(rr.paced) == 0 &&
		rr.keyConc.t == nil && len(rr.keyed) == 1 && rr.keyed[0].t.Kind() == keytable.Window && len(rr.shadows) == 0 && len(rr.gcras) == 0 {
		rr.singleKey = &rr.keyed[0]
	}
	if len(rr.gcras) == 1 && rr.rules == 1 && len(rr.shadows) == 0 {
		rr.singleGCRA = &rr.gcras[0]
	}
}

// second is node's second window, as flow counts on it.
func second(node *stats.Node) *window.Window { return node.Second() }
