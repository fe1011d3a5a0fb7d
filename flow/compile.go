package flow

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/breaker"
	"github.com/leapflow/leapflow/internal/gcra"
	"github.com/leapflow/leapflow/internal/hotkeys"
	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/internal/names"
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
	// since is when each resource came under rules, and what it had
	// counted then, kept across reloads that keep rules on it (see
	// Engine.Unreached).
	since map[string]ruledSince
	// The state of rules, by rule, so that a reload that keeps a rule (see
	// ruleKey) keeps its counts: warm-up tokens, throttle timelines, a
	// Global rule's local fallback window, per-key tables, dry-run windows
	// and GCRA arrival times (for a Global GCRA rule, its local
	// fallback's). Window rules count in their resource's node, which
	// outlives rule sets.
	warm    map[ruleKey]kept[*warmup.Bucket]
	pacers  map[ruleKey]kept[*pace.Pacer]
	locals  map[ruleKey]kept[*globalLocal]
	tables  map[ruleKey]kept[*keytable.Table]
	hot     map[ruleKey]kept[*hotkeys.Sketch] // PerKey rules' sampled keys
	shadows map[ruleKey]kept[*shadow]
	gcras   map[ruleKey]kept[*gcra.Cell]
	// breakers are the circuit breakers, kept while their rule is
	// unchanged.
	breakers map[ruleKey]kept[*breaker.Breaker]
	// resets are the breakers that compile retired while not closed, to
	// report once the set is in force.
	resets []BreakerChange
}

// ruleKey identifies a rule across reloads: a rule is the same rule when
// its Resource, ID (or both none), Metric and PerKey match and its state
// is of the same class (see stateClass); copy tells apart the rules alike
// in a set, in their order. Its state is kept, made to fit what else
// changed (see keep).
type ruleKey struct {
	resource, id string
	metric       Metric
	perKey       bool
	class        uint8
	copy         int
}

// stateClass is the kind of state rule r keeps: a dry run's window, a
// Global rule's fallback, a queue (Throttle, WarmUpThrottle), a GCRA cell,
// a breaker, a system rule's reading, or else its resource's windows
// (Reject, WarmUp). Rules of one identity
// and other classes never share a copy count, so that adding or removing
// one moves no other's state; a rule that changes class starts afresh.
func stateClass(r *Rule) uint8 {
	switch {
	case r.DryRun:
		return 1
	case r.Global:
		return 2
	case r.Behavior == Throttle || r.Behavior == WarmUpThrottle:
		return 3
	case r.Behavior == GCRA:
		return 4
	case r.Breaker != NotBreaker:
		return 5
	case r.System != NotSystem:
		return 6
	}
	return 0
}

// kept is a rule's state in a rule set and the rule it was made for.
type kept[V any] struct {
	v V
	r *Rule
}

// keep returns the state of c's rule in the set being built, recording it
// in next: the old set's state of the same rule, as carry makes it fit the
// rule (carry may return it as it was, a state made from it, or false to
// start afresh), else fresh's.
func keep[V any](c *compiling, old, next map[ruleKey]kept[V], carry func(v V, was *Rule) (V, bool), fresh func() V) V {
	var v V
	o, ok := old[c.k]
	if ok {
		v, ok = carry(o.v, o.r)
	}
	if !ok {
		v = fresh()
	}
	next[c.k] = kept[V]{v, c.r}
	return v
}

// slower is how many times slower the rate of rule r is than the rate of
// rule was (both per second): what a timeline ahead of now stretches by
// when a reload changes the rate; 1 when either is 0.
func slower(was, r float64) float64 {
	if was <= 0 || r <= 0 {
		return 1
	}
	return was / r
}

