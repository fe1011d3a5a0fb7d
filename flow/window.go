package flow

import (
	"github.com/leapflow/leapflow/internal/slots"
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/metric"
)

// windowGroup is every Reject and WarmUp rule that counts in one window:
// they admit together, with one Admit at the smallest of their limits, so a
// pass is counted once.
type windowGroup struct {
	w          *window.Window
	intervalS  float64
	static     int64 // smallest Reject limit; MaxInt64 if none
	staticBE   *BlockError
	borrowable bool // only Reject rules: priority requests may borrow
	warm       []warmRule
	// refusal is what the Entry of a request of 1 this group refused, on
	// a resource of several rules but no PerKey rate rule, carries: its
	// retry time is computed when read (see Entry.room); site leads back
	// to the resource's rules and the group. Nil for a warm-up group.
	refusal *slots.Slot[site]
	site    site
	// refusalKeyed is refusal on a resource with PerKey rate rules: the
	// Entry carries their wait, computed at the refusal, instead of what
	// the window saw.
	refusalKeyed *slots.Slot[site]
	siteKeyed    site
}

// maxWindows bounds the distinct windows (StatInterval and SpanExact) the
// Reject and WarmUp rules of one resource count in: a request holds an
// admission in each, on the stack.
const maxWindows = 16

// windowID is what tells a resource's windows apart, for maxWindows.
type windowID struct {
	interval  time.Duration
	spanExact bool
}

// window returns the node window a rule with this interval counts in.
func (e *Engine) window(n *stats.Node, interval time.Duration) *window.Window {
	if interval == time.Second {
		return second(n)
	}
	w, err := n.Window(interval, e.buckets(interval))
	if err != nil {
		panic(err) // a validated interval (whole ms, at most 24h) cannot fail
	}
	return w
}

