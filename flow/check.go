package flow

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/internal/pace"
	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/internal/window"

	"github.com/leapflow/leapflow/metric"
)

// enter checks a request against rr (nil: no rules) and counts it on
// node.
func (e *Engine) enter(rr *resourceRules, node *stats.Node, opts []EntryOption) (Entry, error) {
	q := request{n: 1}
	if len(opts) > 0 {
		if err := e.readOptions(&q, opts); err != nil {
			return Entry{}, err
		}
	}
	n := q.n
	if rr != nil && rr.single != nil && q.wait == 0 {
		return e.enterSingle(rr, n)
	}
	p, d, now := e.pinDrawNow()
	q.draw = d
	if rr == nil {
		node = e.count(node, p, now, metric.Pass, n)
		return e.admitted(node, p, now, n, false, nil, nil), nil
	}
	if gr := rr.singleGCRA; gr != nil && q.wait == 0 {
		// One GCRA rule: one compare-and-swap, the pass or block counted
		// on the node.
		_, _, ok, rm := gr.takeOn(p, now, n, 0)
		ev := metric.Pass
		if !ok {
			ev = metric.Block
		}
		node = e.count(node, p, now, ev, n)
		if !ok {
			return blocked(gr.be, 0, rm)
		}
		return e.admitted(node, p, now, n, false, nil, nil), nil
	}
	if kr := rr.singleKey; kr != nil {
		// One PerKey window: one admission on the key, the pass or block
		// counted on the node.
		keyless(node, &q)
		var kh keyHeld
		ev := metric.Pass
		seen, rm, ok := kr.admitWindow(&q, now, &kh)
		if !ok {
			ev = metric.Block
		}
		if ok && len(rr.globals) > 0 {
			// Then the Global rules, last as in take.
			return e.globalsAfterKey(rr, p, max(now, kh.start()), &q, kh)
		}
		// count, spelled out: the call would not inline.
		second(node).AddOn(p, now, ev, n)
		if node.Dropped() {
			node = e.recount(node, p, now, ev, n)
		}
		if !ok {
			return blocked(kr.blockError(&q), seen, rm)
		}
		// A now behind the key's newest bucket was counted in it. (The
		// Entry admitted makes, spelled out: it holds nothing.)
		return Entry{node: node, slot: e.none, start: max(now, kh.start()), meta: holdsNothing(n, p)}, nil
	}
	return e.check(rr, p, now, &q)
}

// enterSingle is enter for a request of n that does not wait, on a
// resource whose rules are Reject limits on one window (rr.single): one
// admission, nothing to give back, and for a refusal a retry time
// computed only if it is read.
func (e *Engine) enterSingle(rr *resourceRules, n int64) (Entry, error) {
	p, d := cpu.PinRand()
	var now int64 // pinNow, spelled out
	if s := e.steady; s != nil {
		now = s.Now()
	} else if now = e.cached.Load(); d&e.refreshMask == 0 || e.behind.Load() {
		now = e.pins.Refresh(e.coarse, now)
	}
	if g := rr.system; g != nil {
		if i, ok := g.admits(now); !ok {
			return e.refuseSystem(rr, p, now, n, i)
		}
	}
	r, ok := rr.single.AdmitOn(p, now, n, rr.singleLimit)
	if !ok {
		return e.refuseSingle(rr, p, now, n, r.Seen())
	}
	// A now behind the newest bucket was counted in it: start there.
	now = max(now, r.Start())
	slot := e.none
	if rr.singleBreakers {
		if !rr.breakersClosed() {
			return e.enterBreakers(rr, p, now, n, r)
		}
		slot = rr.brkSlot // their Exit counts it
	}
	node := rr.node
	if rr.singleApart {
		node = e.count(node, p, now, metric.Pass, n)
	} else if node.Dropped() {
		// The window that admitted it is the node's: if a reload let the
		// node go meanwhile, count it again on the live one (see count).
		node = e.recount(node, p, now, metric.Pass, n)
	}
	return Entry{node: node, slot: slot, start: now, meta: holdsNothing(n, p)}, nil
}

