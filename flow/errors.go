package flow

import (
	"errors"
	"fmt"

	"github.com/leapflow/leapflow/internal/names"
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
)

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
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// BlockError reports a blocked request: the rule that blocked it and why.
// One is built per rule and reason when rules are loaded and shared by every
// request they block, so blocking allocates nothing; treat it as read-only.
// The value the rule saw for the request is on the Entry (Entry.Seen).
type BlockError struct {
	Rule   Rule
	Reason Reason
	msg    string
}

func newBlockError(r *Rule, reason Reason) *BlockError {
	return &BlockError{
		Rule:   *r,
		Reason: reason,
		msg: fmt.Sprintf("flow: %s blocked by rule %s (%s %v, %s, %s)",
			names.Abbrev(r.Resource), names.Abbrev(r.name()), r.Metric, r.Threshold, r.Behavior, reason),
	}
}

func (e *BlockError) Error() string { return e.msg }

// Is makes errors.Is(err, ErrBlocked) true.
func (e *BlockError) Is(target error) bool { return target == ErrBlocked }