// site is what the slot an Entry carries leads back to: the engine, and
// for a refusal by a resource's single window, the rules that refused.
type site struct {
	e  *Engine
	rr *resourceRules
	// be is the rule a refusal leads back to (see Entry.Refusal).
	be *BlockError
	// group is, for a refusal by one of rr's window groups whose retry
	// time is computed when read, the group's index + 1 (0: rr.single's);
	// keyed says the refusal's Entry carries the PerKey rules' wait (see
	// windowGroup.refusalKeyed).
	group int
	keyed bool
	// probe marks the site of the Entries of breaker probes.
	probe bool
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
	// singleBreakers is set when breakers decide after single admitted a
	// request (see enterBreakers).
	singleBreakers bool
	// system is the resource's system rules (nil: none), asked first.
	system *systemGuard
	// breakersOnly is set when the resource's only rules are circuit
	// breakers: Entry then takes a short path while they are closed
	// (enterBreakersOnly).
	breakersOnly bool
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
	// rules counts the resource's rules: with several, a blocked request
	// is told to retry when the later rate rules would admit it too (see
	// laterRetry).
	rules int
	// shadows are the resource's dry-run rules; gcras its GCRA rules.
	shadows []shadowRule
	gcras   []gcraRule
	// needsExit is Allow's error on a resource whose rules count requests
	// in flight; nil: Allow may admit.
	needsExit error
	// breakers are the resource's circuit breakers; brkSite leads an
	// admission's Exit back to them (its slot, when it holds nothing, is
	// brkSlot), probeSite a probe's (probeSlot): only a probe's Exit ends
	// a half-open period.
	breakers  []breakerRule
	brkSite   site
	brkSlot   *slots.Slot[site]
	probeSite site
	probeSlot *slots.Slot[site]
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
	now       int64       // the clock at load
	bound     BoundSource // a Global rule's bound token source, if any
	related   *stats.Node // a related-resource rule's other resource
}

