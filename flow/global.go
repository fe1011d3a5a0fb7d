package flow

import (
	"context"
	"time"
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
// Entry.RetryAfter then reports. Optional; without it a global refusal's
// retry is unknown.
type RetryHinter interface {
	RetryIn(n int64) (time.Duration, bool)
}

// KeyedRetryHinter is RetryHinter for a KeyedSource's callers.
type KeyedRetryHinter interface {
	RetryInKey(caller string, n int64) (time.Duration, bool)
}
