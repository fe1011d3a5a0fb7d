package flow

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/callerkey"
	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/slots"
	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/metric"
)

// maxCount is the largest batch WithCount accepts: with thresholds at most
// maxThreshold, no counter can come near the top of its word.
const maxCount = 1 << 30

// ErrInvalidOption matches the error of an Entry (or Wait, Reserve, Allow)
// given an option out of range: a WithCount below 1 or above 2^30, a
// WithWait below 0 or above an hour (or any wait, for Allow), a WithKey
// empty or longer than 1024 bytes. The error names the option and the
// value. Such a request is neither admitted nor counted as blocked.
var ErrInvalidOption = errors.New("flow: invalid option")

// EntryOption modifies one Entry call. Options are plain values, so passing
// them allocates nothing.
type EntryOption struct {
	// noQueue is Allow's: no rule may make the request wait.
	noQueue  bool
	count    int64
	hasCount bool
	hasKey   bool
	hasWait  bool
	ctx      context.Context
	key      string
	wait     time.Duration
}

// request is a request's options, read.
type request struct {
	n      int64
	hasKey bool
	ctx    context.Context
	key    string
	// wait is the longest the request may wait for room under its rate
	// rules, in ns (WithWait); hasWait says a WithWait gave it.
	wait    int64
	hasWait bool
	// noQueue says no rule may make it wait (Allow): a Throttle rule
	// admits it only if its slot is now.
	noQueue bool
	// draw is a cheap random number drawn with the clock read (0: none),
	// for sampling (see keyRule.sample).
	draw uint32
}

// WithCount makes the request count as n (a batch), 1 <= n <= 2^30: it
// is admitted or blocked whole, and moves pass or block counts by n.
func WithCount(n int) EntryOption { return EntryOption{count: int64(n), hasCount: true} }

// WithWait lets the request wait up to d for room under its rate rules
// instead of being blocked (x/time/rate's Wait and Reserve), 0 <= d <=
// an hour:
//   - a Reject rule's window admits it now against the earliest later
//     bucket within d that keeps every window containing it within the
//     threshold (at most one window ahead), and it waits for that bucket
//     to start;
//   - a GCRA rule admits it if its tokens are back within d, and it waits
//     until they are;
//   - a Throttle rule queues it if its slot is within the longer of d and
//     MaxQueueing.
//
// The wait honours the request's context (WithContext). The cancel rule,
// the same for every rule and for a later rule that blocks: a request
// that is not admitted in the end gives back what it took (a GCRA rule's
// tokens and a Throttle slot only while no later request reserved after
// them; see the package doc). It never admits over a threshold. WarmUp
// rules, PerKey windows and Global rules do not make a request wait.
func WithWait(d time.Duration) EntryOption { return EntryOption{wait: d, hasWait: true} }

// longestWait is the longest wait WithWait accepts, and how long Engine.Wait
// waits at most when its context has no deadline.
const longestWait = time.Hour

// WithContext bounds any wait (throttling, borrowing) and is passed to the
// TokenSource of global rules.
func WithContext(ctx context.Context) EntryOption { return EntryOption{ctx: ctx} }

// Entry is an admitted request. Call Exit when the work is done, once. It
// is returned by value so that entering allocates nothing (see Exit for
// what copies do).
type Entry struct {
	node *stats.Node // nil: blocked, or an error
	// slot leads back to the engine: for an admission, its claim or, when
	// it holds nothing, the engine's sentinel; for a refusal, the refusing
	// rule's sentinel (its owner's be), or by a resource's single window
	// the rules' refusal sentinel (its retry time is computed when read);
	// nil for an error.
	slot *slots.Slot[site]
	// start is the admission time; for a blocked request it holds the bits
	// of the value the rule saw.
	start int64
	// meta is, for an admission: its claim's word (odd), or the count and
	// stripe hint (n<<32 | p<<2) when it holds nothing, 0 once this copy
	// exited; for a refusal: its
	// time when slot is set, else its room (see packRoom). Entry stays four
	// words, so that it is returned in registers.
	meta uint64
}

