package flow

import "time"

// Refusal is what a caller can be told about a blocked request: the rule
// that refused it and why (Err), when to retry, and what its window had
// left. Middleware fills standard fields from it (HTTP Retry-After and
// RateLimit, gRPC RetryInfo); the rule's quota is Err.Quota.
type Refusal struct {
	// Err is the refusing rule's error (shared by every request the rule
	// refuses; nil: the request was not refused): its Rule, its Reason,
	// and its Quota.
	Err *BlockError
	// Resource is the refused request's resource.
	Resource string
	// RetryAfter is how long until the rule would admit the request were
	// nothing else admitted meanwhile: for a QPS Reject rule until enough
	// of its window has left it, for Throttle until its slot is within
	// MaxQueueing, for a Global rule until the shared window has room as
	// the token source last heard. On a resource with several rules it is
	// the latest of that wait and the waits of the resource's other rate
	// rules (windows, PerKey, GCRA, Throttle) that had not admitted the
	// request when it was refused (those that had, had room; Global rules
	// are not asked again). It is negative when the rule cannot say
	// (Concurrency, related-resource, WarmUp and WarmUpThrottle rules,
	// whose limits move while the caller waits, a global rule whose source
	// failed or cannot say, a request larger than a threshold, a refusal
	// while aligning the rules of a request that waits). A request that
	// would queue under a Throttle rule may, retried, be refused by another
	// window when its queued instant falls in that window's next bucket.
	RetryAfter time.Duration
	// Reset is how long until everything the rule holds now has left it
	// (rounded up to the millisecond): a QPS Reject rule's window, a GCRA
	// rule's bucket; negative when the rule cannot say.
	Reset time.Duration
	// Breaker is a breaker refusal's breaker state (Err.Reason
	// ReasonBreaker): BreakerOpen, or BreakerHalfOpen while its probe is
	// out; RetryAfter is then the time until its next probe may go.
	Breaker BreakerState
	// Remaining is what the window had left for the request: 0 when the
	// rule does not count one (a cold WarmUp rule's lower limit, a related
	// resource's rate, Throttle, GCRA and global rules, their local
	// fallbacks too).
	Remaining int64
}

// Refusal describes the request whose Entry call returned en blocked; for
// an admitted request, or an Entry call that failed with another error, it
// is the zero Refusal (Err nil). It reads only what the blocked Entry
// recorded: nothing is allocated. A retry time is computed when read,
// from the refusal's instant: never shorter than it was then.
func (en *Entry) Refusal() Refusal {
	if en.node != nil || en.slot == nil {
		return Refusal{}
	}
	be := en.slot.Owner().be
	if be == nil {
		return Refusal{}
	}
	rm := en.room()
	r := Refusal{Err: be, Resource: be.Rule.Resource, RetryAfter: time.Duration(rm.retry), Reset: time.Duration(rm.reset), Breaker: be.state}
	// What the window had left: only where the quota is what the rule
	// admitted against (not a cold WarmUp rule's lower limit, nor a
	// related resource's rate).
	rule := &be.Rule
	if be.Reason == ReasonConcurrency || be.Reason == ReasonFlow && rule.Behavior == Reject && rule.RelatedResource == "" && !rule.Global {
		quota, _ := be.Quota()
		r.Remaining = max(quota-int64(en.seen()), 0)
	}
	return r
}

// Policy returns the quota of the strictest QPS rule in force on resource
// (the one admitting least per second; related-resource rules, which limit
// by another resource's rate, are left out), as BlockError.Quota gives it,
// and that rule's name (its ID, or the resource when it has none): what
// middleware tells admitted callers. It reports false when no QPS rule
// applies. It allocates nothing.
func (e *Engine) Policy(resource string) (name string, quota int64, window time.Duration, ok bool) {
	rr := e.ruleSet().byResource[resource]
	if rr == nil || rr.policy == nil {
		return "", 0, 0, false
	}
	quota, window = rr.policy.Quota()
	return rr.policy.Rule.Name(), quota, window, true
}