// compile builds the rule set of valid rules norm, whose resources' nodes
// are in nodes. It cannot fail: everything that could was checked first.
func compile(e *Engine, norm []Rule, nodes map[string]*stats.Node, bounds []BoundSource, old *ruleSet) *ruleSet {
	next := &ruleSet{
		rules:      norm,
		byResource: map[string]*resourceRules{},
		warm:       map[ruleKey]kept[*warmup.Bucket]{},
		pacers:     map[ruleKey]kept[*pace.Pacer]{},
		locals:     map[ruleKey]kept[*globalLocal]{},
		tables:     map[ruleKey]kept[*keytable.Table]{},
		hot:        map[ruleKey]kept[*hotkeys.Sketch]{},
		shadows:    map[ruleKey]kept[*shadow]{},
		gcras:      map[ruleKey]kept[*gcra.Cell]{},
		breakers:   map[ruleKey]kept[*breaker.Breaker]{},
		since:      map[string]ruledSince{},
	}
	copies := map[ruleKey]int{}
	now := e.now()
	for i := range norm {
		res := norm[i].Resource
		if t, ok := old.since[res]; ok {
			next.since[res] = t
		} else if _, ok := next.since[res]; !ok {
			next.since[res] = ruledSince{at: now, counted: nodes[res].Counted()}
		}
	}
	for i := range norm {
		r := &norm[i]
		k := ruleKey{resource: r.Resource, id: r.ID, metric: r.Metric, perKey: r.PerKey, class: stateClass(r)}
		k.copy = copies[k]
		copies[k]++
		c := compiling{e: e, next: next, old: old, r: r, k: k, now: now, bound: bounds[i]}
		c.rr = e.resourceRules(next, r, nodes)
		if !r.DryRun {
			c.rr.rules++
			if r.Metric == QPS && r.RelatedResource == "" && r.Breaker == NotBreaker && r.System == NotSystem && (c.rr.policy == nil || r.Threshold < c.rr.policy.Rule.Threshold) {
				c.rr.policy = newBlockError(r, ReasonFlow)
			}
		}
		if r.RelatedResource != "" {
			c.related = nodes[r.RelatedResource]
		}
		kindOf(r).compile(&c)
	}
	for name, rr := range next.byResource {
		rr.rateRules = len(rr.groups) + len(rr.gcras) + len(rr.paced) + len(rr.keyed)
		for i := range rr.groups {
			if g := &rr.groups[i]; len(g.warm) == 0 {
				g.site = site{e: e, rr: rr, be: g.staticBE, group: i + 1}
				g.refusal = slots.Sentinel(&g.site)
				g.siteKeyed = site{e: e, rr: rr, be: g.staticBE, group: i + 1, keyed: true}
				g.refusalKeyed = slots.Sentinel(&g.siteKeyed)
			}
		}
		if rr.concLimit >= 0 || rr.keyConc.t != nil {
			rr.needsExit = fmt.Errorf("%w: Allow on %s, which has a Concurrency rule: use Entry and Exit", ErrNeedsExit, names.Abbrev(name))
		}
		if len(rr.breakers) > 0 {
			rr.brkSite = site{e: e, rr: rr}
			rr.brkSlot = slots.Sentinel(&rr.brkSite)
			rr.probeSite = site{e: e, rr: rr, probe: true}
			rr.probeSlot = slots.Sentinel(&rr.probeSite)
			if rr.needsExit == nil {
				rr.needsExit = fmt.Errorf("%w: Allow on %s, which has a circuit breaker (it counts completions): use Entry and Exit", ErrNeedsExit, names.Abbrev(name))
			}
		}
		if g := rr.system; g != nil && rr.needsExit == nil {
			for _, sr := range g.rules {
				if sr.check == SystemBBR || sr.check == SystemRT {
					rr.needsExit = fmt.Errorf("%w: Allow on %s, which has a %s rule (it reads completions): use Entry and Exit", ErrNeedsExit, names.Abbrev(name), sr.check)
					break
				}
			}
		}
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
// Rule validation keeps the count within what a bucket counts
// (window.MaxCount).
// A product within a billionth of a whole number is that number (0.29 x
// 100 s is 28.999999999999996 in floating point: 29, not 28).
func perWindow(threshold float64, interval time.Duration) int64 {
	n, _ := countPerWindow(threshold, interval)
	return n
}

// wholePerWindow reports whether a per-second threshold is a whole count
// per window of interval (as perWindow rounds).
func wholePerWindow(threshold float64, interval time.Duration) bool {
	_, whole := countPerWindow(threshold, interval)
	return whole
}

// countPerWindow is perWindow, and whether the count is whole.
func countPerWindow(threshold float64, interval time.Duration) (int64, bool) {
	v := threshold * interval.Seconds()
	if r := math.Round(v); math.Abs(v-r) <= 1e-9*max(1, r) {
		return int64(r), true
	}
	return int64(math.Floor(v)), false
}

// shortPaths chooses the short paths Entry takes for rr's shape, if any:
// the one place that does (the general checker decides the same; see
// TestShortPathsDecideAsTheGeneralChecker, which turns them off here).
//   - single: one Reject window and nothing else (enterSingle);
//   - singleKey: one PerKey QPS Reject rule (a Window table), and nothing
//     else but Global rules (decided after it, as take does);
//   - singleGCRA: one GCRA rule and nothing else.
func (e *Engine) shortPaths(rr *resourceRules) {
	if e.generalOnly {
		return
	}
	if len(rr.groups) == 1 && len(rr.groups[0].warm) == 0 && rr.concLimit < 0 &&
		len(rr.globals) == 0 && len(rr.related) == 0 && len(rr.paced) == 0 && !rr.hasKeyed() && len(rr.shadows) == 0 &&
		len(rr.gcras) == 0 {
		// Breakers decide after the window (enterBreakers).
		rr.singleBreakers = len(rr.breakers) > 0
		g := &rr.groups[0]
		rr.single, rr.singleLimit, rr.singleBE = g.w, g.static, g.staticBE
		rr.singleApart = !rr.countsNode
		rr.site = site{e: e, rr: rr, be: rr.singleBE}
		rr.refusal = slots.Sentinel(&rr.site)
	}
	if len(rr.groups) == 0 && rr.concLimit < 0 && len(rr.related) == 0 && len(rr.paced) == 0 &&
		rr.keyConc.t == nil && len(rr.keyed) == 1 && rr.keyed[0].t.Kind() == keytable.Window && len(rr.shadows) == 0 && len(rr.gcras) == 0 &&
		len(rr.breakers) == 0 && rr.system == nil {
		rr.singleKey = &rr.keyed[0]
	}
	if len(rr.gcras) == 1 && rr.rules == 1 && len(rr.shadows) == 0 {
		rr.singleGCRA = &rr.gcras[0]
	}
	rr.breakersOnly = len(rr.breakers) > 0 && rr.rules == len(rr.breakers) && len(rr.shadows) == 0
}

// second is node's second window, as flow counts on it.
func second(node *stats.Node) *window.Window { return node.Second() }
