package flow

import (
	"context"
	"errors"
	"fmt"

	"github.com/leapflow/leapflow/internal/callerkey"
	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/internal/names"
)

// KeyResetter is a BoundSource of a PerKey Global rule that can empty one
// caller's shared limit (Engine.ResetKey): the Redis source is one.
type KeyResetter interface {
	ResetKey(ctx context.Context, caller string) error
}

// ErrNoPerKeyRule matches the error of ResetKey on a resource without
// PerKey rate rules.
var ErrNoPerKeyRule = errors.New("flow: no PerKey rule")

// ResetKey empties what key has counted under resource's PerKey rate
// rules (window and Throttle, a listed key's too), and under its PerKey
// Global rules: their local fallbacks here, and, through a source that is
// a KeyResetter, their shared limits (a source that is not one is not
// asked). The key is then admitted as a key never seen (redis_rate's
// Reset). PerKey Concurrency rules are left alone: their counts are
// requests in flight. A request racing the reset counts before or after
// it. The key is read as WithKey reads it (over 256 bytes, its start and
// a hash; empty or over 1024 bytes, an error matching ErrInvalidOption).
// A resource without PerKey rate rules is an error matching
// ErrNoPerKeyRule; a source's failure is returned (the local reset is
// done either way), with ctx bounding the sources' calls.
func (e *Engine) ResetKey(ctx context.Context, resource, key string) error {
	if key == "" || len(key) > maxKeyLen {
		return fmt.Errorf("%w: ResetKey's key must be 1 to 1024 bytes, got %d bytes", ErrInvalidOption, len(key))
	}
	if len(key) > callerkey.MaxLen {
		key = callerkey.Bound(key)
	}
	rr := e.ruleSet().byResource[resource]
	if rr == nil || len(rr.keyed) == 0 && !rr.keyedGlobal && !hasDryKeyed(rr) {
		return fmt.Errorf("%w on resource %s", ErrNoPerKeyRule, names.Abbrev(resource))
	}
	resetKeyed(rr, key)
	for i := range rr.shadows {
		if srr := rr.shadows[i].rr; srr != nil {
			resetKeyed(srr, key) // a dry-run PerKey rule's, as if in force
		}
	}
	var errs []error
	for i := range rr.globals {
		g := &rr.globals[i]
		if !g.req.PerKey {
			continue
		}
		if g.keys != nil {
			var listed *keytable.State
			if s, ok := g.spec[key]; ok {
				listed = s.st
			}
			g.keys.Reset(key, listed)
		}
		if kr, ok := g.bound.(KeyResetter); ok {
			if err := kr.ResetKey(ctx, key); err != nil {
				errs = append(errs, fmt.Errorf("flow: resetting key of rule %s on %s: %w", names.Abbrev(g.be.Rule.Name()), names.Abbrev(resource), err))
			}
		}
	}
	return errors.Join(errs...)
}

// resetKeyed empties key's counts under rr's PerKey rate rules.
func resetKeyed(rr *resourceRules, key string) {
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		var listed *keytable.State
		if s, ok := kr.spec[key]; ok {
			listed = s.st
		}
		kr.t.Reset(key, listed)
	}
}

// hasDryKeyed reports whether rr has a dry-run PerKey rate rule.
func hasDryKeyed(rr *resourceRules) bool {
	for i := range rr.shadows {
		if srr := rr.shadows[i].rr; srr != nil && len(srr.keyed) > 0 {
			return true
		}
	}
	return false
}
