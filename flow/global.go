package flow

import (
	"context"
	"fmt"
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/internal/window"
)

// TokenSource decides global rules across instances (the Redis layer
// implements it). Acquire asks for n admissions of the rule's threshold in
// its interval (for a GCRA rule, n tokens of its shared bucket: see
// GlobalRequest.GCRA); it returns false when the global limit is reached and an
// error when it cannot decide (the rule's Fallback then applies). It must be
// safe for simultaneous use and should return within a short timeout of its
// own.
type TokenSource interface {
	Acquire(ctx context.Context, req GlobalRequest) (bool, error)
}

// GlobalRequest is one question to a TokenSource.
type GlobalRequest struct {
	// Key identifies the limit: "id:" and the rule's ID, or, for a rule
	// without one, "resource:" and its resource. Instances that load the
	// same rule ask for the same limit whatever its threshold.
	Key       string
	Resource  string
	Threshold float64
	Interval  time.Duration
	Count     int64
	// LocalShare is the part of Threshold the rule admits locally while
	// the source fails (FallbackLocal; 0 otherwise): a source may keep
	// it for this instance from the others while it cannot be reached.
	LocalShare float64
	// PerKey is set for a PerKey rule: Threshold applies to each caller
	// key separately (a key the rule lists in Keys has its own Threshold
	// in the request), and Caller names the request's ("" for a request
	// without a key, which all share one limit).
	PerKey bool
	Caller string
	// SpanExact is set for a span-exact rule: the source counts a window
	// of one bucket more than the Interval holds (see Rule.SpanExact), so
	// that every span of Interval holds at most Threshold. A source must
	// keep it apart from a plain window limit of the same Key.
	SpanExact bool
	// GCRA is set for a rule with Behavior GCRA: the limit is a token
	// bucket of Burst tokens refilled at Threshold per second (Interval
	// is then 1 s and means nothing), not a window. A source must keep it
	// apart from a window limit of the same Key (the Redis source keeps
	// it under keys of its own) and should decide each request in one
	// step of the shared store; there is no lease to spend, since a
	// bucket's tokens are not tied to a window.
	GCRA bool
	// Burst is a GCRA rule's bucket size (0 otherwise).
	Burst int64
}

// Binder is implemented by token sources that can resolve a rule's limit
// once, when rules are loaded, instead of on every request.
type Binder interface {
	Bind(req GlobalRequest) BoundSource
}

// BoundSource is a TokenSource bound to one rule's limit.
type BoundSource interface {
	Acquire(ctx context.Context, n int64) (bool, error)
}

// KeyedSource is a BoundSource of a PerKey rule that takes the caller's
// key ("" for a request without one) without building a GlobalRequest per
// request. A BoundSource of a PerKey rule that is not one is asked through
// the TokenSource instead.
type KeyedSource interface {
	// AcquireKey asks for n admissions of caller's limit, whose threshold
	// is threshold (the rule's, or the caller's own when the rule lists
	// it in Keys).
	AcquireKey(ctx context.Context, caller string, threshold float64, n int64) (bool, error)
}

// RetryHinter is a BoundSource that can say, after it refused n, how long
// until its limit would have room for n were nothing else admitted (as far
// as it last heard from the shared store): what a blocked request's
// Refusal.RetryAfter then reports. Optional; without it a global refusal's
// retry is unknown.
type RetryHinter interface {
	RetryIn(n int64) (time.Duration, bool)
}

// LocalCounter is a BoundSource that hears of every admission its rule's
// local fallback makes (a window rule with FallbackLocal), so that once
// the shared store answers again it can count them there: what an
// instance admitted on its own is then not admitted again by the others.
// An admission given back (a later rule refused the request, its wait or
// its Reservation was cancelled) is told as -n. Optional; CountLocal must
// be fast (it runs on the request path of every fallback admission).
type LocalCounter interface {
	CountLocal(n int64)
}

// KeyedRetryHinter is RetryHinter for a KeyedSource's callers.
type KeyedRetryHinter interface {
	RetryInKey(caller string, n int64) (time.Duration, bool)
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
	local      *window.Window
	localLimit int64
	// fb is set on a window rule with FallbackLocal (nil otherwise): see
	// globalShared. Its local window also counts what the source admits.
	fb      *fallbacks
	counter LocalCounter // bound as one, when it is
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
	life       keytable.Life // st's while listed (see keySpec)
	threshold  float64
	localLimit int64
	// be and beLocal are the rule's errors at the key's threshold: its
	// refusals tell the key's quota.
	be, beLocal *BlockError
}