// room is what a blocked request is told about when its rule could admit
// it: the wait until then and until its window empties, in ns (-1:
// unknown).
type room struct{ retry, reset int64 }

// unknownRoom is for rules that cannot say (Concurrency, related, most
// global refusals).
var unknownRoom = room{-1, -1}

// roomWhenRead marks a window group's refusal whose room is computed when
// read (see windowGroup.refusal).
var roomWhenRead = room{-2, -2}

// roomOf turns what a window's RoomIn says into a room.
func roomOf(wait, reset time.Duration, ok bool) room {
	if !ok {
		return room{-1, int64(reset)}
	}
	return room{int64(wait), int64(reset)}
}

// blocked is the Entry of a blocked request: it records what the rule saw
// and r.
func blocked(be *BlockError, seen float64, r room) (Entry, error) {
	return Entry{slot: be.refusal, start: int64(math.Float64bits(seen)), meta: packRoom(r)}, be
}

// A room packs into one word: the retry wait + 1 in the low retryBits (0:
// unknown; in ns up to unitMax, past it in ms rounded up, with the unit
// bit set: up to 99 days), the reset + 1 in the rest (0: unknown; in ms up
// to about 6 days, past it in seconds rounded up, with its unit bit set).
// A retry or reset past what its field holds (never, from any rule) is
// reported as the most it holds.
const (
	retryBits = 34
	retryUnit = 1 << (retryBits - 1)
	resetUnit = 1 << (64 - retryBits - 1)
)

// packUnit packs d (>= 0) into a field of unit-bit u: d + 1 in fine units
// if it fits below u, else d in coarse units (rounded up) + 1, unit bit set.
func packUnit(d, fine, coarse, u int64) uint64 {
	if v := (d + fine - 1) / fine; v <= u-2 {
		return uint64(v + 1)
	}
	return uint64(u | min((d+coarse-1)/coarse, u-2) + 1)
}

func unpackUnit(v uint64, fine, coarse, u int64) int64 {
	if v&uint64(u) != 0 {
		return (int64(v&^uint64(u)) - 1) * coarse
	}
	return (int64(v) - 1) * fine
}

func packRoom(r room) uint64 {
	var m uint64
	if r.retry >= 0 {
		m = packUnit(r.retry, 1, int64(time.Millisecond), retryUnit)
	}
	if r.reset >= 0 {
		m |= packUnit(r.reset, int64(time.Millisecond), int64(time.Second), resetUnit) << retryBits
	}
	return m
}

// unpackRoom reverses packRoom (reset rounded up to the ms); -1: unknown.
func unpackRoom(m uint64) room {
	r := unknownRoom
	if v := m & (retryUnit<<1 - 1); v != 0 {
		r.retry = unpackUnit(v, 1, int64(time.Millisecond), retryUnit)
	}
	if v := m >> retryBits; v != 0 {
		r.reset = unpackUnit(v, int64(time.Millisecond), int64(time.Second), resetUnit)
	}
	return r
}

// room returns what a blocked Entry says about when to retry.
func (en *Entry) room() room {
	if en.node != nil {
		return unknownRoom
	}
	if sl := en.slot; sl != nil {
		if s := sl.Owner(); s.rr != nil {
			if s.group == 0 {
				// Refused by rr's single window at en.meta, a request of 1.
				wait, reset, ok := s.rr.single.RoomSince(int64(en.meta), 1, s.rr.singleLimit)
				return unpackRoom(packRoom(roomOf(wait, reset, ok)))
			}
			return s.groupRoom(int64(en.meta), en.start)
		}
	}
	return unpackRoom(en.meta)
}

