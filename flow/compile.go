package flow

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// ruleSet is an immutable compiled rule set, swapped in whole.
type ruleSet struct {
	rules      []Rule
	byResource map[string]*resourceRules
	// states holds shaping state by rule, so a reload that keeps a rule
	// keeps its warm-up tokens and throttle timeline.
	warm   map[ruleKey]*warmUp
	pacers map[ruleKey]*pacer
	locals map[ruleKey]*metric.Window
	// tables holds per-key rules' keys, kept across reloads.
	tables map[tableID]*keytable.Table
	// shadows holds dry-run rules' windows and counts.
	shadows map[ruleKey]*shadow
	// gcras holds GCRA rules' arrival times (for a Global GCRA rule, its
	// local fallback's).
	gcras map[ruleKey]*gcra
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

// resourceRules is everything Entry needs for one resource with rules.
type resourceRules struct {
	// single is set when the resource's only rules are Reject QPS rules on
	// its second window: Entry then takes a short path, reading the window,
	// limit and error copied here (no further pointer to chase), first in
	// the struct so that the short path reads one cache line of it.
	single      *metric.Window
	singleLimit int64
	singleBE    *BlockError
	// singleApart is set when single is not the node's second window (a
	// span-exact rule's): passes and blocks are counted on the node too.
	singleApart bool
	// singleKey is set when the resource's only rule is one PerKey Reject
	// QPS rule, singleGCRA when it is one GCRA rule: Entry then takes a
	// short path too.
	singleKey  *keyRule
	singleGCRA *gcraRule
	node       *stat.Node
	concLimit  int64 // -1: no concurrency rule
	concBE     *BlockError
	// counting is set when the rule set adds the concurrency rule: Entry
	// waits for it until the requests already in flight are counted.
	counting   *gate
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

// windowGroup is every Reject and WarmUp rule that counts in one window:
// they admit together, with one Admit at the smallest of their limits, so a
// pass is counted once.
type windowGroup struct {
	w          *metric.Window
	intervalS  float64
	static     int64 // smallest Reject limit; MaxInt64 if none
	staticBE   *BlockError
	borrowable bool // only Reject rules: priority requests may borrow
	warm       []warmRule
}

type warmRule struct {
	w  *warmUp
	be *BlockError
}

type pacedRule struct {
	p    *pacer
	rate float64 // Throttle
	warm *warmUp // WarmUpThrottle
	be   *BlockError
}

type relatedRule struct {
	node      *stat.Node
	threshold float64
	be        *BlockError
}

type globalRule struct {
	req   GlobalRequest
	bound BoundSource // set when the source is a Binder
	keyed KeyedSource // set when bound is one (PerKey rules)
	// hint and keyHint are bound as a RetryHinter and keyed as a
	// KeyedRetryHinter, when they are.
	hint    RetryHinter
	keyHint KeyedRetryHinter
	// keys is a PerKey rule's local fallback, per key (nil otherwise);
	// spec the keys it lists in Keys, with their thresholds.
	keys       *keytable.Table
	spec       map[string]globalKeySpec
	fallback   Fallback
	local      *metric.Window
	localLimit int64
	// gcra is a Global GCRA rule's local fallback (nil otherwise): a
	// bucket at LocalShare of its rate and burst.
	gcra    *gcraRule
	be      *BlockError // refused globally
	beLocal *BlockError // refused by the local fallback
}

// globalKeySpec is a key a PerKey global rule lists in Keys: its own
// threshold, and its local fallback's state and limit.
type globalKeySpec struct {
	st         *keytable.State
	threshold  float64
	localLimit int64
}

// keyLimits returns the threshold and local fallback limit of the
// request's key under a PerKey global rule, and the listed key's state
// (nil: look it up).
func (g *globalRule) keyLimits(q *request) (float64, int64, *keytable.State) {
	if q.hasKey && g.spec != nil {
		if s, ok := g.spec[q.key]; ok {
			return s.threshold, s.localLimit, s.st
		}
	}
	return g.req.Threshold, g.localLimit, nil
}

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

// A resource's throttling and global rules are held on the stack during
// Entry, so their number per resource is bounded.
const (
	maxPacedRules  = 4
	maxGlobalRules = 4
	maxGCRARules   = 4
)

// compile builds the rule set of valid rules norm, whose resources' nodes
// are in nodes. It cannot fail: everything that could was checked first.
func compile(e *Engine, norm []Rule, nodes map[string]*stat.Node, bounds []BoundSource, old *ruleSet) *ruleSet {
	next := &ruleSet{
		rules:      norm,
		byResource: map[string]*resourceRules{},
		warm:       map[ruleKey]*warmUp{},
		pacers:     map[ruleKey]*pacer{},
		locals:     map[ruleKey]*metric.Window{},
		tables:     map[tableID]*keytable.Table{},
		shadows:    map[ruleKey]*shadow{},
		gcras:      map[ruleKey]*gcra{},
	}
	copies := map[string]int{}
	tableCopies := map[tableID]int{}
	for i := range norm {
		fp := fingerprint(&norm[i])
		k := ruleKey{fp, copies[fp]}
		copies[fp]++
		r := &norm[i]
		rr := e.resourceRules(next, r, nodes)
		if r.DryRun {
			e.addShadow(next, old, rr, r, k)
			continue
		}
		rr.rules++
		if r.Metric == QPS && r.RelatedResource == "" && (rr.policy == nil || r.Threshold < rr.policy.Rule.Threshold) {
			rr.policy = newBlockError(r, ReasonFlow)
		}
		var id tableID // PerKey rules' tables
		if r.PerKey {
			id = tableID{resource: r.Resource, id: r.ID, metric: r.Metric, behavior: r.Behavior, interval: r.StatInterval,
				maxQueue: r.MaxQueueing, global: r.Global}
			id.copy = tableCopies[id]
			tableCopies[id]++
			if !r.Global {
				e.addKeyed(next, old, rr, r, id)
				continue
			}
		}
		e.add(next, old, r, k, id, nodes, bounds[i])
	}
	for _, rr := range next.byResource {
		rr.rateRules = len(rr.groups) + len(rr.gcras) + len(rr.paced) + len(rr.keyed)
		if len(rr.groups) == 1 && len(rr.groups[0].warm) == 0 && rr.concLimit < 0 &&
			len(rr.globals) == 0 && len(rr.related) == 0 && len(rr.paced) == 0 && !rr.hasKeyed() && len(rr.shadows) == 0 &&
			len(rr.gcras) == 0 {
			g := &rr.groups[0]
			rr.single, rr.singleLimit, rr.singleBE = g.w, g.static, g.staticBE
			rr.singleApart = !rr.countsNode
		}
		if len(rr.groups) == 0 && rr.concLimit < 0 && len(rr.globals) == 0 && len(rr.related) == 0 && len(rr.paced) == 0 &&
			rr.keyConc.t == nil && len(rr.keyed) == 1 && rr.keyed[0].t.Kind() == keytable.Window && len(rr.shadows) == 0 && len(rr.gcras) == 0 {
			rr.singleKey = &rr.keyed[0]
		}
		if len(rr.gcras) == 1 && rr.rules == 1 && len(rr.shadows) == 0 {
			rr.singleGCRA = &rr.gcras[0]
		}
	}
	return next
}

// add adds rule r, whose state is keyed k, to the set being built; bound
// is its bound token source, if any.
func (e *Engine) add(next, old *ruleSet, r *Rule, k ruleKey, id tableID, nodes map[string]*stat.Node, bound BoundSource) {
	rr := e.resourceRules(next, r, nodes)
	switch {
	case r.Metric == Concurrency:
		limit := int64(r.Threshold) // at most MaxThreshold: no overflow
		if rr.concLimit < 0 || limit < rr.concLimit {
			rr.concLimit, rr.concBE = limit, newBlockError(r, ReasonConcurrency)
		}
	case r.RelatedResource != "":
		rr.related = append(rr.related, relatedRule{node: nodes[r.RelatedResource], threshold: r.Threshold, be: newBlockError(r, ReasonFlow)})
	case r.Global && r.PerKey:
		// Its local fallback is per key, at LocalShare of the threshold.
		t := e.keyTable(next, old, rr, r, id)
		g := globalRule{
			req:        globalRequest(r),
			bound:      bound,
			fallback:   r.Fallback,
			keys:       t,
			localLimit: perWindow(r.Threshold*r.LocalShare, r.StatInterval),
			be:         newBlockError(r, ReasonGlobal),
			beLocal:    newBlockError(r, ReasonFlow),
		}
		g.keyed, _ = bound.(KeyedSource)
		if g.keyed != nil {
			g.keyHint, _ = bound.(KeyedRetryHinter)
		}
		if len(r.Keys) > 0 {
			g.spec = make(map[string]globalKeySpec, len(r.Keys))
			for _, kl := range r.Keys {
				g.spec[kl.Key] = globalKeySpec{st: t.Specific(kl.Key), threshold: kl.Threshold,
					localLimit: perWindow(kl.Threshold*r.LocalShare, r.StatInterval)}
			}
		}
		rr.globals = append(rr.globals, g)
		rr.keyedGlobal = true
	case r.Global && r.Behavior == GCRA:
		g := reuse(old.gcras, k, func() *gcra { return &gcra{} })
		next.gcras[k] = g
		local := newGCRARule(g, localShare(r))
		hint, _ := bound.(RetryHinter)
		rr.globals = append(rr.globals, globalRule{
			req:      globalRequest(r),
			bound:    bound,
			hint:     hint,
			fallback: r.Fallback,
			gcra:     &local,
			be:       newBlockError(r, ReasonGlobal),
			beLocal:  newBlockError(r, ReasonFlow),
		})
	case r.Global:
		local := reuse(old.locals, k, func() *metric.Window {
			n, interval := e.buckets(r.StatInterval), r.StatInterval
			if r.SpanExact {
				// The fallback is span-exact too.
				n, interval = spanShape(e.spanBuckets, interval)
			}
			w, err := metric.NewWindow(n, interval)
			if err != nil {
				panic(err) // validated
			}
			return w
		})
		next.locals[k] = local
		hint, _ := bound.(RetryHinter)
		rr.globals = append(rr.globals, globalRule{
			req:        globalRequest(r),
			bound:      bound,
			hint:       hint,
			fallback:   r.Fallback,
			local:      local,
			localLimit: perWindow(r.Threshold*r.LocalShare, r.StatInterval),
			be:         newBlockError(r, ReasonGlobal),
			beLocal:    newBlockError(r, ReasonFlow),
		})
	case r.Behavior == GCRA:
		g := reuse(old.gcras, k, func() *gcra { return &gcra{} })
		next.gcras[k] = g
		rr.gcras = append(rr.gcras, newGCRARule(g, r))
	case r.Behavior == Throttle || r.Behavior == WarmUpThrottle:
		p := reuse(old.pacers, k, func() *pacer { return newPacer(r.MaxQueueing) })
		next.pacers[k] = p
		pr := pacedRule{p: p, rate: r.Threshold, be: newBlockError(r, ReasonQueue)}
		if r.Behavior == WarmUpThrottle {
			pr.warm = reuse(old.warm, k, func() *warmUp { return newWarmUp(r) })
			next.warm[k] = pr.warm
		}
		rr.paced = append(rr.paced, pr)
	default: // Reject or WarmUp, counted in a window
		w := e.window(rr.node, r.StatInterval)
		if r.SpanExact {
			w = e.spanWindow(rr.node, r.StatInterval)
		}
		g := rr.group(w, r.StatInterval)
		if w == rr.node.Second() {
			rr.countsNode = true
		}
		if r.Behavior == WarmUp {
			wu := reuse(old.warm, k, func() *warmUp { return newWarmUp(r) })
			next.warm[k] = wu
			g.warm = append(g.warm, warmRule{w: wu, be: newBlockError(r, ReasonFlow)})
			g.borrowable = false
		} else if limit := perWindow(r.Threshold, r.StatInterval); limit < g.static {
			g.static, g.staticBE = limit, newBlockError(r, ReasonFlow)
		}
	}
}

// resourceRules returns r's resource's rules in the set being built,
// adding them if needed.
func (e *Engine) resourceRules(next *ruleSet, r *Rule, nodes map[string]*stat.Node) *resourceRules {
	rr := next.byResource[r.Resource]
	if rr == nil {
		rr = &resourceRules{node: nodes[r.Resource], concLimit: -1}
		next.byResource[r.Resource] = rr
	}
	return rr
}

// window returns the node window a rule with this interval counts in.
func (e *Engine) window(n *stat.Node, interval time.Duration) *metric.Window {
	if interval == time.Second {
		return n.Second()
	}
	w, err := n.Window(interval, e.buckets(interval))
	if err != nil {
		panic(err) // a validated interval (whole ms, at most 1h) cannot fail
	}
	return w
}

// spanWindow returns the node window span-exact rules with this interval
// count in: n buckets of the interval (WithSpanBuckets) and one more, so
// that an admission is checked against the last n+1 buckets (every span
// of the interval lies within n+1 consecutive buckets).
func (e *Engine) spanWindow(n *stat.Node, interval time.Duration) *metric.Window {
	k, span := spanShape(e.spanBuckets, interval)
	w, err := n.Window(span, k)
	if err != nil {
		panic(err) // the interval divides into k buckets, so into k+1 of the same length
	}
	return w
}

// spanShape is the shape of a span-exact window of interval with k
// buckets (k divides 1 ms, so every whole-millisecond interval): k+1
// buckets of interval/k.
func spanShape(k int, interval time.Duration) (int, time.Duration) {
	return k + 1, interval + interval/time.Duration(k)
}

// buckets is the bucket count for a window of interval: the engine's sample
// count if it divides the interval, else 1.
func (e *Engine) buckets(interval time.Duration) int {
	if int64(interval)%int64(e.sampleCount) != 0 {
		return 1
	}
	return e.sampleCount
}

// group returns the group of window w, adding one if needed; the node's
// second window goes first.
func (rr *resourceRules) group(w *metric.Window, interval time.Duration) *windowGroup {
	for i := range rr.groups {
		if rr.groups[i].w == w {
			return &rr.groups[i]
		}
	}
	rr.groups = append(rr.groups, windowGroup{w: w, intervalS: interval.Seconds(), static: math.MaxInt64, borrowable: true})
	return &rr.groups[len(rr.groups)-1]
}

// globalRequest is what global rule r asks its token source.
func globalRequest(r *Rule) GlobalRequest {
	g := GlobalRequest{Key: globalKey(r), Resource: r.Resource, Threshold: r.Threshold, Interval: r.StatInterval, PerKey: r.PerKey,
		SpanExact: r.SpanExact}
	if r.Fallback == FallbackLocal {
		g.LocalShare = r.LocalShare
	}
	if r.Behavior == GCRA {
		g.GCRA, g.Burst = true, int64(r.Burst)
	}
	return g
}

// localShare is the local bucket a Global GCRA rule r falls back on: its
// LocalShare of the rate, and of the burst but at least 1 (validation
// keeps the rate at 0 or at least minPacedRate). Under FallbackOpen and
// FallbackClosed it is never used.
func localShare(r *Rule) *Rule {
	l := *r
	if r.Fallback == FallbackLocal {
		l.Threshold = r.Threshold * r.LocalShare
		l.Burst = max(1, int(math.Floor(float64(r.Burst)*r.LocalShare)))
	}
	return &l
}

// globalKey names a global rule's limit: by its ID if it has one, else by
// its resource, each kind in its own name space, so that a rule with ID
// "api" and the rules of resource "api" are different limits.
func globalKey(r *Rule) string {
	if r.ID != "" {
		return "id:" + r.ID
	}
	return "resource:" + r.Resource
}

// perWindow is a per-second threshold as a count per window of interval.
// Thresholds are at most MaxThreshold and intervals at most an hour, so the
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