// keyLimits returns the threshold and local fallback limit of the
// request's key under a PerKey global rule, and the listed key's state and
// its life (nil: look it up).
func (g *globalRule) keyLimits(q *request) (float64, int64, *keytable.State, keytable.Life) {
	if s, ok := g.listed(q); ok {
		return s.threshold, s.localLimit, s.st, s.life
	}
	return g.req.Threshold, g.localLimit, nil, 0
}

// blockError is what rule g's source refuses the request with: a listed
// key's own error (its quota), else the rule's. localBlockError is the
// same for the local fallback. Both are read only on a refusal.
func (g *globalRule) blockError(q *request) *BlockError {
	if s, ok := g.listed(q); ok {
		return s.be
	}
	return g.be
}

func (g *globalRule) localBlockError(q *request) *BlockError {
	if s, ok := g.listed(q); ok {
		return s.beLocal
	}
	return g.beLocal
}

// listed returns the request's key's entry in the rule's Keys, if any.
func (g *globalRule) listed(q *request) (globalKeySpec, bool) {
	if !q.hasKey || g.spec == nil {
		return globalKeySpec{}, false
	}
	s, ok := g.spec[q.key]
	return s, ok
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
	k := "resource:" + r.Resource
	if r.ID != "" {
		k = "id:" + r.ID
	}
	if r.DryRun {
		// A limit of its own, never the rule in force's of the same
		// name: a dry run takes nothing from the real limit.
		return "dry:" + k
	}
	return k
}

// global asks the token source for rule g and applies its fallback when the
// source fails. It returns the error to block with, or nil, and whether
// the source itself refused.
func (e *Engine) global(node *stats.Node, g *globalRule, h *held, i, p int, now int64, q *request) (*BlockError, bool) {
	ctx, n := q.ctx, q.n
	if ctx == nil {
		ctx = context.Background()
	}
	if g.fb != nil {
		return e.globalShared(node, g, h, i, p, now, q, ctx)
	}
	ok, err := e.acquire(ctx, g, q)
	if err == nil {
		if ok {
			return nil, false
		}
		return g.blockError(q), true
	}
	if ctx.Err() != nil {
		// The caller gave up waiting: that says nothing about the source,
		// and the fallback must not admit it.
		return g.blockError(q), false
	}
	node.AddFallback()
	switch g.fallback {
	case FallbackOpen:
		return nil, false
	case FallbackClosed:
		return g.blockError(q), false
	}
	if g.keys != nil {
		// Per key, at LocalShare of the threshold.
		_, limit, spec, specLife := g.keyLimits(q)
		t := g.keys
		st, life := spec, specLife
		if spec == nil || !spec.Alive(specLife) {
			// Listed no more (a reload put its state in the sets), or
			// not listed.
			st, life = t.Lookup(q.key, q.hasKey)
		}
		for {
			b, _, ok, dead := t.Admit(st, life, now, n, limit)
			if dead {
				// As keyRule.admitWindow.
				if nt, lim := t.Successor(q.key, q.hasKey, limit); nt != nil {
					t, limit = nt, lim
				}
				st, life = t.Lookup(q.key, q.hasKey)
				continue
			}
			if !ok {
				return g.localBlockError(q), false
			}
			h.gkeys[i] = keyHeld{st: st, b: b, t: t, life: life}
			return nil, false
		}
	}
	// A Global GCRA rule: its local bucket (a window rule with
	// FallbackLocal falls back in globalShared).
	_, tok, ok, _ := g.gcra.take(now, n, 0)
	if !ok {
		return g.localBlockError(q), false
	}
	h.ggcra[i] = tok
	return nil, false
}

// globalLocal is a Global window rule's local window and the state of its
// fallbacks, kept across reloads together.
type globalLocal struct {
	w         *window.Window
	fallbacks fallbacks
}

// fallbacks is the state of a window rule's fallbacks (FallbackLocal).
type fallbacks struct {
	// failing is set while the source's last answer was an error; since
	// is when that run of errors began, last its latest fallback (engine
	// time, last kept to a sixteenth of a bucket): a fallback more than a
	// bucket (or a second, if less) after the one before starts a run of
	// its own, and a run that lasts that long is an outage.
	failing     atomic.Bool
	since, last atomic.Int64
	// rejoin is the engine time until which the local window applies on
	// top of the source, and first (see globalShared).
	rejoin atomic.Int64
}

// rejoinMost bounds how long after an outage an instance's share applies
// on top of the source: instances cut off together come back within a
// backoff of each other (the Redis source's probes end on the wall
// clock's multiples of the backoff, at most 5 s by default), and the
// share need not outlast that, nor the window.
const rejoinMost = 5 * time.Second