// groupRoom is the room of a request of 1 that window group s.group-1 of
// s.rr refused at t: its own wait from t, and the waits of the rate rules
// after it, read now and counted from t, but the PerKey rules', keyed
// (from t, computed then: -1 never) when s.keyed.
func (s *site) groupRoom(t, keyed int64) room {
	rr, i := s.rr, s.group-1
	g := &rr.groups[i]
	wait, reset, ok := g.w.RoomSince(t, 1, g.static)
	rm := roomOf(wait, reset, ok)
	if rm.retry >= 0 && s.keyed {
		rm.retry = max(rm.retry, keyed)
		if keyed < 0 {
			rm.retry = -1
		}
	}
	if rm.retry >= 0 {
		now := max(s.e.now(), t)
		if later := rr.laterRetry(stageWindows|i, now, &request{n: 1}, 0, false); later < 0 {
			rm.retry = -1
		} else {
			rm.retry = max(rm.retry, later+now-t)
		}
	}
	return unpackRoom(packRoom(rm))
}

// retryAfter returns, for a blocked request, how long until the rule that
// blocked it would admit it (see Refusal.RetryAfter), and false when the
// rule cannot say or the request was admitted.
func (en *Entry) retryAfter() (time.Duration, bool) {
	r := en.room()
	return time.Duration(max(r.retry, 0)), r.retry >= 0
}

// reset returns, for a request a QPS Reject rule blocked, how long until
// everything its window holds now has left it; false otherwise.
func (en *Entry) reset() (time.Duration, bool) {
	r := en.room()
	return time.Duration(max(r.reset, 0)), r.reset >= 0
}

// Start returns the engine clock's reading when the request was admitted
// (after any wait): the instant its pass is counted at and its RT runs from.
// It is 0 for a blocked request.
func (en *Entry) Start() int64 {
	if en.node == nil {
		return 0
	}
	return en.start
}

// seen returns what the rule that decided saw: for a blocked request the
// window's committed count (passes, unused leases and borrowed; QPS rules),
// the related resource's pass rate (related rules), the in-flight count
// (Concurrency), or the rate in force (Throttle); 0 for an admitted one or
// a global refusal.
func (en *Entry) seen() float64 {
	if en.node != nil {
		return 0
	}
	if sl := en.slot; sl != nil && sl.Owner().keyed {
		// A window's refusal of 1 whose Entry carries another figure:
		// the window had nothing left.
		quota, _ := sl.Owner().be.Quota()
		return float64(quota)
	}
	return math.Float64frombits(uint64(en.start))
}

// Exit records the request's completion: Success and its RT, an Exception
// too if err is not nil, and the end of its in-flight time. Exit on the
// Entry of a blocked request, or a second time on the same Entry, does
// nothing. Copies of an Entry whose admission holds something (a
// Concurrency rule or a PerKey Concurrency rule counted it) share it: only
// the first Exit of any copy counts. Copies of any other Entry each count
// their Exit (a completion each), as copies of a value do: exit the Entry
// once, whichever copy.
func (en *Entry) Exit(err error) {
	m, node := en.meta, en.node
	if m == 0 || node == nil {
		return // exited, or not admitted
	}
	en.meta = 0 // exited: a count of 0, no claim
	failed := err != nil
	if int64(m) < 0 { // MarkError's
		m, failed = m&^markedError, true
	}
	sl := en.slot
	if m&1 != 0 {
		en.release(sl, node, m, failed)
		return
	}
	// It holds nothing: m holds its count and stripe hint.
	st := sl.Owner()
	e := st.e
	n := int64(m >> 32)
	// The clock's cached time, refreshed by Entry's reads: Exit reads it
	// without a refresh draw unless the clock says reads must refresh it.
	var now int64
	if s := e.steady; s != nil {
		now = s.Now()
	} else if now = e.cached.Load(); e.behind.Load() {
		now = e.pins.Refresh(e.coarse, now)
	}
	if rr := st.rr; rr != nil {
		// Its resource's breakers count it (st is their sentinel's site):
		// one, called directly; more, through exitBreakers.
		if bs := rr.breakers; len(bs) == 1 {
			bs[0].b.Exit(int(m>>2&(1<<30-1)), en.start, now, failed, st.probe)
		} else {
			rr.exitBreakers(int(m>>2&(1<<30-1)), en.start, now, failed, st.probe)
		}
	}
	second(node).CompleteOn(int(m>>2&(1<<30-1)), now, n, max(now-en.start, 0), failed)
	if e.adopting.Load() != 0 {
		e.releaseAdopted(node, n)
	}
}

