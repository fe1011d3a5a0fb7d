package flow

import (
	"fmt"
	"time"

	"github.com/leapflow/leapflow/internal/breaker"
	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/metric"
)

// breakerRule is a circuit-breaker rule in a rule set: its breaker (kept
// across reloads that keep the rule) and the errors of its refusals, open
// and half-open.
type breakerRule struct {
	b            *breaker.Breaker
	open, probed *BlockError
}

// maxBreakerRules bounds a resource's breaker rules: a request holds its
// probes on the stack.
const maxBreakerRules = 4

// The bounds of a breaker rule's fields.
const (
	defaultBreakerBuckets = 10
	maxBreakerBuckets     = 100
	maxMinRequests        = 1_000_000
	maxBreakerTimeout     = time.Hour
)

var breakerKind = kind{
	is:       func(r *Rule) bool { return r.Breaker != NotBreaker },
	validate: validateBreaker,
	compile:  compileBreaker,
	describe: func(r *Rule) string {
		s := " " + r.Breaker.String()
		if r.Breaker == SlowRatio {
			s += " over " + r.MaxRT.String()
		}
		return s + " breaker, retry " + r.RetryTimeout.String()
	},
}

// withBreakerDefaults fills in a breaker rule's optional fields.
func (r *Rule) withBreakerDefaults() {
	if r.Buckets == 0 {
		r.Buckets = defaultBreakerBuckets
	}
	if r.ProbeTimeout == 0 {
		r.ProbeTimeout = r.RetryTimeout
	}
	if r.Breaker == ErrorCount && r.MinRequests == 0 {
		r.MinRequests = 1
	}
}

// validateBreaker checks what a breaker rule needs (r has its defaults).
func validateBreaker(r *Rule, i int) error {
	if r.Breaker == NotBreaker {
		return nil
	}
	bad := func(field string, value any, reason string) error { return r.errorf(i, field, value, reason) }
	ratio := r.Breaker == SlowRatio || r.Breaker == ErrorRatio
	timeout := func(field string, d time.Duration, what string) error {
		if d <= 0 || d > maxBreakerTimeout {
			return bad(field, d, fmt.Sprintf("must be in (0, %v]: %s", maxBreakerTimeout, what))
		}
		return nil
	}
	switch {
	case r.Breaker > ErrorCount:
		return bad("Breaker", r.Breaker, "must be SlowRatio, ErrorRatio or ErrorCount")
	case r.Metric != QPS || r.Behavior != Reject:
		return bad("Breaker", r.Breaker, "is for rules of Metric QPS and Behavior Reject")
	case r.Global || r.PerKey || r.RelatedResource != "" || r.SpanExact || r.DryRun:
		return bad("Breaker", r.Breaker, "is not for Global, PerKey, related, span-exact or dry-run rules")
	case ratio && r.Threshold > 1:
		return bad("Threshold", r.Threshold, "must be a share in [0, 1] for a "+r.Breaker.String()+" breaker")
	case !ratio && (r.Threshold < 1 || r.Threshold != float64(int64(r.Threshold)) || r.Threshold > maxMinRequests):
		return bad("Threshold", r.Threshold, fmt.Sprintf("must be a whole count of failures in [1, %d] for an ErrorCount breaker", maxMinRequests))
	case r.MinRequests < 1 || r.MinRequests > maxMinRequests:
		return bad("MinRequests", r.MinRequests, fmt.Sprintf("must be in [1, %d]: the fewest completions before the breaker may open", maxMinRequests))
	case r.Buckets < 1 || r.Buckets > maxBreakerBuckets:
		return bad("Buckets", r.Buckets, fmt.Sprintf("must be in [1, %d]", maxBreakerBuckets))
	case r.StatInterval%(time.Duration(r.Buckets)*time.Millisecond) != 0:
		return bad("StatInterval", r.StatInterval, fmt.Sprintf("must be a whole number of milliseconds per bucket (%d buckets)", r.Buckets))
	}
	if r.Breaker == SlowRatio {
		if err := timeout("MaxRT", r.MaxRT, "the longest a request may take before it counts slow"); err != nil {
			return err
		}
	}
	if err := timeout("RetryTimeout", r.RetryTimeout, "how long an open breaker refuses"); err != nil {
		return err
	}
	return timeout("ProbeTimeout", r.ProbeTimeout, "how long a probe holds its place")
}

