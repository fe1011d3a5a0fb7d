package flow

import (
	"context"
	"fmt"
	"time"

	"github.com/leapflow/leapflow/internal/proto"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// enter checks a request against rr (nil: no rules), from rule set set,
// and counts it on node.
func (e *Engine) enter(set *ruleSet, rr *resourceRules, node *stat.Node, opts []EntryOption) (Entry, error) {
	q := request{n: 1}
	if len(opts) > 0 {
		if err := parseOptions(&q, opts); err != nil {
			return Entry{}, err
		}
		if q.priority {
			q.wait = max(q.wait, e.occupyTimeout)
		}
	}
	n := q.n
	p, now := e.pinNow()
	if rr == nil {
		node.Second().AddOn(p, now, metric.Pass, n)
		if node.Dropped() {
			node = e.recount(node, p, now, metric.Pass, n)
		}
		return e.admitted(set, node, p, now, n, false, nil, nil), nil
	}
	if w := rr.single; w != nil && q.wait == 0 {
		// The common shape, one Reject limit on the node's window: one
		// admission, nothing to give back.
		r, ok := w.AdmitOn(p, now, n, rr.singleLimit)
		if !ok {
			node.Second().AddOn(p, now, metric.Block, n)
			return blocked(float64(r.Seen()), roomOf(w.RoomIn(now, n, rr.singleLimit))), rr.singleBE
		}
		// A now behind the newest bucket was counted in it: start there.
		now = max(now, r.Start())
		if rr.singleApart {
			// A span-exact window: the node's own counts the pass too.
			node.Second().AddOn(p, now, metric.Pass, n)
			if node.Dropped() {
				node = e.recount(node, p, now, metric.Pass, n)
			}
		}
		return e.admitted(set, node, p, now, n, false, nil, nil), nil
	}
	if gr := rr.singleGCRA; gr != nil && q.wait == 0 {
		// One GCRA rule: one compare-and-swap, the pass or block counted
		// on the node.
		_, ok, rm := gr.take(now, n, 0)
		ev := metric.Pass
		if !ok {
			ev = metric.Block
		}
		node.Second().AddOn(p, now, ev, n)
		if node.Dropped() {
			node = e.recount(node, p, now, ev, n)
		}
		if !ok {
			return blocked(0, rm), gr.be
		}
		return e.admitted(set, node, p, now, n, false, nil, nil), nil
	}
	if kr := rr.singleKey; kr != nil {
		// One PerKey limit: one admission on the key, the pass or block
		// counted on the node.
		keyless(node, &q)
		var kh keyHeld
		ev := metric.Pass
		_, seen, rm, ok := kr.admit(&q, now, &kh)
		if !ok {
			ev = metric.Block
		}
		node.Second().AddOn(p, now, ev, n)
		if node.Dropped() {
			node = e.recount(node, p, now, ev, n)
		}
		if !ok {
			return blocked(seen, rm), kr.blockError(&q)
		}
		// A now behind the key's newest bucket was counted in it.
		return e.admitted(set, node, p, max(now, kh.b*kr.t.bucketLen), n, false, nil, nil), nil
	}
	return e.check(set, rr, p, now, &q)
}

// admitted records an admission in a slot and returns its Entry; counted
// says whether a concurrency rule counted it, kc is the key state a PerKey
// Concurrency rule counted it in (Exit releases both).
func (e *Engine) admitted(set *ruleSet, node *stat.Node, p int, start, n int64, counted bool, kc *keyState, kt *keyTable) Entry {
	sl, w := e.slots.claim(p, node, n, counted, kc, kt)
	if !counted && e.rules.Load() != set {
		// Rules were loaded since this request read them: if they add a
		// concurrency rule, their walk may have passed this slot (see
		// slots.track).
		if rr := e.rules.Load().byResource[node.Resource()]; rr != nil && rr.concLimit >= 0 {
			w = e.slots.count(sl, w, node, n)
		}
	}
	return Entry{node: node, slot: sl, word: w, start: start, n: int32(n), p: int32(p)}
}

// recount counts event ev again on the live node of a resource whose node
// the registry let go while the request counted on it (see stat.Registry):
// the first count went to a node no one reads.
func (e *Engine) recount(node *stat.Node, p int, now int64, ev metric.Event, n int64) *stat.Node {
	for node.Dropped() {
		node = e.registry.Replace(proto.Token{}, node)
		node.Second().AddOn(p, now, ev, n)
	}
	return node
}

// held is what a request has taken so far, to give back if a later check
// blocks it or its wait is cancelled. It lives on the stack; only a
// resource with more than two windows spills into more.
type held struct {
	conc  bool
	nres  int
	res   [2]metric.Reservation
	more  []metric.Reservation
	nbor  int
	bor   [2]borrowed // admissions borrowed from later buckets (WithWait)
	bmore []borrowed
	paced [maxPacedRules]int64 // costs, by index into rr.paced
	gcra  [maxGCRARules]bool   // tokens taken, by index into rr.gcras
	gres  [maxGlobalRules]metric.Reservation
	ggcra [maxGlobalRules]bool    // taken by Global GCRA rules' local fallbacks
	gkeys [maxGlobalRules]keyHeld // PerKey global rules' local fallbacks
	kc    *keyState               // counted by the PerKey Concurrency rule
	keys  [maxKeyRules]keyHeld
}

// borrowed is an admission borrowed from window w's bucket starting at
// start.
type borrowed struct {
	w     *metric.Window
	start int64
}

func (h *held) addBorrow(b borrowed) {
	if h.nbor < len(h.bor) {
		h.bor[h.nbor] = b
	} else {
		h.bmore = append(h.bmore, b)
	}
	h.nbor++
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
		rr.node.ReleaseConcurrency(n)
	}
	for i := range min(h.nres, len(h.res)) {
		h.res[i].Cancel(proto.Token{})
	}
	for i := range h.more {
		h.more[i].Cancel(proto.Token{})
	}
	for i := range min(h.nbor, len(h.bor)) {
		h.bor[i].w.Unborrow(h.bor[i].start, n)
	}
	for _, b := range h.bmore {
		b.w.Unborrow(b.start, n)
	}
	for i := range rr.paced {
		if cost := h.paced[i]; cost != 0 {
			rr.paced[i].p.giveBack(cost)
		}
	}
	for i := range rr.gcras {
		if h.gcra[i] {
			rr.gcras[i].give(n)
		}
	}
	for i := range rr.globals {
		// What a source admitted is not given back (it may have been
		// counted across instances); a local fallback's admission is.
		h.gres[i].Cancel(proto.Token{})
		if h.ggcra[i] {
			rr.globals[i].gcra.give(n)
		}
		if st := h.gkeys[i].st; st != nil {
			undoBucket(st, h.gkeys[i].b, n)
		}
	}
	if h.kc != nil {
		rr.keyConc.t.release(h.kc, n)
	}
	for i := range rr.keyed {
		rr.keyed[i].undo(h.keys[i], n)
	}
}