// markedError is MarkError's bit in an admission's meta: above a claim's
// word (a generation count that never reaches it) and above the count of
// one that holds nothing (at most 2^30, from bit 32).
const markedError = 1 << 63

// MarkError marks the admitted request as failed before its Exit: Exit
// then counts it as Exit with an error does (an Exception, and a failure
// for the resource's circuit breakers), whatever error it is given. It is
// for the request whose work failed where the code that exits it cannot
// tell (a business error found deep in a handler, a response status the
// adapter does not count). On a blocked or an exited Entry it does
// nothing; it marks only this copy of the Entry.
func (en *Entry) MarkError() {
	if en.node != nil && en.meta != 0 {
		en.meta |= markedError
	}
}

// release is Exit for an admission that claimed sl with word m.
func (en *Entry) release(sl *slots.Slot[site], node *stats.Node, m uint64, failed bool) {
	e := sl.Owner().e
	hn, hp := sl.Holder()
	at := sl.At()
	kc, kt, ok := e.slots.Release(sl, m)
	if !ok {
		return // a copy exited first
	}
	n := int64(hn)
	var now int64
	if s := e.steady; s != nil {
		now = s.Now()
	} else if now = e.cached.Load(); e.behind.Load() {
		now = e.pins.Refresh(e.coarse, now)
	}
	// The completion before the concurrency ends, so that the in-flight
	// gauge never counts a request that the concurrency no longer does
	// (see Engine.adopt).
	second(node).CompleteOn(int(hp), now, n, max(now-en.start, 0), failed)
	if slots.Counted(m) {
		node.ReleaseConcurrency(n)
	} else if e.adopting.Load() != 0 {
		e.releaseAdopted(node, n)
	}
	if kc != nil {
		kt.Release(kc, n)
	}
	if at != nil {
		at.rr.exitBreakers(int(hp), en.start, now, failed, at.probe)
	}
}

// Entry checks a request for resource against the rules in force and, if
// it is admitted, counts it and returns an Entry to Exit when done. A
// blocked request gets a *BlockError (errors.Is(err, ErrBlocked)); a wait
// cut short by the context gets the context's error; an option out of
// range gets an error matching ErrInvalidOption, an empty or overlong name
// one matching stat.ErrInvalidName, and a new resource past the registry cap one matching
// stat.ErrTooManyResources; in every error case nothing is held and Exit on
// the Entry does nothing.
func (e *Engine) Entry(resource string, opts ...EntryOption) (Entry, error) {
	rr := e.ruleSet().byResource[resource]
	if rr != nil {
		if len(opts) == 0 {
			if rr.single != nil {
				return e.enterSingle(rr, 1)
			}
			if rr.breakersOnly {
				return e.enterBreakersOnly(rr)
			}
		}
		return e.enter(rr, rr.node, opts)
	}
	return e.enterNew(resource, opts)
}

// enterNew is Entry on a resource without rules.
func (e *Engine) enterNew(resource string, opts []EntryOption) (Entry, error) {
	node, err := e.registry.Node(resource)
	if err != nil {
		return Entry{}, err
	}
	if len(opts) == 0 {
		return e.enterNone(node), nil
	}
	return e.enter(nil, node, opts)
}