// compileBreaker adds a breaker rule: its breaker kept across reloads that
// keep the rule unchanged; a changed rule starts afresh, closed.
func compileBreaker(c *compiling) {
	r, e := c.r, c.e
	b := keep(c, c.old.breakers, c.next.breakers, func(b *breaker.Breaker, was *Rule) (*breaker.Breaker, bool) {
		if breakerConfig(was) == breakerConfig(r) {
			return b, true
		}
		c.next.retire(b, was, c.now) // its requests in flight exit into it, unheard
		return nil, false
	}, func() *breaker.Breaker {
		resource, rule := r.Resource, r.Name()
		var changed func(breaker.Transition)
		if l := e.breakerListener; l != nil {
			changed = func(t breaker.Transition) {
				l(BreakerChange{Resource: resource, Rule: rule, From: BreakerState(t.From), To: BreakerState(t.To),
					Value: t.Value, At: time.Duration(t.At)})
			}
		}
		b := breaker.New(breakerConfig(r), changed)
		b.Reset(c.now) // counting from now: nothing admitted earlier counts
		return b
	})
	open, probed := newBlockError(r, ReasonBreaker), newBlockError(r, ReasonBreaker)
	open.state, probed.state = BreakerOpen, BreakerHalfOpen
	open.msg = fmt.Sprintf("flow: %s blocked by rule %s (%s breaker, open)", names.Abbrev(r.Resource), names.Abbrev(r.Name()), r.Breaker)
	probed.msg = fmt.Sprintf("flow: %s blocked by rule %s (%s breaker, half-open: its probe is out)", names.Abbrev(r.Resource), names.Abbrev(r.Name()), r.Breaker)
	c.rr.breakers = append(c.rr.breakers, breakerRule{b: b, open: open, probed: probed})
}

// retire stops the reports of breaker b of rule r, replaced or removed by
// the rule set being built at now: if the listener last heard it was not
// closed, it is told it is (the breaker in force, if any, starts closed),
// before the set is in force (resets).
func (next *ruleSet) retire(b *breaker.Breaker, r *Rule, now int64) {
	if s := b.Retire(); s != breaker.Closed {
		next.resets = append(next.resets, BreakerChange{Resource: r.Resource, Rule: r.Name(), From: BreakerState(s), To: BreakerClosed,
			At: time.Duration(now)})
	}
}

// retireBreakers retires the breakers of old's rules that next does not
// keep, and tells the listener of every breaker reset (see retire).
func (e *Engine) retireBreakers(old, next *ruleSet) {
	for k, kb := range old.breakers {
		if _, kept := next.breakers[k]; !kept { // a changed rule's was retired by compile
			next.retire(kb.v, kb.r, e.now())
		}
	}
	if l := e.breakerListener; l != nil {
		for _, ch := range next.resets {
			func() {
				defer func() { _ = recover() }()
				l(ch)
			}()
		}
	}
	next.resets = nil
}

// breakerConfig is the breaker of rule r.
func breakerConfig(r *Rule) breaker.Config {
	return breaker.Config{
		Strategy:     breaker.Strategy(r.Breaker - SlowRatio),
		Threshold:    r.Threshold,
		MaxRT:        int64(r.MaxRT),
		MinRequests:  int64(r.MinRequests),
		Interval:     int64(r.StatInterval),
		Buckets:      r.Buckets,
		RetryTimeout: int64(r.RetryTimeout),
		ProbeTimeout: int64(r.ProbeTimeout),
	}
}

// takeBreakers asks the resource's breakers about a request going at t:
// each admits it (closed, or as its probe) or refuses it, saying when its
// next probe may go. It returns the breakers (by index) whose probe the
// request is; refused, it gives back the probes it took.
func (rr *resourceRules) takeBreakers(t int64, rf *refusal) (probes uint8, ok bool) {
	for i := range rr.breakers {
		br := &rr.breakers[i]
		ok, probe, retry := br.b.Enter(t)
		if !ok {
			be := br.open
			if s, _ := br.b.State(); s == breaker.HalfOpen {
				be = br.probed
			}
			*rf = refusal{be, 0, room{retry, retry}, i}
			rr.giveBackProbes(probes, t)
			return 0, false
		}
		if probe {
			probes |= 1 << i
		}
	}
	return probes, true
}

// giveBackProbes gives back the probes (by index) taken at t: the next
// request may be the probe.
func (rr *resourceRules) giveBackProbes(probes uint8, t int64) {
	for i := range rr.breakers {
		if probes&(1<<i) != 0 {
			rr.breakers[i].b.GiveBack(t)
		}
	}
}

// breakersClosed says whether every breaker of rr is closed: they admit
// any request, and take no probe (one load each, inlined).
func (rr *resourceRules) breakersClosed() bool {
	for i := range rr.breakers {
		if !rr.breakers[i].b.Closed() {
			return false
		}
	}
	return true
}

// enterBreakersOnly is Entry of one on a resource whose only rules are
// circuit breakers: while they are closed, its pass is counted and its
// Entry leads its Exit to them, as the general path would; else the
// general path decides (probes, refusals).
func (e *Engine) enterBreakersOnly(rr *resourceRules) (Entry, error) {
	if !rr.breakersClosed() {
		return e.enter(rr, rr.node, nil)
	}
	p, now := e.pinNow()
	node := e.count(rr.node, p, now, metric.Pass, 1)
	return Entry{node: node, slot: rr.brkSlot, start: now, meta: holdsNothing(1, p)}, nil
}