// globalShared is global for a window rule with FallbackLocal, whose
// local window shares the instance's part of the limit with the source:
//   - it counts what the source admits, so that a fallback starts from
//     what this instance admitted in the window, not from nothing (which
//     let each instance admit its share on top of a window the source had
//     just filled);
//   - after an outage (a run of fallbacks, none more than a bucket of the
//     local window or a second apart, that lasted that long and admitted
//     something: a failed call or two is not one; an instance that saw
//     fewer requests than that is not held), once the source answers
//     again, it applies on top of
//     the source, and first, for a window or rejoinMost, whichever is
//     shorter: an instance back on the source before the others admits no
//     more than its share while they may still admit theirs on their own
//     (a source that lost its data, as a restarted Redis, knows nothing of
//     them), and asks the source nothing while its share is spent;
//   - what it admits on its own is told to the source (LocalCounter), to
//     count in the shared limit once it answers again.
//
// While the source fails, each request asks it first: a source that backs
// off answers at once, and a request after its backoff is what lets it
// probe.
func (e *Engine) globalShared(node *stats.Node, g *globalRule, h *held, i, p int, now int64, q *request, ctx context.Context) (*BlockError, bool) {
	n, f := q.n, g.fb
	within := now < f.rejoin.Load()
	if within && !f.failing.Load() {
		lr, ok := g.local.AdmitOn(p, now, n, g.localLimit)
		if !ok {
			return g.localBlockError(q), false
		}
		ok, err := e.acquire(ctx, g, q)
		switch {
		case err == nil && ok:
			return nil, false
		case err == nil:
			lr.Cancel()
			return g.blockError(q), true
		case ctx.Err() != nil:
			lr.Cancel()
			return g.blockError(q), false
		}
		g.fellBack(node, h, i, now, n, lr)
		return nil, false
	}
	ok, err := e.acquire(ctx, g, q)
	switch {
	case err == nil:
		if f.failing.Load() {
			f.failing.Store(false)
		}
		if !ok {
			return g.blockError(q), true
		}
		if within {
			// The first answers after an outage: the share applies too
			// (what the source counted for a request refused here stays
			// counted there).
			if _, ok := g.local.AdmitOn(p, now, n, g.localLimit); !ok {
				return g.localBlockError(q), false
			}
			return nil, false
		}
		g.local.AddOn(p, now, window.Pass, n)
		return nil, false
	case ctx.Err() != nil:
		return g.blockError(q), false
	}
	lr, ok := g.local.AdmitOn(p, now, n, g.localLimit)
	if !ok {
		g.fellBack(node, h, i, now, 0, lr)
		return g.localBlockError(q), false
	}
	g.fellBack(node, h, i, now, n, lr)
	return nil, false
}

// fellBack records that a request of g fell back at now, admitted on its
// own by lr (n 0: refused by the share).
func (g *globalRule) fellBack(node *stats.Node, h *held, i int, now, n int64, lr window.Reservation) {
	node.AddFallback()
	f, run := g.fb, min(g.local.BucketLen(), int64(time.Second))
	if last := f.last.Load(); !f.failing.Load() || now-last > run {
		f.since.Store(now)
		f.last.Store(now)
		f.failing.Store(true)
	} else if now-last > run/16 {
		f.last.Store(now)
	}
	if n == 0 {
		return
	}
	if now-f.since.Load() >= run {
		d := min(int64(g.req.Interval), int64(rejoinMost))
		if until := now + d; f.rejoin.Load() < until-d/16 {
			f.rejoin.Store(until)
		}
	}
	h.gres[i] = lr
	if g.counter != nil {
		tell(g.counter, n)
	}
}