// Wait is Entry for a request that waits for room under its rate rules
// rather than being blocked, as long as ctx allows: up to ctx's deadline,
// or an hour when it has none (see WithWait for what each rule does and
// the cancel rule). It returns at once, blocked, when no wait within that
// would admit the request; ctx ending during the wait returns ctx's error
// with everything taken given back, and a ctx already ended returns its
// error at once, admitting nothing (as x/time/rate's Wait). opts may add
// WithCount or WithKey; a WithWait among them bounds the wait further.
func (e *Engine) Wait(ctx context.Context, resource string, opts ...EntryOption) (Entry, error) {
	e.ruleSet()
	if err := ctx.Err(); err != nil {
		return Entry{}, err
	}
	var buf [8]EntryOption
	return e.Entry(resource, waitOptions(buf[:0], ctx, opts)...)
}

// Allow reports whether one request (or WithCount's batch) may go now,
// without a wait: nil when it was admitted, the refusing rule's
// *BlockError (matching ErrBlocked) with the Refusal that describes it, or
// an option's error. It is the call that needs no Exit (x/time/rate's
// Allow), for a resource whose rules count rates, not requests in flight:
// an admitted request counts as a pass, and as nothing else (no Success,
// no RT), and it is never in flight (Snapshot's Inflight, and what a
// Concurrency rule loaded later finds, leave it out). A Throttle rule
// admits it only if its slot is now. It takes Entry's options but refuses
// a wait (ErrInvalidOption): waiting is Wait's. On a resource with a
// Concurrency or PerKey Concurrency rule it returns an error matching
// ErrNeedsExit, counting the request as blocked: those rules count a
// request until its Exit. Like Entry it allocates nothing.
func (e *Engine) Allow(resource string, opts ...EntryOption) (Refusal, error) {
	var buf [8]EntryOption
	o, err := allowOptions(buf[:0], opts)
	if err != nil {
		return Refusal{}, err
	}
	rr := e.ruleSet().byResource[resource]
	if rr == nil {
		en, err := e.enterNew(resource, o)
		return allowed(&en, err)
	}
	if rr.needsExit != nil {
		return Refusal{}, e.needsExit(rr, o)
	}
	en, err := e.enter(rr, rr.node, o)
	return allowed(&en, err)
}

// Allow is Engine.Allow on this resource.
func (r *Resource) Allow(opts ...EntryOption) (Refusal, error) {
	var buf [8]EntryOption
	o, err := allowOptions(buf[:0], opts)
	if err != nil {
		return Refusal{}, err
	}
	e := r.eng
	if rr := r.current(); rr != nil {
		if rr.needsExit != nil {
			return Refusal{}, e.needsExit(rr, o)
		}
		en, err := e.enter(rr, rr.node, o)
		return allowed(&en, err)
	}
	en, err := r.enterPlain(o)
	return allowed(&en, err)
}

// needsExit counts Allow's request of opts on rr, whose rules need Exit,
// as blocked (a rule reload that gave an Allow resource a Concurrency rule
// shows in its statistics, not as an absence of traffic) and returns the
// error.
func (e *Engine) needsExit(rr *resourceRules, opts []EntryOption) error {
	q := request{n: 1}
	if err := parseOptions(&q, opts); err != nil {
		return err
	}
	p, now := e.pinNow()
	e.count(rr.node, p, now, metric.Block, q.n)
	return rr.needsExit
}

// ErrNeedsExit matches the error of Allow on a resource whose rules count
// requests in flight (a Concurrency or PerKey Concurrency rule): they
// count a request until its Exit, which Allow never makes. Use Entry and
// Exit there.
var ErrNeedsExit = errors.New("flow: the resource's rules need Exit")

// allowOptions appends to buf Allow's options: opts, which must not wait,
// and the one that lets no rule queue the request.
func allowOptions(buf, opts []EntryOption) ([]EntryOption, error) {
	for i := range opts {
		if o := &opts[i]; o.hasWait && o.wait != 0 {
			return nil, errAllowWaits
		}
	}
	return append(append(buf, opts...), EntryOption{noQueue: true}), nil
}

// errAllowWaits is Allow's error for a wait option.
var errAllowWaits = fmt.Errorf("%w: Allow does not wait (WithWait)", ErrInvalidOption)

