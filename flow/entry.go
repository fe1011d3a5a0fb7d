package flow

import (
	"context"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// EntryOption modifies one Entry call. Options are plain values, so passing
// them allocates nothing.
type EntryOption struct {
	count    int64
	priority bool
	ctx      context.Context
}

// WithCount makes the request count as n (a batch): it is admitted or
// blocked whole, and moves pass or block counts by n.
func WithCount(n int) EntryOption { return EntryOption{count: int64(n)} }

// WithPriority lets a request that a Reject QPS rule would block borrow from
// the next window, waiting up to the engine's occupy timeout.
func WithPriority() EntryOption { return EntryOption{priority: true} }

// WithContext bounds any wait (throttling, borrowing) and is passed to the
// TokenSource of global rules.
func WithContext(ctx context.Context) EntryOption { return EntryOption{ctx: ctx} }

// Entry is an admitted request. Call Exit exactly when the work is done
// (more calls do nothing). It is returned by value so that entering
// allocates nothing; do not copy it after Exit may have been called on it.
type Entry struct {
	eng  *Engine
	node *stat.Node // nil: blocked, or nothing held
	// start is the admission time; for a blocked request it holds the bits
	// of the value the rule saw (Entry stays five words: it is copied on
	// every return).
	start int64
	n     int64
	// p is the stripe hint taken at Entry and reused by Exit: if the
	// goroutine moved since, only locality suffers.
	p    int32
	conc bool
	done bool
}

func blocked(seen float64) Entry { return Entry{start: int64(math.Float64bits(seen))} }

// Start returns the engine clock's reading when the request was admitted
// (after any wait): the instant its pass is counted at and its RT runs from.
// It is 0 for a blocked request.
func (en *Entry) Start() int64 {
	if en.node == nil {
		return 0
	}
	return en.start
}

// Seen returns what the rule that decided saw: for a blocked request the
// window's committed count (passes, unused leases and borrowed; QPS rules),
// the related resource's pass rate (related rules), the in-flight count
// (Concurrency), or the rate in force (Throttle); 0 for an admitted one or
// a global refusal.
func (en *Entry) Seen() float64 {
	if en.node != nil {
		return 0
	}
	return math.Float64frombits(uint64(en.start))
}

// Exit records the request's completion: Success and its RT, an Exception
// too if err is not nil, and the end of its in-flight time. It is
// idempotent, and does nothing on the Entry of a blocked request.
func (en *Entry) Exit(err error) {
	if en.node == nil || en.done {
		return
	}
	en.done = true
	var now int64
	if c := en.eng.coarse; c != nil {
		now = c.Now()
	} else {
		now = en.eng.clock.Now()
	}
	en.node.Second().CompleteOn(int(en.p), now, en.n, max(now-en.start, 0), err != nil)
	if en.conc {
		en.node.Concurrency().Sub(en.n)
	}
}

// Entry checks a request for resource against the rules in force and, if
// it is admitted, counts it and returns an Entry to Exit when done. A
// blocked request gets a *BlockError (errors.Is(err, ErrBlocked)); a wait
// cut short by the context gets the context's error; a new resource past the
// registry cap gets an error matching stat.ErrTooManyResources; in every
// error case nothing is held and Exit on the Entry does nothing.
func (e *Engine) Entry(resource string, opts ...EntryOption) (Entry, error) {
	rr := e.rules.Load().byResource[resource]
	if rr != nil {
		return e.enter(rr, rr.node, opts)
	}
	node, err := e.registry.Node(resource)
	if err != nil {
		return Entry{}, err
	}
	return e.enter(nil, node, opts)
}

// Resource is a handle on one resource of an engine. Entry through it skips
// the lookup of the name (a hash of the string per call), so hot paths that
// know their resource up front should keep one. It follows rule reloads and
// is safe for simultaneous use.
type Resource struct {
	eng   *Engine
	name  string
	node  *stat.Node
	rules atomic.Pointer[resourceCache]
}

// resourceCache is the resource's rules under one rule set; it is replaced
// when the rule set changes.
type resourceCache struct {
	set *ruleSet
	rr  *resourceRules
}

// Resource returns a handle on resource, creating its statistics if needed
// (an error matching stat.ErrTooManyResources past the registry cap).
func (e *Engine) Resource(name string) (*Resource, error) {
	node, err := e.registry.Node(name)
	if err != nil {
		return nil, err
	}
	return &Resource{eng: e, name: name, node: node}, nil
}

// Name returns the resource's name.
func (r *Resource) Name() string { return r.name }

// Entry is Engine.Entry for this resource.
func (r *Resource) Entry(opts ...EntryOption) (Entry, error) {
	set := r.eng.rules.Load()
	c := r.rules.Load()
	if c == nil || c.set != set {
		// The rules changed since the last call: one small allocation per
		// reload, not per request.
		c = &resourceCache{set: set, rr: set.byResource[r.name]}
		r.rules.Store(c)
	}
	return r.eng.enter(c.rr, r.node, opts)
}

// enter checks a request against rr (nil: no rules) and counts it on node.
func (e *Engine) enter(rr *resourceRules, node *stat.Node, opts []EntryOption) (Entry, error) {
	n := int64(1)
	var priority bool
	var ctx context.Context
	for _, o := range opts {
		if o.count != 0 {
			n = o.count
		}
		priority = priority || o.priority
		if o.ctx != nil {
			ctx = o.ctx
		}
	}
	if n < 1 {
		return Entry{}, errBadCount
	}
	var now int64
	if c := e.coarse; c != nil {
		now = c.Now()
	} else {
		now = e.clock.Now()
	}
	p := cpu.Pin()
	if rr == nil {
		node.Second().AddOn(p, now, metric.Pass, n)
		return Entry{eng: e, node: node, start: now, n: n, p: int32(p)}, nil
	}
	if w := rr.single; w != nil && !priority {
		// The common shape, one Reject limit on the node's window: one
		// admission, nothing to give back.
		r, ok := w.AdmitOn(p, now, n, rr.singleLimit)
		if !ok {
			w.AddOn(p, now, metric.Block, n)
			return blocked(float64(r.Seen())), rr.singleBE
		}
		// A now behind the newest bucket was counted in it: start there.
		return Entry{eng: e, node: node, start: max(now, r.Start()), n: n, p: int32(p)}, nil
	}
	return e.check(rr, p, now, n, priority, ctx)
}

// held is what a request has taken so far, to give back if a later check
// blocks it or its wait is cancelled. It lives on the stack; only a
// resource with more than two windows spills into more.
type held struct {
	conc  bool
	nres  int
	res   [2]metric.Reservation
	more  []metric.Reservation
	paced [maxPacedRules]int64 // costs, by index into rr.paced
	gres  [maxGlobalRules]metric.Reservation
}

func (h *held) addRes(r metric.Reservation) {
	if h.nres < len(h.res) {
		h.res[h.nres] = r
	} else {
		h.more = append(h.more, r)
	}
	h.nres++
}

func (e *Engine) release(rr *resourceRules, h *held, n int64) {
	if h.conc {
		rr.node.Concurrency().Sub(n)
	}
	for i := range min(h.nres, len(h.res)) {
		h.res[i].Cancel()
	}
	for _, r := range h.more {
		r.Cancel()
	}
	for i := range rr.paced {
		if cost := h.paced[i]; cost != 0 {
			rr.paced[i].p.giveBack(cost)
		}
	}
	for i := range rr.globals {
		h.gres[i].Cancel()
	}
}

func (e *Engine) block(rr *resourceRules, h *held, p int, now, n int64, be *BlockError, seen float64) (Entry, error) {
	e.release(rr, h, n)
	rr.node.Second().AddOn(p, now, metric.Block, n)
	return blocked(seen), be
}

// check runs every rule of a resource: concurrency, global, windows,
// related resources, then pacing, and waits last if any of them queued the
// request.
func (e *Engine) check(rr *resourceRules, p int, now, n int64, priority bool, ctx context.Context) (Entry, error) {
	var h held
	node := rr.node
	if rr.concLimit >= 0 {
		c := node.Concurrency()
		for {
			cur := c.Load()
			if cur+n > rr.concLimit {
				return e.block(rr, &h, p, now, n, rr.concBE, float64(cur))
			}
			if c.CompareAndSwap(cur, cur+n) {
				break
			}
		}
		h.conc = true
	}
	for i := range rr.globals {
		g := &rr.globals[i]
		if be := e.global(rr.node, g, &h, i, p, now, n, ctx); be != nil {
			return e.block(rr, &h, p, now, n, be, 0)
		}
	}
	var wait int64
	for i := range rr.groups {
		g := &rr.groups[i]
		limit, be := g.static, g.staticBE
		for _, wr := range g.warm {
			if l := int64(wr.w.rate(now, node) * g.intervalS); l < limit {
				limit, be = l, wr.be
			}
		}
		r, ok := g.w.AdmitOn(p, now, n, limit)
		if ok {
			h.addRes(r)
			now = max(now, r.Start())
			continue
		}
		if priority && g.borrowable && e.occupyTimeout > 0 {
			if d, ok := g.w.Borrow(now, n, limit, time.Duration(e.occupyTimeout)); ok {
				// Counted as Pass and OccupiedPass when its bucket starts.
				wait = max(wait, int64(d))
				continue
			}
		}
		return e.block(rr, &h, p, now, n, be, float64(r.Seen()))
	}
	for _, rel := range rr.related {
		if seen := rel.node.Rate(now, metric.Pass); seen+float64(n) > rel.threshold {
			return e.block(rr, &h, p, now, n, rel.be, seen)
		}
	}
	for i := range rr.paced {
		pr := &rr.paced[i]
		rate := pr.rate
		if pr.warm != nil {
			rate = pr.warm.rate(now, node)
		}
		d, cost, ok := pr.p.reserve(now, n, rate)
		if !ok {
			return e.block(rr, &h, p, now, n, pr.be, rate)
		}
		h.paced[i] = cost
		wait = max(wait, d)
	}
	if wait > 0 {
		if ctx == nil {
			ctx = context.Background()
		}
		if err := e.sleep(ctx, time.Duration(wait)); err != nil {
			e.release(rr, &h, n)
			return Entry{}, err
		}
		now += wait
	}
	if !rr.countsNode {
		node.Second().AddOn(p, now, metric.Pass, n)
	}
	return Entry{eng: e, node: node, start: now, n: n, p: int32(p), conc: h.conc}, nil
}

// global asks the token source for rule g and applies its fallback when the
// source fails. It returns the error to block with, or nil.
func (e *Engine) global(node *stat.Node, g *globalRule, h *held, i, p int, now, n int64, ctx context.Context) *BlockError {
	if ctx == nil {
		ctx = context.Background()
	}
	var ok bool
	var err error
	if g.bound != nil {
		ok, err = g.bound.Acquire(ctx, n)
	} else {
		req := g.req
		req.Count = n
		ok, err = e.source.Acquire(ctx, req)
	}
	if err == nil {
		if ok {
			return nil
		}
		return g.be
	}
	node.AddFallback()
	switch g.fallback {
	case FallbackOpen:
		return nil
	case FallbackClosed:
		return g.be
	}
	r, ok := g.local.AdmitOn(p, now, n, g.localLimit)
	if !ok {
		return g.beLocal
	}
	h.gres[i] = r
	return nil
}