// enterNone is Entry of one on a resource without rules: its pass counted
// on node, nothing checked, nothing held.
func (e *Engine) enterNone(node *stats.Node) Entry {
	p, now := e.pinNow()
	node = e.count(node, p, now, metric.Pass, 1)
	return Entry{node: node, slot: e.none, start: now, meta: holdsNothing(1, p)}
}

// globalsAfterKey ends a request that a resource's one PerKey rule
// admitted under key state kh (at now, the key's bucket) and that its
// Global rules decide: take's last step, then finish.
func (e *Engine) globalsAfterKey(rr *resourceRules, p int, now int64, q *request, kh keyHeld) (Entry, error) {
	var h held
	h.keys[0] = kh
	var rf refusal
	if !e.takeGlobals(rr, &h, p, now, q, &rf) {
		rf.at |= stageGlobal
		return e.block(rr, &h, p, now, q, rf)
	}
	return e.finish(rr, &h, p, now, 0, false, q)
}

// holdsNothing is the meta word of an admission of n on stripe p that
// holds nothing (see Entry): the low two bits, a claim's flags, clear.
func holdsNothing(n int64, p int) uint64 { return uint64(n)<<32 | uint64(p&(1<<30-1))<<2 }

// refuseSingle counts enterSingle's refusal and returns its Entry: the
// retry time is computed from it when read (see Entry.Refusal).
func (e *Engine) refuseSingle(rr *resourceRules, p int, now, n, seen int64) (Entry, error) {
	// count, spelled out: the call would not inline, and a refusal costs
	// no more than an admission.
	second(rr.node).AddOn(p, now, metric.Block, n)
	if rr.node.Dropped() {
		e.recount(rr.node, p, now, metric.Block, n)
	}
	// Its rules are limits on one window: the least one's wait is every
	// rule's.
	if n != 1 {
		// The Entry has no room for the count: say it now.
		return blocked(rr.singleBE, float64(seen), roomOf(rr.single.RoomIn(now, n, rr.singleLimit)))
	}
	return Entry{slot: rr.refusal, start: int64(math.Float64bits(float64(seen))), meta: uint64(max(now, 0))}, rr.singleBE
}

// count counts event ev of n on node's second window and returns the node
// it counted on: if the registry let node go meanwhile (the rule set this
// request read was replaced, or the resource went idle during a wait), the
// count went to a node no one reads and is made again on the live one.
func (e *Engine) count(node *stats.Node, p int, now int64, ev metric.Event, n int64) *stats.Node {
	second(node).AddOn(p, now, ev, n)
	if node.Dropped() {
		node = e.recount(node, p, now, ev, n)
	}
	return node
}

// admitted returns the Entry of an admission; counted says whether a
// Concurrency rule counted it, kc is the key state a PerKey Concurrency
// rule counted it in (Exit releases both). Only those claim a slot.
func (e *Engine) admitted(node *stats.Node, p int, start, n int64, counted bool, kc *keytable.State, kt *keytable.Table) Entry {
	if !counted && kc == nil {
		return Entry{node: node, slot: e.none, start: start, meta: holdsNothing(n, p)}
	}
	sl, w := e.slots.Claim(p, int32(n), counted, kc, kt, nil)
	return Entry{node: node, slot: sl, start: start, meta: w}
}

// recount counts event ev again on the live node of a resource whose node
// the registry let go while the request counted on it (see stats.Registry):
// the first count went to a node no one reads.
func (e *Engine) recount(node *stats.Node, p int, now int64, ev metric.Event, n int64) *stats.Node {
	for node.Dropped() {
		node = e.pins.Replace(e.registry, node)
		second(node).AddOn(p, now, ev, n)
	}
	return node
}

