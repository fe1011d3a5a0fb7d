package flow

import (
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/keytable"
)

// Left is what a resource's rate rules have left for a caller, read by
// Engine.Left: that of the rule with the least left.
type Left struct {
	// Err is that rule's error, as a refusal by it would carry (see
	// Refusal.Err): its Rule, and its Quota (the policy a RateLimit header
	// names).
	Err *BlockError
	// Remaining is how many more requests its window (or GCRA bucket)
	// admits now: its threshold less what it holds (for a window, a race
	// with cores' unused leases may still refuse one; see the package
	// doc's Exactness).
	Remaining int64
	// Reset is how long until everything its window holds has left it
	// (until its GCRA bucket is full), rounded up to the millisecond.
	Reset time.Duration
}

// Left reads what the resource's rate rules have left for a request with
// opts (WithKey names the caller for PerKey rules), without counting
// anything: that of the rule with the least left among its QPS window
// rules (WarmUp at its limit now, span-exact), its PerKey window rules and
// its GCRA rules; Throttle, Concurrency, related and Global rules are not
// read. After an admission it says what the caller has left (the
// RateLimit header's remaining field). It reports false when none of the
// resource's rules is read, or an option is invalid. It allocates
// nothing; it reads every bucket of those windows, so it costs about an
// admission.
func (e *Engine) Left(resource string, opts ...EntryOption) (Left, bool) {
	rr := e.ruleSet().byResource[resource]
	if rr == nil {
		return Left{}, false
	}
	q := request{n: 1}
	if err := parseOptions(&q, opts); err != nil {
		return Left{}, false
	}
	now := e.now()
	best := Left{Remaining: math.MaxInt64}
	take := func(be *BlockError, left, reset int64) {
		if left < best.Remaining {
			best = Left{Err: be, Remaining: max(left, 0), Reset: time.Duration(roundUpMs(reset))}
		}
	}
	for i := range rr.groups {
		g := &rr.groups[i]
		limit, be := g.limit(now, rr.node)
		held, reset := g.w.Held(now)
		take(be, limit-held, int64(reset))
	}
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		if kr.t.Kind() != keytable.Window {
			continue
		}
		st, limit, _ := kr.peek(&q)
		var held, reset int64
		if st != nil {
			held, reset = kr.t.Held(st, now)
		}
		take(kr.blockError(&q), limit-held, reset)
	}
	for i := range rr.gcras {
		gr := &rr.gcras[i]
		tokens, reset := gr.l.Left(now)
		take(gr.be, tokens, max(reset, 0))
	}
	return best, best.Err != nil
}

// roundUpMs rounds d (ns) up to the millisecond.
func roundUpMs(d int64) int64 {
	const ms = int64(time.Millisecond)
	return (d + ms - 1) / ms * ms
}
