package flow

import "time"

// Refusal is what a caller can be told about a blocked request: when to
// retry, and the quota of the rule that blocked it. Middleware fills
// standard fields from it (HTTP Retry-After and RateLimit, gRPC RetryInfo).
type Refusal struct {
	Resource string
	Err      *BlockError
	// RetryAfter is how long until the rule would admit the request, when
	// RetryKnown (see Entry.RetryAfter).
	RetryAfter time.Duration
	RetryKnown bool
	// Quota and Window are the rule's (BlockError.Quota; Window 0: in
	// flight); Remaining is what the window had left for the request (0
	// when the rule does not count one); Reset, when ResetKnown, how long
	// until everything in the window now has left it (Entry.Reset).
	Quota, Remaining int64
	Window           time.Duration
	Reset            time.Duration
	ResetKnown       bool
}

// Refusal describes the request whose Entry call on resource returned en
// and be. It reads only what the blocked Entry recorded: nothing is
// allocated.
func (en *Entry) Refusal(resource string, be *BlockError) Refusal {
	r := Refusal{Resource: resource, Err: be}
	r.Quota, r.Window = be.Quota()
	r.RetryAfter, r.RetryKnown = en.RetryAfter()
	r.Reset, r.ResetKnown = en.Reset()
	// What the window had left: only where the quota is what the rule
	// admitted against (not a cold WarmUp rule's lower limit, nor a
	// related resource's rate).
	rule := &be.Rule
	if be.Reason == ReasonConcurrency || be.Reason == ReasonFlow && rule.Behavior == Reject && rule.RelatedResource == "" {
		r.Remaining = max(r.Quota-int64(en.Seen()), 0)
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
	rr := e.rules.Load().byResource[resource]
	if rr == nil || rr.policy == nil {
		return "", 0, 0, false
	}
	quota, window = rr.policy.Quota()
	return rr.policy.Rule.Name(), quota, window, true
}