func (e *Engine) block(rr *resourceRules, h *held, p int, now, n int64, be *BlockError, seen float64, rm room) (Entry, error) {
	e.release(rr, h, n)
	if rr.rules > 1 {
		rm = unknownRoom
	}
	rr.node.Second().AddOn(p, now, metric.Block, n)
	if rr.node.Dropped() {
		// The rule set this request read was replaced, its resource let go.
		e.recount(rr.node, p, now, metric.Block, n)
	}
	return blocked(seen, rm), be
}

// check runs every rule of a resource: concurrency, global, windows,
// related resources, then pacing, and waits last if any of them queued the
// request.
func (e *Engine) check(set *ruleSet, rr *resourceRules, p int, now int64, q *request) (Entry, error) {
	var h held
	node := rr.node
	n, ctx := q.n, q.ctx
	if rr.hasKeyed() {
		keyless(node, q)
	}
	if rr.keyConc.t != nil {
		st, seen, ok := rr.keyConc.acquire(q)
		if !ok {
			return e.block(rr, &h, p, now, n, rr.keyConc.blockError(q), float64(seen), unknownRoom)
		}
		h.kc = st
	}
	if rr.concLimit >= 0 {
		if g := rr.counting; g != nil {
			g.wait() // the rule is new: until what is in flight is counted
		}
		seen, ok := node.AcquireConcurrency(n, rr.concLimit)
		if !ok {
			return e.block(rr, &h, p, now, n, rr.concBE, float64(seen), unknownRoom)
		}
		h.conc = true
		// The second's most in flight (stat.Second.MaxConcurrency): one
		// load of the bucket's maximum, a store only when it rises.
		node.Second().RecordConcurrency(now, seen)
	}
	for i := range rr.globals {
		g := &rr.globals[i]
		if be, refused := e.global(rr.node, g, &h, i, p, now, q); be != nil {
			rm := unknownRoom
			if refused && rr.rules == 1 {
				rm = g.room(q)
			}
			return e.block(rr, &h, p, now, n, be, 0, rm)
		}
	}
	var wait int64
	for i := range rr.groups {
		g := &rr.groups[i]
		limit, be := g.limit(now, node)
		r, ok := g.w.AdmitOn(p, now, n, limit)
		if ok {
			h.addRes(r)
			now = max(now, r.Start())
			continue
		}
		if q.wait > 0 && g.borrowable {
			if s, _, ok := g.w.BorrowAt(now, n, limit, time.Duration(q.wait)); ok {
				// Counted as Pass and OccupiedPass when its bucket
				// starts; given back if the request is not admitted. It
				// waits from its own now (behind the newest bucket, the
				// borrow's wait ran from that bucket), so that it is
				// admitted at the bucket's start.
				h.addBorrow(borrowed{g.w, s})
				wait = max(wait, s-now)
				continue
			}
		}
		rm := unknownRoom
		if len(g.warm) == 0 {
			rm = roomOf(g.w.RoomIn(now, n, limit))
		}
		return e.block(rr, &h, p, now, n, be, float64(r.Seen()), rm)
	}
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		d, seen, rm, ok := kr.admit(q, now, &h.keys[i])
		if !ok {
			return e.block(rr, &h, p, now, n, kr.blockError(q), seen, rm)
		}
		if kr.t.kind == keyWindow {
			now = max(now, h.keys[i].b*kr.t.bucketLen)
		}
		wait = max(wait, d)
	}
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		d, ok, rm := gr.take(now, n, q.wait)
		if !ok {
			return e.block(rr, &h, p, now, n, gr.be, 0, rm)
		}
		h.gcra[i] = true
		wait = max(wait, d)
	}
	for _, rel := range rr.related {
		if seen := rel.node.Rate(now, metric.Pass); seen+float64(n) > rel.threshold {
			return e.block(rr, &h, p, now, n, rel.be, seen, unknownRoom)
		}
	}
	for i := range rr.paced {
		pr := &rr.paced[i]
		rate := pr.pace(now, node)
		d, cost, ok := pr.p.reserve(now, n, rate, q.wait)
		if !ok {
			return e.block(rr, &h, p, now, n, pr.be, rate, paceRoom(d, max(pr.p.maxQueue, q.wait)))
		}
		h.paced[i] = cost
		wait = max(wait, d)
	}
	if wait > 0 && rr.rateRules > 1 {
		// Every rule counts the request at the instant it goes, the
		// latest any of them asked for, before it waits.
		if be, seen, ok := e.align(rr, &h, p, now, now+wait, n); !ok {
			return e.block(rr, &h, p, now, n, be, seen, unknownRoom)
		}
	}
	if wait > 0 {
		if ctx == nil {
			ctx = context.Background()
		}
		if err := e.wait(ctx, time.Duration(wait)); err != nil {
			e.release(rr, &h, n)
			return Entry{}, err
		}
		now += wait
		if h.nbor > 0 && e.now() >= now {
			// Its borrowed buckets count it from their start, made now
			// if no other request made them (a sleep function that
			// returned early, as tests' do, leaves them to be made).
			for i := range min(h.nbor, len(h.bor)) {
				h.bor[i].w.Land(now)
			}
			for _, b := range h.bmore {
				b.w.Land(now)
			}
		}
	}
	if len(rr.shadows) > 0 {
		// Dry-run rules see the request once it is admitted for good
		// (after any wait), as one that may wait if it may.
		shade(rr, p, now, n, time.Duration(q.wait))
	}
	if !rr.countsNode {
		node.Second().AddOn(p, now, metric.Pass, n)
		if node.Dropped() {
			// Its rules were replaced during a wait and the resource, idle
			// by then, let go.
			node = e.recount(node, p, now, metric.Pass, n)
		}
	}
	return e.admitted(set, node, p, now, n, h.conc, h.kc, rr.keyConc.t), nil
}