// allowed ends Allow's Entry: an admission (which holds nothing: Allow
// refuses the rules that would claim) ends at once, without a completion.
func allowed(en *Entry, err error) (Refusal, error) {
	if err != nil {
		return en.Refusal(), err
	}
	m, node := en.meta, en.node
	n := int64(m >> 32)
	node.AddAllowed(int(m>>2&(1<<30-1)), n)
	if e := en.slot.Owner().e; e.adopting.Load() != 0 {
		// A Concurrency rule loaded meanwhile may have counted it in
		// flight (see Engine.adopt): it ends as an Exit would.
		e.releaseAdopted(node, n)
	}
	return Refusal{}, nil
}

// Wait is Engine.Wait on this resource.
func (r *Resource) Wait(ctx context.Context, opts ...EntryOption) (Entry, error) {
	if err := ctx.Err(); err != nil {
		return Entry{}, err
	}
	var buf [8]EntryOption
	return r.Entry(waitOptions(buf[:0], ctx, opts)...)
}

// waitOptions appends to buf the options of a Wait on ctx: ctx and a
// WithWait up to its deadline, then opts, each WithWait among them cut to
// that deadline (the last WithWait given wins).
func waitOptions(buf []EntryOption, ctx context.Context, opts []EntryOption) []EntryOption {
	d := longestWait
	if dl, ok := ctx.Deadline(); ok {
		d = min(max(time.Until(dl), 0), longestWait)
	}
	buf = append(buf, WithContext(ctx), WithWait(d))
	for _, o := range opts {
		if o.hasWait {
			o.wait = min(o.wait, d)
		}
		buf = append(buf, o)
	}
	return buf
}

// Resource is a handle on one resource of an engine. Entry through it skips
// the lookup of the name (a hash of the string per call), so hot paths that
// know their resource up front should keep one. It follows rule reloads,
// and if the registry lets its resource go while it is idle, its next Entry
// registers it again. It is safe for simultaneous use.
type Resource struct {
	eng   *Engine
	name  string
	node  atomic.Pointer[stats.Node]
	rules atomic.Pointer[resourceCache]
}

// resourceCache is the resource's rules under one rule set; it is replaced
// when the rule set changes.
type resourceCache struct {
	set *ruleSet
	rr  *resourceRules
}

// Resource returns a handle on resource, creating its statistics if needed
// (errors as for Entry).
func (e *Engine) Resource(name string) (*Resource, error) {
	e.ruleSet()
	node, err := e.registry.Node(name)
	if err != nil {
		return nil, err
	}
	r := &Resource{eng: e, name: name}
	r.node.Store(node)
	return r, nil
}

// Entry is Engine.Entry for this resource.
func (r *Resource) Entry(opts ...EntryOption) (Entry, error) {
	e := r.eng
	// current, spelled out: the call would not inline.
	c := r.rules.Load()
	if set := e.rules.Load(); c == nil || c.set != set {
		c = r.cache(set)
	}
	if rr := c.rr; rr != nil {
		if len(opts) == 0 {
			if rr.single != nil {
				return e.enterSingle(rr, 1)
			}
			if rr.breakersOnly {
				return e.enterBreakersOnly(rr)
			}
		}
		return e.enter(rr, rr.node, opts)
	}
	return r.enterPlain(opts)
}

// current returns the resource's rules in force (nil: none), cached per
// rule set.
func (r *Resource) current() *resourceRules {
	c := r.rules.Load()
	if set := r.eng.rules.Load(); c == nil || c.set != set {
		c = r.cache(set)
	}
	return c.rr
}

// cache makes the resource's rules under set the ones its Entry reads:
// one small allocation per reload, not per request.
func (r *Resource) cache(set *ruleSet) *resourceCache {
	c := &resourceCache{set: set, rr: set.byResource[r.name]}
	r.rules.Store(c)
	return c
}