// held is what a request has taken so far, to give back if a later check
// blocks it or its wait is cancelled. It lives on the stack; only a
// resource with more than two windows spills into more.
type held struct {
	conc  bool
	nres  int
	res   [2]window.Reservation
	more  []window.Reservation
	nbor  int
	bor   [2]borrowedAt // admissions borrowed from later buckets (WithWait)
	bmore []borrowedAt
	paced [maxPacedRules]pace.Held // slots, by index into rr.paced
	gcra  [maxGCRARules]int64      // arrival times set (0: none), by index into rr.gcras
	gres  [maxGlobalRules]window.Reservation
	ggcra [maxGlobalRules]int64   // set by Global GCRA rules' local fallbacks
	gkeys [maxGlobalRules]keyHeld // PerKey global rules' local fallbacks
	kc    *keytable.State         // counted by the PerKey Concurrency rule
	keys  [maxKeyRules]keyHeld
	// probes are the breakers (by index into rr.breakers) whose probe the
	// request is, taken at probeAt.
	probes  uint8
	probeAt int64
}

// release gives back everything the request took from rr's rules: each
// kind gives back what it holds.
func (e *Engine) release(rr *resourceRules, h *held, n int64) {
	passed := !h.conc && rr.countsNode && h.nres > 0
	if h.releaseWindows(n, second(rr.node)) && !h.conc {
		// A borrow the node's window had folded in: a pass, given back.
		passed = true
	}
	if h.conc {
		// After its pass is given back, and after an adopt that may have
		// read that pass (see stats.Node.ReleaseGivenBack).
		rr.node.ReleaseGivenBack(n)
	}
	if passed && e.adopting.Load() != 0 {
		// Its pass on the node, given back above, may be in a count a
		// Concurrency rule adopted since (see Engine.adopt): it ends as
		// an Exit would, after the gauge no longer counts it.
		e.releaseAdopted(rr.node, n)
	}
	if len(rr.paced) > 0 {
		rr.releasePaced(h)
	}
	if len(rr.gcras) > 0 {
		rr.releaseGCRAs(h, n)
	}
	if len(rr.globals) > 0 {
		rr.releaseGlobals(h, n)
	}
	if h.kc != nil || len(rr.keyed) > 0 {
		rr.releaseKeyed(h, n)
	}
	if h.probes != 0 {
		rr.releaseBreakers(h)
	}
}

// block gives back what the request took and counts it blocked by the
// rule rf names. It is told to retry when the refusing rule would admit
// it and every rate rule after it in take's order would too (those before
// it admitted it; see laterRetry).
func (e *Engine) block(rr *resourceRules, h *held, p int, now int64, q *request, rf refusal) (Entry, error) {
	n := q.n
	e.release(rr, h, n)
	rm := rf.rm
	if rm == roomWhenRead {
		// Told when read: the group's refusal, its time; the PerKey rules'
		// waits now, as the key is not kept (a refusal of 1 by a window
		// leaves nothing remaining: what the window saw is not needed).
		e.count(rr.node, p, now, metric.Block, n)
		g := &rr.groups[rf.at&0xff]
		if len(rr.keyed) == 0 {
			return Entry{slot: g.refusal, start: int64(math.Float64bits(rf.seen)), meta: uint64(max(now, 0))}, rf.be
		}
		keyed := rr.keyedRetry(0, now, q, 0)
		return Entry{slot: g.refusalKeyed, start: keyed, meta: uint64(max(now, 0))}, rf.be
	}
	if rr.rateRules > 0 && rm.retry >= 0 && rr.rules > 1 {
		rm.retry = rr.laterRetry(rf.at, now, q, rm.retry, true)
	}
	e.count(rr.node, p, now, metric.Block, n)
	return blocked(rf.be, rf.seen, rm)
}

// The stages of take, in its order: a refusal's at is its stage << 8 |
// the refusing rule's index among its kind's rules.
const (
	stageSystem = iota << 8
	stageKeyConcurrency
	stageConcurrency
	stageWindows
	stageKeyed
	stageGCRA
	stageRelated
	stagePaced
	stageBreaker
	stageGlobal
)