// limit is the group's limit at now, and the error of the rule that sets
// it.
func (g *windowGroup) limit(now int64, node *stat.Node) (int64, *BlockError) {
	limit, be := g.static, g.staticBE
	for _, wr := range g.warm {
		if l := int64(wr.w.rate(now, node) * g.intervalS); l < limit {
			limit, be = l, wr.be
		}
	}
	return limit, be
}

// pace is the paced rule's rate at now.
func (pr *pacedRule) pace(now int64, node *stat.Node) float64 {
	if pr.warm != nil {
		return pr.warm.rate(now, node)
	}
	return pr.rate
}

// align moves what a request that waits took from its windows, GCRA and
// Throttle rules at now to the instant t it goes, when more than one such
// rule took part: each took at the time it could admit, and a rule that
// admitted at now (or borrowed a bucket before t) would count the request
// before it happens, letting others in around t past its threshold. Each
// window group admits it again in the bucket holding t, each GCRA rule
// takes its tokens at t and each Throttle rule its slot at t; if any
// cannot, the request is blocked by that rule (nothing was waited for
// yet). WarmUp windows, which do not borrow, keep their admission at now.
func (e *Engine) align(rr *resourceRules, h *held, p int, now, t, n int64) (*BlockError, float64, bool) {
	for i := range min(h.nres, len(h.res)) {
		h.res[i].Cancel(proto.Token{})
	}
	for i := range h.more {
		h.more[i].Cancel(proto.Token{})
	}
	for i := range min(h.nbor, len(h.bor)) {
		h.bor[i].w.Unborrow(h.bor[i].start, n)
	}
	for _, b := range h.bmore {
		b.w.Unborrow(b.start, n)
	}
	h.nres, h.more, h.nbor, h.bmore = 0, h.more[:0], 0, h.bmore[:0]
	node := rr.node
	for i := range rr.groups {
		g := &rr.groups[i]
		limit, be := g.limit(now, node)
		if !g.borrowable {
			r, ok := g.w.AdmitOn(p, now, n, limit)
			if !ok {
				return be, float64(r.Seen()), false
			}
			h.addRes(r)
			continue
		}
		r, s, later, ok := g.w.AdmitAt(p, now, t, n, limit)
		switch {
		case !ok:
			return be, float64(r.Seen()), false
		case later:
			h.addBorrow(borrowed{g.w, s})
		default:
			h.addRes(r)
		}
	}
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		if h.gcra[i] {
			gr.give(n)
			h.gcra[i] = false
		}
		if _, ok, _ := gr.take(t, n, 0); !ok {
			return gr.be, 0, false
		}
		h.gcra[i] = true
	}
	for i := range rr.paced {
		pr := &rr.paced[i]
		if h.paced[i] != 0 {
			pr.p.giveBack(h.paced[i])
			h.paced[i] = 0
		}
		rate := pr.pace(now, node)
		// A slot at t itself: no queue past it.
		_, cost, ok := reservePace(&pr.p.latest, 0, t, n, rate)
		if !ok {
			return pr.be, rate, false
		}
		h.paced[i] = cost
	}
	return nil, 0, true
}