// enterPlain is Entry on a resource without rules.
func (r *Resource) enterPlain(opts []EntryOption) (Entry, error) {
	node := r.node.Load()
	if node.Dropped() {
		// Registered again within the cap, as a new resource would be.
		n, err := r.eng.registry.Node(r.name)
		if err != nil {
			return Entry{}, err
		}
		r.node.Store(n)
		node = n
	}
	if len(opts) == 0 {
		// enterNone, spelled out: a call less.
		e := r.eng
		p, now := e.pinNow()
		second(node).AddOn(p, now, metric.Pass, 1)
		if node.Dropped() {
			node = e.recount(node, p, now, metric.Pass, 1)
		}
		return Entry{node: node, slot: e.none, start: now, meta: holdsNothing(1, p)}, nil
	}
	return r.eng.enter(nil, node, opts)
}

// parseOptions reads a request's options into q.
func parseOptions(q *request, opts []EntryOption) error {
	for i := range opts {
		o := &opts[i]
		if o.hasCount {
			q.n = o.count
		}
		q.noQueue = q.noQueue || o.noQueue
		if o.ctx != nil {
			q.ctx = o.ctx
		}
		if o.hasKey {
			q.key, q.hasKey = o.key, true
		}
		if o.hasWait {
			if o.wait < 0 || o.wait > longestWait {
				return fmt.Errorf("%w: WithWait must be in [0, 1h], got %v", ErrInvalidOption, o.wait)
			}
			q.wait, q.hasWait = int64(o.wait), true
		}
	}
	if q.n < 1 || q.n > maxCount {
		return fmt.Errorf("%w: WithCount must be in [1, 2^30], got %d", ErrInvalidOption, q.n)
	}
	if q.hasKey && (q.key == "" || len(q.key) > maxKeyLen) {
		return fmt.Errorf("%w: WithKey must be 1 to 1024 bytes, got %d bytes", ErrInvalidOption, len(q.key))
	}
	if len(q.key) > callerkey.MaxLen {
		q.key = callerkey.Bound(q.key)
	}
	return nil
}

// readOptions reads opts into q: one WithKey of at most
// callerkey.MaxLen bytes (a per-key request's usual options) without a
// call.
func (e *Engine) readOptions(q *request, opts []EntryOption) error {
	if len(opts) == 1 {
		if o := &opts[0]; o.hasKey && !o.hasCount && !o.hasWait && !o.noQueue && o.ctx == nil && uint(len(o.key)-1) < callerkey.MaxLen {
			q.key, q.hasKey = o.key, true
			return nil
		}
	}
	return parseOptions(q, opts)
}

// pinNow returns the caller's stripe hint and the time: the clock's cached
// value, refreshed on one read in refreshMask+1 (a cheap draw) or while
// the clock says every read must (see clocks.Coarse; any other clock is
// read every time). enterSingle spells it out: a call would not inline.
func (e *Engine) pinNow() (int, int64) {
	p, _, now := e.pinDrawNow()
	return p, now
}

// pinDrawNow is pinNow and its draw, for a request to sample with.
func (e *Engine) pinDrawNow() (int, uint32, int64) {
	p, r := cpu.PinRand()
	var now int64
	if s := e.steady; s != nil {
		now = s.Now()
	} else if now = e.cached.Load(); r&e.refreshMask == 0 || e.behind.Load() {
		now = e.pins.Refresh(e.coarse, now)
	}
	return p, r, now
}

// WithKey names the caller a request comes from (a user ID, an API key, a
// client address: see AddrKey), for the resource's PerKey rules; on a
// resource without them it changes nothing, but an empty key, or one
// longer than 1024 bytes, is an error (ErrInvalidOption) on every resource.
// A key longer than 256 bytes stands for its first 64 bytes, "~sha256:"
// and 32 hex digits of its SHA-256 (as a rule's listed Keys do, and the
// HTTP and gRPC adapters for any length): a hash and an allocation per
// request. No key bytes are kept (a tracked key is two hashes of it), so
// key may point into a buffer the caller reuses.
func WithKey(key string) EntryOption { return EntryOption{key: key, hasKey: true} }