// spanWindow returns the node window span-exact rules with this interval
// count in: n buckets of the interval (WithSpanBuckets) and one more, so
// that an admission is checked against the last n+1 buckets (every span
// of the interval lies within n+1 consecutive buckets).
func (e *Engine) spanWindow(n *stats.Node, interval time.Duration) *window.Window {
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
func (rr *resourceRules) group(w *window.Window, interval time.Duration) *windowGroup {
	for i := range rr.groups {
		if rr.groups[i].w == w {
			return &rr.groups[i]
		}
	}
	rr.groups = append(rr.groups, windowGroup{w: w, intervalS: interval.Seconds(), static: math.MaxInt64, borrowable: true})
	return &rr.groups[len(rr.groups)-1]
}

// limit is the group's limit at now, and the error of the rule that sets
// it.
func (g *windowGroup) limit(now int64, node *stats.Node) (int64, *BlockError) {
	limit, be := g.static, g.staticBE
	for _, wr := range g.warm {
		// The closure lives on the stack (Rate keeps no reference to it);
		// only the goroutine that syncs a new second calls it.
		rate := wr.w.Rate(now, func() int64 { return node.PreviousSecond(now, metric.Pass) })
		if l := int64(rate * g.intervalS); l < limit {
			limit, be = l, wr.be
		}
	}
	return limit, be
}

// borrowedAt is an admission borrowed from window w's bucket starting at
// start.
type borrowedAt struct {
	w     *window.Window
	start int64
}

func (b borrowedAt) holds(t int64) bool { return t >= b.start && t < b.start+b.w.BucketLen() }

func (h *held) addRes(r window.Reservation) {
	if h.nres < len(h.res) {
		h.res[h.nres] = r
	} else {
		h.more = append(h.more, r)
	}
	h.nres++
}

func (h *held) addBorrow(b borrowedAt) {
	if h.nbor < len(h.bor) {
		h.bor[h.nbor] = b
	} else {
		h.bmore = append(h.bmore, b)
	}
	h.nbor++
}

// reservations yields the window admissions the request holds.
func (h *held) reservations(yield func(*window.Reservation) bool) {
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
func (h *held) releaseWindows(n int64, nw *window.Window) (folded bool) {
	for r := range h.reservations {
		r.Cancel()
	}
	for b := range h.borrows {
		if b.w.Unborrow(b.start, n) && b.w == nw {
			folded = true
		}
	}
	h.nres, h.more, h.nbor, h.bmore = 0, h.more[:0], 0, h.bmore[:0]
	return folded
}

// borrowedFrom reports whether one of the request's borrows is from w.
func (h *held) borrowedFrom(w *window.Window) bool {
	for b := range h.borrows {
		if b.w == w {
			return true
		}
	}
	return false
}

// seedWindows gives each window the new rule set counts in and the old
// one did not (a span-exact rule's, or one of another StatInterval, made
// now or idle until now) what its resource passed over the window's span,
// as one pass count in its newest bucket, and what the old rules' windows
// admitted ahead for requests still waiting, in the buckets those land
// in: a reload that adds or tightens such a rule must not admit the
// window's whole threshold again on top of what the resource just passed
// or is about to. It errs towards strictness: the count covers whole
// seconds back and is held for the window's span from now, and a waiter
// borrowed from two old windows counts twice. It runs once the new rules
// are out, so a request they admitted meanwhile is counted twice rather
// than missed; what can slip past is what leases granted in those
// microseconds admit (see metric's leases).
func (e *Engine) seedWindows(old, next *ruleSet) {
	now := e.now()
	for name, rr := range next.byResource {
		was := old.byResource[name]
		for i := range rr.groups {
			w := rr.groups[i].w
			if w == second(rr.node) || (was != nil && was.countsIn(w)) {
				continue
			}
			// At the resource's newest bucket if the clock is behind it
			// (a step back the engine absorbed): the passes it counted
			// there are in the span, and the seed must not land before
			// them, leaving the window early.
			now := second(rr.node).Clamp(now)
			c := rr.node.PassedSince(now-int64(w.Interval()), now)
			if was != nil {
				for j := range was.groups {
					was.groups[j].w.Borrows(func(start, n int64) {
						if !w.Lend(start, n) {
							c += n // its bucket is made, or taken: now
						}
					})
				}
			}
			if c > 0 {
				w.Add(now, metric.Pass, c)
			}
		}
	}
}

// countsIn reports whether a group of rr counts in w.
func (rr *resourceRules) countsIn(w *window.Window) bool {
	for i := range rr.groups {
		if rr.groups[i].w == w {
			return true
		}
	}
	return false
}

var windowKind = kind{
	is:       func(*Rule) bool { return true },
	validate: validateSpanExact,
	compile:  compileWindow,
	describe: describeRate,
}

// windowGroupOf returns the group of the window rule r counts in, made if
// needed.
func (rr *resourceRules) windowGroupOf(e *Engine, r *Rule) *windowGroup {
	w := e.window(rr.node, r.StatInterval)
	if r.SpanExact {
		w = e.spanWindow(rr.node, r.StatInterval)
	}
	if w == second(rr.node) {
		rr.countsNode = true
	}
	return rr.group(w, r.StatInterval)
}

// compileWindow adds a Reject QPS rule to its window's group, whose static
// limit is the smallest of its Reject rules'.
func compileWindow(c *compiling) {
	r := c.r
	g := c.rr.windowGroupOf(c.e, r)
	if limit := perWindow(r.Threshold, r.StatInterval); limit < g.static {
		g.static, g.staticBE = limit, newBlockError(r, ReasonFlow)
	}
}

// takeWindows admits the request in each window group at now (moved to a
// newer bucket a window counted it in), or borrows a later bucket within
// its wait where the group allows; it returns the moved now and the wait.
func (rr *resourceRules) takeWindows(h *held, p int, now int64, q *request, rf *refusal) (int64, int64, bool) {
	var wait int64
	n := q.n
	for i := range rr.groups {
		g := &rr.groups[i]
		limit, be := g.limit(now, rr.node)
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
		// A warm-up group cannot say: its limit moves while the caller
		// waits (it cools down when traffic stops). A request of 1 is
		// told when read.
		rm := unknownRoom
		switch {
		case g.refusal != nil && n == 1:
			rm = roomWhenRead
		case len(g.warm) == 0:
			rm = roomOf(g.w.RoomIn(now, n, limit))
		}
		*rf = refusal{be, float64(r.Seen()), rm, i}
		return now, wait, false
	}
	return now, wait, true
}

// windowsHold reports whether every window admission and borrow of the
// request counts it at instant t.
func (h *held) windowsHold(t int64) bool {
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
	return true
}

// alignWindows admits the request again in each group's bucket holding t
// (now's, or a borrow of that later bucket), after align gave back what
// the groups took. It returns the latest bucket start a group counted it
// in, past t when a window's newest bucket is.
func (rr *resourceRules) alignWindows(h *held, p int, now, t, n int64, rf *refusal) (int64, bool) {
	later := t
	for i := range rr.groups {
		g := &rr.groups[i]
		limit, be := g.limit(now, rr.node)
		r, s, borrowed, ok := g.w.AdmitAt(p, now, t, n, limit)
		switch {
		case !ok:
			*rf = refusal{be, float64(r.Seen()), unknownRoom, i}
			return t, false
		case borrowed:
			h.addBorrow(borrowedAt{g.w, s})
		default:
			h.addRes(r)
			later = max(later, r.Start())
		}
	}
	return later, true
}

// validateSpanExact checks that a span-exact rule is one the span-exact
// window can run.
func validateSpanExact(r *Rule, i int) error {
	if r.SpanExact && (r.Metric != QPS || r.Behavior != Reject || r.PerKey || r.RelatedResource != "") {
		return r.errorf(i, "SpanExact", r.SpanExact, "is for QPS rules with Behavior Reject on their own resource's rate (not PerKey or related)")
	}
	return nil
}