// wait runs the engine's sleep, turning a panic in it into an error.
func (e *Engine) wait(ctx context.Context, d time.Duration) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("flow: the engine's sleep function panicked: %v", v)
		}
	}()
	return e.sleep(ctx, d)
}

// global asks the token source for rule g and applies its fallback when the
// source fails. It returns the error to block with, or nil, and whether
// the source itself refused.
func (e *Engine) global(node *stat.Node, g *globalRule, h *held, i, p int, now int64, q *request) (*BlockError, bool) {
	ctx, n := q.ctx, q.n
	if ctx == nil {
		ctx = context.Background()
	}
	ok, err := e.acquire(ctx, g, q)
	if err == nil {
		if ok {
			return nil, false
		}
		return g.be, true
	}
	if ctx.Err() != nil {
		// The caller gave up waiting: that says nothing about the source,
		// and the fallback must not admit it.
		return g.be, false
	}
	node.AddFallback()
	switch g.fallback {
	case FallbackOpen:
		return nil, false
	case FallbackClosed:
		return g.be, false
	}
	if g.keys != nil {
		// Per key, at LocalShare of the threshold.
		_, limit, spec := g.keyLimits(q)
		for {
			st := g.keys.noKey
			switch {
			case spec != nil:
				st = spec
			case q.hasKey:
				st = g.keys.get(q.key)
			}
			b, _, ok, dead := g.keys.admitWindow(st, now, n, limit)
			if dead {
				continue
			}
			if !ok {
				return g.beLocal, false
			}
			h.gkeys[i] = keyHeld{st: st, b: b}
			return nil, false
		}
	}
	if g.gcra != nil {
		// A Global GCRA rule: its local bucket.
		if _, ok, _ := g.gcra.take(now, n, 0); !ok {
			return g.beLocal, false
		}
		h.ggcra[i] = true
		return nil, false
	}
	r, ok := g.local.AdmitOn(p, now, n, g.localLimit)
	if !ok {
		return g.beLocal, false
	}
	h.gres[i] = r
	return nil, false
}

// room is what a request rule g's source refused is told, when the
// source can say.
func (g *globalRule) room(q *request) room {
	var d time.Duration
	var ok bool
	switch {
	case g.keyHint != nil:
		d, ok = g.keyHint.RetryInKey(q.key, q.n)
	case g.hint != nil:
		d, ok = g.hint.RetryIn(q.n)
	}
	if !ok {
		return unknownRoom
	}
	return room{int64(max(d, 0)), -1}
}

// acquire asks the token source; a panic in it counts as a failure of the
// source, so the rule's fallback applies.
func (e *Engine) acquire(ctx context.Context, g *globalRule, q *request) (ok bool, err error) {
	defer func() {
		if v := recover(); v != nil {
			ok, err = false, fmt.Errorf("flow: the token source panicked: %v", v)
		}
	}()
	req := g.req
	if req.PerKey {
		req.Threshold, _, _ = g.keyLimits(q)
		if g.keyed != nil {
			return g.keyed.AcquireKey(ctx, q.key, req.Threshold, q.n)
		}
	} else if g.bound != nil {
		return g.bound.Acquire(ctx, q.n)
	}
	req.Count = q.n
	req.Caller = q.key
	return e.source.Acquire(ctx, req)
}