// laterRetry is the longest of retry and the waits from now until each
// rate rule after the one at at would admit the request, taking nothing
// (the PerKey rules only if keys); -1 when one never would or cannot say
// (a WarmUp or WarmUpThrottle rule: its limit moves while the caller
// waits). Global rules are not asked (their source would be; they come
// after every local rule), nor related-resource rules, which cannot say.
// Reading costs at most what their admission would have: a refusal costs
// no more than an admission.
func (rr *resourceRules) laterRetry(at int, now int64, q *request, retry int64, keys bool) int64 {
	from := func(stage int) int {
		switch {
		case at&^0xff == stage:
			return at&0xff + 1
		case at < stage:
			return 0
		}
		return math.MaxInt
	}
	n := q.n
	for i := from(stageWindows); i < len(rr.groups); i++ {
		g := &rr.groups[i]
		if len(g.warm) > 0 {
			return -1 // its limit moves while the caller waits
		}
		limit, _ := g.limit(now, rr.node)
		w, _, ok := g.w.RoomIn(now, n, limit)
		if !ok {
			return -1
		}
		retry = max(retry, int64(w))
	}
	if keys {
		if retry = rr.keyedRetry(from(stageKeyed), now, q, retry); retry < 0 {
			return -1
		}
	}
	for i := from(stageGCRA); i < len(rr.gcras); i++ {
		w := rr.gcras[i].l.Room(now, n)
		if w < 0 {
			return -1
		}
		retry = max(retry, w)
	}
	for i := from(stagePaced); i < len(rr.paced); i++ {
		pr := &rr.paced[i]
		if pr.warm != nil {
			return -1 // its rate moves while the caller waits
		}
		queue := pr.maxQueue
		if q.noQueue {
			queue = 0
		}
		w := pr.p.Room(now, n, pr.pace(now, rr.node), queue)
		if w < 0 {
			return -1
		}
		retry = max(retry, w)
	}
	if from(stageBreaker) == 0 {
		retry = rr.breakersWait(now, retry)
	}
	return retry
}

// keyedRetry is the longest of retry and the waits from now until each
// PerKey rate rule from the one at index i on would admit the request
// under its key; -1 when one never would.
func (rr *resourceRules) keyedRetry(i int, now int64, q *request, retry int64) int64 {
	for ; i < len(rr.keyed); i++ {
		w := rr.keyed[i].room(q, now)
		if w < 0 {
			return -1
		}
		retry = max(retry, w)
	}
	return retry
}

// check runs every rule of a resource: concurrency, windows, related
// resources, pacing, then global, and waits last if any of them queued the
// request.
func (e *Engine) check(rr *resourceRules, p int, now int64, q *request) (Entry, error) {
	if len(rr.groups) > 2 {
		return e.checkMany(rr, p, now, q)
	}
	var h held
	return e.checkHeld(rr, &h, p, now, q)
}

// checkMany is check for a resource with more windows than held keeps in
// place: the rest go in arrays from a pool (escape analysis cannot keep
// them on the stack: what held points to leaves it), so that in the steady
// state nothing is allocated. Only such resources pay for the pool.
func (e *Engine) checkMany(rr *resourceRules, p int, now int64, q *request) (Entry, error) {
	m := manyPool.Get().(*heldMore)
	var h held
	h.more, h.bmore = m.res[:0], m.bor[:0]
	en, err := e.checkHeld(rr, &h, p, now, q)
	// Nothing keeps them past the request: clear and give them back.
	clear(m.res[:])
	clear(m.bor[:])
	manyPool.Put(m)
	return en, err
}

// heldMore is the room for a request's window admissions and borrows past
// the first two, up to maxWindows.
type heldMore struct {
	res [maxWindows - 2]window.Reservation
	bor [maxWindows - 2]borrowedAt
}

var manyPool = sync.Pool{New: func() any { return new(heldMore) }}

// checkHeld is check, holding in h.
func (e *Engine) checkHeld(rr *resourceRules, h *held, p int, now int64, q *request) (Entry, error) {
	now, wait, en, err := e.take(rr, h, p, now, q)
	if err != nil {
		return en, err
	}
	return e.finish(rr, h, p, now, wait, false, q)
}

