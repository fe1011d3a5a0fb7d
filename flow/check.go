package flow

import (
	"context"
	"fmt"
	"time"

	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/internal/proto"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// enter checks a request against rr (nil: no rules), from rule set set,
// and counts it on node.
func (e *Engine) enter(set *ruleSet, rr *resourceRules, node *stat.Node, opts []EntryOption) (Entry, error) {
	q := request{n: 1}
	if len(opts) > 0 {
		if err := e.readOptions(&q, opts); err != nil {
			return Entry{}, err
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
		_, _, ok, rm := gr.take(now, n, 0)
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
		return e.admitted(set, node, p, max(now, kh.b*kr.t.BucketLen()), n, false, nil, nil), nil
	}
	return e.check(set, rr, p, now, &q)
}

// admitted records an admission in a slot and returns its Entry; counted
// says whether a concurrency rule counted it, kc is the key state a PerKey
// Concurrency rule counted it in (Exit releases both).
func (e *Engine) admitted(set *ruleSet, node *stat.Node, p int, start, n int64, counted bool, kc *keytable.State, kt *keytable.Table) Entry {
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
	bor   [2]borrowedAt // admissions borrowed from later buckets (WithWait)
	bmore []borrowedAt
	paced [maxPacedRules]paceHeld // slots, by index into rr.paced
	gcra  [maxGCRARules]int64     // arrival times set (0: none), by index into rr.gcras
	gres  [maxGlobalRules]metric.Reservation
	ggcra [maxGlobalRules]int64   // set by Global GCRA rules' local fallbacks
	gkeys [maxGlobalRules]keyHeld // PerKey global rules' local fallbacks
	kc    *keytable.State         // counted by the PerKey Concurrency rule
	keys  [maxKeyRules]keyHeld
}

// borrowedAt is an admission borrowed from window w's bucket starting at
// start.
type borrowedAt struct {
	w     *metric.Window
	start int64
}

func (h *held) addBorrow(b borrowedAt) {
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

// reservations yields the window admissions the request holds.
func (h *held) reservations(yield func(*metric.Reservation) bool) {
	for i := range min(h.nres, len(h.res)) {
		if !yield(&h.res[i]) {
			return
		}
	}
	for i := range h.more {
		if !yield(&h.more[i]) {
			return
		}
	}
}

// borrows yields the admissions the request borrowed from later buckets.
func (h *held) borrows(yield func(borrowedAt) bool) {
	for i := range min(h.nbor, len(h.bor)) {
		if !yield(h.bor[i]) {
			return
		}
	}
	for _, b := range h.bmore {
		if !yield(b) {
			return
		}
	}
}

// releaseWindows gives back what the request's window groups took
// (admissions and borrows of n) and forgets them.
func (h *held) releaseWindows(n int64) {
	for r := range h.reservations {
		r.Cancel(proto.Token{})
	}
	for b := range h.borrows {
		b.w.Unborrow(b.start, n)
	}
	h.nres, h.more, h.nbor, h.bmore = 0, h.more[:0], 0, h.bmore[:0]
}

func (e *Engine) release(rr *resourceRules, h *held, n int64) {
	if h.conc {
		rr.node.ReleaseConcurrency(n)
	}
	h.releaseWindows(n)
	for i := range rr.paced {
		rr.paced[i].p.giveBack(h.paced[i])
	}
	for i := range rr.gcras {
		if h.gcra[i] != 0 {
			rr.gcras[i].give(n, h.gcra[i])
		}
	}
	for i := range rr.globals {
		// What a source admitted is not given back (it may have been
		// counted across instances); a local fallback's admission is.
		h.gres[i].Cancel(proto.Token{})
		if h.ggcra[i] != 0 {
			rr.globals[i].gcra.give(n, h.ggcra[i])
		}
		if st := h.gkeys[i].st; st != nil {
			st.Undo(h.gkeys[i].b, n)
		}
	}
	if h.kc != nil {
		rr.keyConc.t.Release(h.kc, n)
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
	now, wait, en, err := e.take(rr, &h, p, now, q)
	if err != nil {
		return en, err
	}
	return e.finish(set, rr, &h, p, now, wait, false, q)
}

// take runs every rule of a resource: concurrency, global, windows,
// related resources, then pacing, and aligns what they took to one
// instant. It returns the instant's start (now, moved to a newer bucket a
// window counted it in) and how long after it the request goes, or, when
// a rule blocks it, the blocked Entry and error with everything given
// back.
func (e *Engine) take(rr *resourceRules, h *held, p int, now int64, q *request) (int64, int64, Entry, error) {
	node := rr.node
	n := q.n
	if rr.hasKeyed() {
		keyless(node, q)
	}
	if rr.keyConc.t != nil {
		st, seen, ok := rr.keyConc.acquire(q)
		if !ok {
			return blockTake(e, rr, h, p, now, n, rr.keyConc.blockError(q), float64(seen), unknownRoom)
		}
		h.kc = st
	}
	if rr.concLimit >= 0 {
		if g := rr.counting; g != nil {
			g.wait() // the rule is new: until what is in flight is counted
		}
		seen, ok := node.AcquireConcurrency(n, rr.concLimit)
		if !ok {
			return blockTake(e, rr, h, p, now, n, rr.concBE, float64(seen), unknownRoom)
		}
		h.conc = true
		// The second's most in flight (stat.Second.MaxConcurrency): one
		// load of the bucket's maximum, a store only when it rises.
		node.Second().RecordConcurrency(now, seen)
	}
	for i := range rr.globals {
		g := &rr.globals[i]
		if be, refused := e.global(rr.node, g, h, i, p, now, q); be != nil {
			rm := unknownRoom
			if refused && rr.rules == 1 {
				rm = g.room(q)
			}
			return blockTake(e, rr, h, p, now, n, be, 0, rm)
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
				h.addBorrow(borrowedAt{g.w, s})
				wait = max(wait, s-now)
				continue
			}
		}
		rm := unknownRoom
		if len(g.warm) == 0 {
			rm = roomOf(g.w.RoomIn(now, n, limit))
		}
		return blockTake(e, rr, h, p, now, n, be, float64(r.Seen()), rm)
	}
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		d, seen, rm, ok := kr.admit(q, now, &h.keys[i])
		if !ok {
			return blockTake(e, rr, h, p, now, n, kr.blockError(q), seen, rm)
		}
		if kr.t.Kind() == keytable.Window {
			now = max(now, h.keys[i].b*kr.t.BucketLen())
		}
		wait = max(wait, d)
	}
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		d, tok, ok, rm := gr.take(now, n, q.wait)
		if !ok {
			return blockTake(e, rr, h, p, now, n, gr.be, 0, rm)
		}
		h.gcra[i] = tok
		wait = max(wait, d)
	}
	for _, rel := range rr.related {
		if seen := rel.node.Rate(now, metric.Pass); seen+float64(n) > rel.threshold {
			return blockTake(e, rr, h, p, now, n, rel.be, seen, unknownRoom)
		}
	}
	for i := range rr.paced {
		pr := &rr.paced[i]
		rate := pr.pace(now, node)
		ph, d, ok := pr.p.reserve(now, n, rate, q.wait)
		if !ok {
			return blockTake(e, rr, h, p, now, n, pr.be, rate, paceRoom(d, max(pr.p.maxQueue, q.wait)))
		}
		h.paced[i] = ph
		wait = max(wait, d)
	}
	if t := now + wait; (wait > 0 && rr.rateRules > 1) || !h.holds(rr, t) {
		// Every rule counts the request at the instant it goes: the
		// latest any of them asked for, or the newest bucket another
		// window already has.
		t, be, seen, ok := e.align(rr, h, p, now, t, q)
		if !ok {
			return blockTake(e, rr, h, p, now, n, be, seen, unknownRoom)
		}
		wait = t - now
	}
	return now, wait, Entry{}, nil
}

// blockTake is block for take's results.
func blockTake(e *Engine, rr *resourceRules, h *held, p int, now, n int64, be *BlockError, seen float64, rm room) (int64, int64, Entry, error) {
	en, err := e.block(rr, h, p, now, n, be, seen, rm)
	return 0, 0, en, err
}

// finish waits wait from now for a request take admitted, honouring its
// context (giving everything back if it ends), then counts the admission.
// early says the caller may be ahead of the instant (a Reservation entered
// before its Delay): the resource's statistics then count it when it
// runs, not at the instant, which would make a bucket in the future.
func (e *Engine) finish(set *ruleSet, rr *resourceRules, h *held, p int, now, wait int64, early bool, q *request) (Entry, error) {
	node, n, ctx := rr.node, q.n, q.ctx
	if wait > 0 {
		if ctx == nil {
			ctx = context.Background()
		}
		// Sleep until the instant now+wait, not wait from whenever this
		// runs: now may be stale (the goroutine was descheduled since it
		// read the clock), and a wait is bounded by WithWait from its
		// start. An instant already past sleeps not at all, but a context
		// already ended still cancels the request.
		var err error
		if d := now + wait - e.now(); d > 0 {
			err = e.wait(ctx, time.Duration(d))
		} else {
			err = ctx.Err()
		}
		if err != nil {
			e.release(rr, h, n)
			return Entry{}, err
		}
		now += wait
	}
	if h.nbor > 0 {
		// Its borrowed buckets count it from their start, made now if
		// no other request made them (a sleep function that returned
		// early, as tests' do, leaves them to be made). A request that
		// align moved to a later bucket another window had made borrows
		// without waiting. Either way its borrows are settled.
		land := e.now() >= now
		for b := range h.borrows {
			if land {
				b.w.Land(now)
			}
			b.w.Arrived(b.start, n)
		}
	}
	ran := now // when the statistics count it
	if early {
		ran = min(now, e.now())
	}
	if len(rr.shadows) > 0 {
		// Dry-run rules see the request once it is admitted for good
		// (after any wait), as one that may wait if it may.
		shade(rr, p, ran, n, time.Duration(q.wait))
	}
	if !rr.countsNode {
		node.Second().AddOn(p, ran, metric.Pass, n)
		if node.Dropped() {
			// Its rules were replaced during a wait and the resource, idle
			// by then, let go.
			node = e.recount(node, p, ran, metric.Pass, n)
		}
	}
	if h.nbor > 0 && !h.borrowedFrom(node.Second()) {
		// It waited for a later bucket of a window of its own (a
		// span-exact one): the resource counts it as occupied too, as
		// the fold does in its second window.
		node.Second().AddOn(p, ran, metric.OccupiedPass, n)
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

// holds reports whether everything the request took counts it at
// instant t: every window's bucket holds t (a window whose newest bucket
// was ahead of the request's clock counted it there, and a later rule
// may have moved its instant past an earlier window's bucket).
func (h *held) holds(rr *resourceRules, t int64) bool {
	for r := range h.reservations {
		if !r.Holds(t) {
			return false
		}
	}
	for b := range h.borrows {
		if !b.holds(t) {
			return false
		}
	}
	for i := range rr.keyed {
		if kr := &rr.keyed[i]; kr.t.Kind() == keytable.Window && h.keys[i].st != nil && t/kr.t.BucketLen() != h.keys[i].b {
			return false
		}
	}
	return true
}

// borrowedFrom reports whether one of the request's borrows is from w.
func (h *held) borrowedFrom(w *metric.Window) bool {
	for b := range h.borrows {
		if b.w == w {
			return true
		}
	}
	return false
}

func (b borrowedAt) holds(t int64) bool { return t >= b.start && t < b.start+b.w.BucketLen() }

// maxAlign bounds align's rounds: each moves the instant to a newer
// bucket some window made meanwhile, which happens at most once per bucket.
const maxAlign = 4

// align makes every rate rule that took from the request count it at
// one instant, t or later: each took at the time it could admit (a rule
// that admitted at now or borrowed a bucket before t would count the
// request before it goes, and one whose newest bucket was ahead of the
// request's clock counted it after), which would let others in past its
// threshold around the instant the request goes. Each window group
// admits it again in the bucket holding t (now, or a borrow of that later
// bucket), each GCRA rule takes its tokens at t, each Throttle rule its
// slot at t; a PerKey window must hold t already. If a window's newest
// bucket is past t, t moves there and they align again. If any rule
// cannot, the request is blocked by it (nothing was waited for yet). It
// returns the instant.
func (e *Engine) align(rr *resourceRules, h *held, p int, now, t int64, q *request) (int64, *BlockError, float64, bool) {
	n, node := q.n, rr.node
	for range maxAlign {
		h.releaseWindows(n)
		later := t
		for i := range rr.groups {
			g := &rr.groups[i]
			limit, be := g.limit(now, node)
			r, s, borrowed, ok := g.w.AdmitAt(p, now, t, n, limit)
			switch {
			case !ok:
				return t, be, float64(r.Seen()), false
			case borrowed:
				h.addBorrow(borrowedAt{g.w, s})
			default:
				h.addRes(r)
				later = max(later, r.Start())
			}
		}
		for i := range rr.keyed {
			kr := &rr.keyed[i]
			if kr.t.Kind() == keytable.Window {
				if h.keys[i].st != nil && t/kr.t.BucketLen() != h.keys[i].b {
					// A key's window cannot count ahead of its newest
					// bucket.
					return t, kr.blockError(q), 0, false
				}
				continue
			}
			kr.undo(h.keys[i], n)
			h.keys[i] = keyHeld{}
			if _, seen, _, ok := kr.admitAt(q, t, &h.keys[i]); !ok {
				return t, kr.blockError(q), seen, false
			}
		}
		for i := range rr.gcras {
			gr := &rr.gcras[i]
			if h.gcra[i] != 0 {
				gr.give(n, h.gcra[i])
				h.gcra[i] = 0
			}
			_, tok, ok, _ := gr.take(t, n, 0)
			if !ok {
				return t, gr.be, 0, false
			}
			h.gcra[i] = tok
		}
		for i := range rr.paced {
			pr := &rr.paced[i]
			pr.p.giveBack(h.paced[i])
			h.paced[i] = paceHeld{}
			rate := pr.pace(now, node)
			// A slot at t itself: no queue past it.
			ph, _, ok := reservePace(&pr.p.latest, 0, t, n, rate)
			if !ok {
				return t, pr.be, rate, false
			}
			h.paced[i] = ph
		}
		if later == t && h.holds(rr, t) {
			return t, nil, 0, true
		}
		t = later
	}
	var be *BlockError
	if len(rr.groups) > 0 {
		_, be = rr.groups[0].limit(now, node)
	}
	return t, be, 0, false
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
			st := g.keys.NoKey()
			switch {
			case spec != nil:
				st = spec
			case q.hasKey:
				st = g.keys.Get(q.key)
			}
			b, _, ok, dead := g.keys.Admit(st, now, n, limit)
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
		_, tok, ok, _ := g.gcra.take(now, n, 0)
		if !ok {
			return g.beLocal, false
		}
		h.ggcra[i] = tok
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
