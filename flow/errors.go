package flow

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/internal/slots"
)

// ErrBlocked matches every BlockError with errors.Is.
var ErrBlocked = errors.New("flow: blocked")

// Reason says why a request was blocked.
type Reason uint8

const (
	// ReasonFlow: the rule's window had no room.
	ReasonFlow Reason = iota
	// ReasonConcurrency: too many requests in flight.
	ReasonConcurrency
	// ReasonQueue: a throttled request would have waited too long.
	ReasonQueue
	// ReasonGlobal: the global token source refused (or failed closed).
	ReasonGlobal
	// ReasonBreaker: a circuit breaker is open, or half-open with its
	// probe out (Refusal.Breaker says which).
	ReasonBreaker
	// ReasonSystem: a system rule (Rule.System) sheds load.
	ReasonSystem
)

// String returns the reason's name ("flow", "concurrency", "queue",
// "global", "breaker", "system").
func (r Reason) String() string {
	switch r {
	case ReasonFlow:
		return "flow"
	case ReasonConcurrency:
		return "concurrency"
	case ReasonQueue:
		return "queue"
	case ReasonGlobal:
		return "global"
	case ReasonBreaker:
		return "breaker"
	case ReasonSystem:
		return "system"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// BlockError reports a blocked request: the rule that blocked it and why.
// One is built per rule and reason when rules are loaded and shared by every
// request they block, so blocking allocates nothing; treat it as read-only.
// What the request was told (retry, reset, what was left) is on its Entry
// (Entry.Refusal).
type BlockError struct {
	Rule   Rule
	Reason Reason
	msg    string
	// quota and window are what Quota returns.
	quota  int64
	window time.Duration
	// refusal is what the Entry of a request it refused carries, to lead
	// back to it (Entry.Refusal).
	refusal *slots.Slot[site]
	// state is a breaker refusal's breaker state.
	state BreakerState
}

func newBlockError(r *Rule, reason Reason) *BlockError {
	return newKeyBlockError(r, reason, r.Threshold)
}

// newKeyBlockError is newBlockError for a key of a PerKey rule whose
// threshold is threshold (its own, when the rule lists it in Keys).
func newKeyBlockError(r *Rule, reason Reason, threshold float64) *BlockError {
	e := &BlockError{
		Rule:   *r,
		Reason: reason,
		msg: fmt.Sprintf("flow: %s blocked by rule %s (%s %v, %s, %s)",
			names.Abbrev(r.Resource), names.Abbrev(r.Name()), r.Metric, threshold, r.Behavior, reason),
	}
	e.refusal = slots.Sentinel(&site{be: e})
	switch {
	case r.Breaker != NotBreaker || r.System != NotSystem:
		// A breaker or a system rule has no quota.
	case r.Metric == Concurrency:
		e.quota = int64(threshold)
	case r.Behavior == Throttle || r.Behavior == WarmUpThrottle:
		e.quota, e.window = int64(math.Ceil(threshold)), time.Second
	default:
		e.quota, e.window = perWindow(threshold, r.StatInterval), r.StatInterval
	}
	return e
}

// Quota returns what the rule allows the blocked request: admissions per
// window for QPS rules (the rule's StatInterval; a second for throttling
// rules, whose rate is rounded up), requests in flight for Concurrency
// rules (window 0). For a key a PerKey rule lists in Keys, the key's own.
// A WarmUp rule's is its full Threshold, above what it allows while cold.
func (e *BlockError) Quota() (quota int64, window time.Duration) { return e.quota, e.window }

// Error names the resource, the rule and why it blocked.
func (e *BlockError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrBlocked) true.
func (e *BlockError) Is(target error) bool { return target == ErrBlocked }