// refusal is what the rule that refused a request says: its error, the
// value it saw (Refusal.Remaining is read from it) and when to retry.
type refusal struct {
	be   *BlockError
	seen float64
	rm   room
	// at is where the refusing rule is in take's order: the refusing
	// rule's index among its kind's (take adds the stage).
	at int
}

// take runs every rule of a resource, kind by kind: per-key concurrency,
// concurrency, windows, per-key rates, GCRA, related resources, pacing,
// then global, and aligns what they took to one instant. It returns the
// instant's start (now, moved to a newer bucket a window counted it in)
// and how long after it the request goes, or, when a rule blocks it, the
// blocked Entry and error with everything given back.
func (e *Engine) take(rr *resourceRules, h *held, p int, now int64, q *request) (int64, int64, Entry, error) {
	if rr.hasKeyed() {
		keyless(rr.node, q)
	}
	var wait int64
	var rf refusal
	ok, stage := true, 0
	if rr.system != nil {
		// First: a request the system rules shed takes nothing.
		var i int
		if i, ok = rr.system.admits(now); !ok {
			rf, stage = rr.system.refusal(i), stageSystem
		}
	}
	if ok && rr.keyConc.t != nil {
		ok, stage = rr.takeKeyConcurrency(h, now, q, &rf), stageKeyConcurrency
	}
	if ok && rr.concLimit >= 0 {
		ok, stage = rr.takeConcurrency(h, now, q.n, &rf), stageConcurrency
	}
	if ok && len(rr.groups) > 0 {
		now, wait, ok = rr.takeWindows(h, p, now, q, &rf)
		stage = stageWindows
	}
	if ok && len(rr.keyed) > 0 {
		now, wait, ok = rr.takeKeyed(h, now, wait, q, &rf)
		stage = stageKeyed
	}
	if ok && len(rr.gcras) > 0 {
		wait, ok = rr.takeGCRAs(h, p, now, wait, q, &rf)
		stage = stageGCRA
	}
	if ok && len(rr.related) > 0 {
		ok, stage = rr.takeRelated(now, q.n, &rf), stageRelated
	}
	if ok && len(rr.paced) > 0 {
		wait, ok = rr.takePaced(h, now, wait, q, &rf)
		stage = stagePaced
	}
	if !ok {
		rf.at |= stage
		return blockTake(e, rr, h, p, now, q, rf)
	}
	if t := now + wait; (wait > 0 && rr.rateRules > 1) || !h.holds(rr, t) {
		// Every rule counts the request at the instant it goes: the
		// latest any of them asked for, or the newest bucket another
		// window already has.
		t, rf, ok := e.align(rr, h, p, now, t, q)
		if !ok {
			return blockTake(e, rr, h, p, now, q, rf)
		}
		wait = t - now
	}
	if len(rr.breakers) > 0 {
		// After every other local rule admitted the request, at the
		// instant it goes (a request they refuse is never a probe), and
		// before the Global rules (a breaker's refusal costs no call out).
		probes, ok := rr.takeBreakers(now+wait, &rf)
		if !ok {
			rf.at |= stageBreaker
			return blockTake(e, rr, h, p, now, q, rf)
		}
		h.probes, h.probeAt = probes, now+wait
	}
	if len(rr.globals) > 0 && !e.takeGlobals(rr, h, p, now, q, &rf) {
		// Last, once every local rule admitted the request at its
		// instant: one a local rule refuses takes nothing from the
		// shared limit (a source's admission is not given back), and
		// costs no call out.
		rf.at |= stageGlobal
		return blockTake(e, rr, h, p, now, q, rf)
	}
	return now, wait, Entry{}, nil
}

// blockTake is block for take's results.
func blockTake(e *Engine, rr *resourceRules, h *held, p int, now int64, q *request, rf refusal) (int64, int64, Entry, error) {
	en, err := e.block(rr, h, p, now, q, rf)
	return 0, 0, en, err
}