// tell tells c of n admitted on its own (given back, when negative); a
// panic in it is the source's failure to hear, not the request's.
func tell(c LocalCounter, n int64) {
	defer func() { _ = recover() }()
	c.CountLocal(n)
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
		req.Threshold, _, _, _ = g.keyLimits(q)
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

var globalKind = kind{
	is:       func(r *Rule) bool { return r.Global },
	validate: validateGlobal,
	compile:  compileGlobal,
	describe: func(r *Rule) string {
		if r.PerKey {
			return describeRate(r) + " per key global"
		}
		return describeRate(r) + " global"
	},
}

// compileGlobal adds a Global rule: asked of the engine's token source,
// with a local fallback by its kind (per key, a GCRA bucket, or a window)
// at LocalShare of its threshold.
func compileGlobal(c *compiling) {
	e, r, rr, bound := c.e, c.r, c.rr, c.bound
	g := globalRule{
		req:      globalRequest(r),
		bound:    bound,
		fallback: r.Fallback,
		be:       newBlockError(r, ReasonGlobal),
		// The local fallback admits LocalShare of the threshold: that is
		// the quota its refusals tell (the rule's Keys aside).
		beLocal: newKeyBlockError(r, ReasonFlow, r.Threshold*r.LocalShare),
	}
	g.hint, _ = bound.(RetryHinter)
	switch {
	case r.PerKey:
		// Its local fallback is per key, at LocalShare of the threshold.
		t := e.keyTable(c)
		g.hint = nil
		g.keys = t
		g.localLimit = perWindow(r.Threshold*r.LocalShare, r.StatInterval)
		g.keyed, _ = bound.(KeyedSource)
		if g.keyed != nil {
			g.keyHint, _ = bound.(KeyedRetryHinter)
		}
		if len(r.Keys) > 0 {
			g.spec = make(map[string]globalKeySpec, len(r.Keys))
			for _, kl := range r.Keys {
				st, life := t.Specific(kl.Key)
				g.spec[kl.Key] = globalKeySpec{st: st, life: life, threshold: kl.Threshold,
					localLimit: perWindow(kl.Threshold*r.LocalShare, r.StatInterval),
					be:         newKeyBlockError(r, ReasonGlobal, kl.Threshold),
					beLocal:    newKeyBlockError(r, ReasonFlow, kl.Threshold*r.LocalShare)}
			}
		}
		rr.keyedGlobal = true
	case r.Behavior == GCRA:
		lr := localShare(r)
		cell := keepCell(c, lr.Threshold, func(was *Rule) float64 { return localShare(was).Threshold })
		local := newGCRARule(cell, lr)
		g.gcra = &local
	default:
		// Its local window, and the state of its fallbacks, are kept while
		// its shape is.
		gl := keep(c, c.old.locals, c.next.locals, func(l *globalLocal, was *Rule) (*globalLocal, bool) {
			return l, was.StatInterval == r.StatInterval && was.SpanExact == r.SpanExact
		}, func() *globalLocal {
			n, interval := e.buckets(r.StatInterval), r.StatInterval
			if r.SpanExact {
				// The fallback is span-exact too.
				n, interval = spanShape(e.spanBuckets, interval)
			}
			w, err := window.NewWindow(n, interval)
			if err != nil {
				panic(err) // validated
			}
			return &globalLocal{w: w}
		})
		g.local = gl.w
		g.localLimit = perWindow(r.Threshold*r.LocalShare, r.StatInterval)
		if r.Fallback == FallbackLocal {
			g.fb = &gl.fallbacks
			g.counter, _ = bound.(LocalCounter)
		}
	}
	rr.globals = append(rr.globals, g)
}

// takeGlobals asks each Global rule's source (or its fallback) for the
// request.
func (e *Engine) takeGlobals(rr *resourceRules, h *held, p int, now int64, q *request, rf *refusal) bool {
	for i := range rr.globals {
		g := &rr.globals[i]
		if be, refused := e.global(rr.node, g, h, i, p, now, q); be != nil {
			rm := unknownRoom
			if refused {
				rm = g.room(q)
			}
			*rf = refusal{be, 0, rm, i}
			return false
		}
	}
	return true
}

// releaseGlobals gives back what the Global rules' local fallbacks
// admitted. What a source admitted is not given back (it may have been
// counted across instances).
func (rr *resourceRules) releaseGlobals(h *held, n int64) {
	for i := range rr.globals {
		if g := &rr.globals[i]; g.counter != nil && h.gres[i].Held() {
			tell(g.counter, -n) // told of it on admission
		}
		h.gres[i].Cancel()
		if h.ggcra[i] != 0 {
			rr.globals[i].gcra.give(n, h.ggcra[i])
		}
		if st := h.gkeys[i].st; st != nil {
			st.Undo(h.gkeys[i].b, h.gkeys[i].life, n)
		}
	}
}

// validateGlobal checks what a Global rule's source and fallback need.
func validateGlobal(r *Rule, i int) error {
	if !r.Global {
		return nil
	}
	switch {
	case r.Fallback == FallbackLocal && (math.IsNaN(r.LocalShare) || r.LocalShare <= 0 || r.LocalShare > 1):
		return r.errorf(i, "LocalShare", r.LocalShare, "must be in (0, 1]")
	case r.Behavior != Reject && r.Behavior != GCRA:
		return r.errorf(i, "Behavior", r.Behavior, "must be Reject or GCRA for a Global rule")
	}
	return nil
}