// enterBreakers ends enterSingle's admission of n at now (r, on stripe p)
// on a resource whose breakers decide after its window, one of them not
// closed: admitted, its
// Entry leads its Exit back to them; refused, the window's admission is
// given back and the request counted blocked.
func (e *Engine) enterBreakers(rr *resourceRules, p int, now, n int64, r window.Reservation) (Entry, error) {
	var rf refusal
	probes, ok := rr.takeBreakers(now, &rf)
	if !ok {
		r.Cancel()
		e.count(rr.node, p, now, metric.Block, n)
		return blocked(rf.be, 0, rf.rm)
	}
	slot := rr.brkSlot
	if probes != 0 {
		slot = rr.probeSlot
	}
	node := rr.node
	if rr.singleApart {
		node = e.count(node, p, now, metric.Pass, n)
	} else if node.Dropped() {
		node = e.recount(node, p, now, metric.Pass, n)
	}
	return Entry{node: node, slot: slot, start: now, meta: holdsNothing(n, p)}, nil
}

// releaseBreakers gives back the probes h took (a later rule refused the
// request).
func (rr *resourceRules) releaseBreakers(h *held) { rr.giveBackProbes(h.probes, h.probeAt) }

// breakersWait is the longest of retry and the waits until each breaker of
// rr would admit a request (its next probe), for laterRetry.
func (rr *resourceRules) breakersWait(now, retry int64) int64 {
	for i := range rr.breakers {
		retry = max(retry, rr.breakers[i].b.Wait(now))
	}
	return retry
}

// exitBreakers counts the completion at now of a request admitted at start
// in each of the resource's breakers. It is not inlined: Exit of a request
// on a resource without breakers pays only the test that leads here.
//
//go:noinline
func (rr *resourceRules) exitBreakers(p int, start, now int64, failed, probe bool) {
	for i := range rr.breakers {
		rr.breakers[i].b.Exit(p, start, now, failed, probe)
	}
}

// BreakerChange is a circuit breaker's change of state, as an engine's
// breaker listener receives it (WithBreakerListener).
type BreakerChange struct {
	// Resource and Rule name the breaker: its rule's resource and name
	// (its ID, or its resource).
	Resource, Rule string
	From, To       BreakerState
	// Value is what moved it: for closed to open, the window's share of
	// bad completions (SlowRatio, ErrorRatio) or its count of failures
	// (ErrorCount); for a probe's outcome (half-open to closed or open),
	// the probe's response time in ns, or 1 when it failed (ErrorRatio,
	// ErrorCount); 0 for open to half-open.
	Value float64
	// At is the engine's time of the change.
	At time.Duration
}

// WithBreakerListener has fn called with every change of state of the
// engine's circuit breakers (Rule.Breaker), exactly once per change, by
// the goroutine whose request made it (an Entry admitting the probe, an
// Exit that trips the breaker or ends the probe), after the state changed
// and outside anything the engine holds. A reload that changes or removes
// the rule of a breaker fn last heard was not closed reports it closed
// (the breaker in force starts closed), from LoadRules, which holds the
// engine's load lock, after the retired breaker's reports being made and
// before the new rules are in force. Changes of one breaker made by two
// goroutines at once (a probe admitted by one, its outcome by another)
// may reach fn out of order: order them by At. fn must not load rules
// and must not block: hand slow work to a goroutine or a channel of your
// own. A panic in fn is dropped.
func WithBreakerListener(fn func(BreakerChange)) Option {
	return func(c *config) { c.breakerListener = fn }
}

// BreakerStatus is a circuit breaker's state, as Engine.Breakers reads it.
type BreakerStatus struct {
	Rule  Rule
	State BreakerState
	// Since is the engine's time its state began (for a breaker closed
	// since its rule was loaded, the load).
	Since time.Duration
	// RetryAfter is how long until it admits a request: 0 closed, else
	// until its next probe may go.
	RetryAfter time.Duration
	// Transitions counts its changes into each state since its rule was
	// loaded (kept by reloads that keep the rule), by BreakerState.
	Transitions [3]int64
	// Tripped is the Value of its last trip (see BreakerChange), 0 if it
	// never tripped.
	Tripped float64
	// Completed and Failed are what its window counts now: completions,
	// and the bad ones among them (failed, or slow for SlowRatio).
	Completed, Failed int64
}

// Breakers returns the circuit breakers in force (Rule.Breaker), in load
// order, with their state and window now.
func (e *Engine) Breakers() []BreakerStatus {
	set := e.ruleSet()
	if len(set.breakers) == 0 {
		return nil
	}
	of := make(map[*Rule]*breaker.Breaker, len(set.breakers))
	for _, kb := range set.breakers {
		of[kb.r] = kb.v
	}
	now := e.now()
	out := make([]BreakerStatus, 0, len(of))
	for i := range set.rules {
		b := of[&set.rules[i]]
		if b == nil {
			continue
		}
		s, at := b.State()
		all, bad := b.Sum(now)
		st := BreakerStatus{Rule: set.rules[i], State: BreakerState(s), Since: time.Duration(at), RetryAfter: time.Duration(b.Wait(now)),
			Tripped: b.Tripped(), Completed: all, Failed: bad}
		if at == breaker.GivenBack {
			st.Since = time.Duration(now) // a probe given back: its place is free
		}
		for s := range st.Transitions {
			st.Transitions[s] = b.Transitions(breaker.State(s))
		}
		out = append(out, st)
	}
	return out
}