// finish waits wait from now for a request take admitted, honouring its
// context (giving everything back if it ends), then counts the admission.
// early says the caller may be ahead of the instant (a Reservation entered
// before its Delay): the resource's statistics then count it when it
// runs, not at the instant, which would make a bucket in the future.
func (e *Engine) finish(rr *resourceRules, h *held, p int, now, wait int64, early bool, q *request) (Entry, error) {
	node, n, ctx := rr.node, q.n, q.ctx
	if wait > 0 {
		if ctx == nil {
			ctx = context.Background()
		}
		// Sleep until the instant now+wait, not wait from whenever this
		// runs: now may be stale (the goroutine was descheduled since it
		// read the clock), and the sleep is then at most WithWait (more
		// only by a clock step back the engine absorbed: under 100 ms).
		// An instant already past sleeps not at all, but a context
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
		e.shade(rr, p, ran, q, rr.countsNode)
	}
	if !rr.countsNode {
		node = e.count(node, p, ran, metric.Pass, n)
	} else if node.Dropped() {
		// A window admitted it on the node: recounted as in count.
		node = e.recount(node, p, ran, metric.Pass, n)
	}
	if h.conc && node != rr.node {
		// Its concurrency was taken on the node let go: it moves with the
		// pass to the live node, where Exit gives it back.
		rr.node.ReleaseConcurrency(n)
		node.AcquireConcurrency(n, math.MaxInt64)
	}
	if h.nbor > 0 && !h.borrowedFrom(second(node)) {
		// It waited for a later bucket of a window of its own (a
		// span-exact one): the resource counts it as occupied too, as
		// the fold does in its second window.
		second(node).AddOn(p, ran, metric.OccupiedPass, n)
	}
	if len(rr.breakers) > 0 {
		// Its Exit is counted by the breakers: its slot leads back to them.
		return e.admittedBreakers(rr, node, p, now, n, h.conc, h.kc, h.probes != 0), nil
	}
	return e.admitted(node, p, now, n, h.conc, h.kc, rr.keyConc.t), nil
}

// admittedBreakers is admitted on a resource with breakers: its Entry's
// slot (the resource's breaker sentinel, or a claim that records it) leads
// its Exit back to them.
func (e *Engine) admittedBreakers(rr *resourceRules, node *stats.Node, p int, start, n int64, counted bool, kc *keytable.State, probe bool) Entry {
	st, sent := &rr.brkSite, rr.brkSlot
	if probe {
		st, sent = &rr.probeSite, rr.probeSlot
	}
	if !counted && kc == nil {
		return Entry{node: node, slot: sent, start: start, meta: holdsNothing(n, p)}
	}
	sl, w := e.slots.Claim(p, int32(n), counted, kc, rr.keyConc.t, st)
	return Entry{node: node, slot: sl, start: start, meta: w}
}

// holds reports whether everything the request took counts it at
// instant t: every window's bucket holds t (a window whose newest bucket
// was ahead of the request's clock counted it there, and a later rule
// may have moved its instant past an earlier window's bucket).
func (h *held) holds(rr *resourceRules, t int64) bool {
	return h.windowsHold(t) && (len(rr.keyed) == 0 || h.keyedHold(rr, t))
}

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
func (e *Engine) align(rr *resourceRules, h *held, p int, now, t int64, q *request) (int64, refusal, bool) {
	n := q.n
	for range maxAlign {
		h.releaseWindows(n, nil)
		var rf refusal
		later, ok := rr.alignWindows(h, p, now, t, n, &rf)
		if ok && len(rr.keyed) > 0 {
			ok = rr.alignKeyed(h, t, q, &rf)
		}
		if ok && len(rr.gcras) > 0 {
			ok = rr.alignGCRAs(h, p, t, n, &rf)
		}
		if ok && len(rr.paced) > 0 {
			ok = rr.alignPaced(h, now, t, n, &rf)
		}
		if !ok {
			return t, rf, false
		}
		if later == t && h.holds(rr, t) {
			return t, refusal{}, true
		}
		t = later
	}
	rf := refusal{rm: unknownRoom}
	if len(rr.groups) > 0 {
		_, rf.be = rr.groups[0].limit(now, rr.node)
	}
	return t, rf, false
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
