package flow

import (
	"errors"
	"fmt"
	"time"

	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/stat"
)

// ErrInvalidKey matches the error of an Entry whose WithKey is empty or
// longer than MaxKeyLen. Such a request is neither admitted nor counted as
// blocked.
var ErrInvalidKey = errors.New("flow: WithKey must be 1 to MaxKeyLen bytes")

// WithKey names the caller a request comes from (a user ID, an API key, a
// client address: see AddrKey), for the resource's PerKey rules; on a
// resource without them it changes nothing, but an empty key, or one
// longer than MaxKeyLen, is an error (ErrInvalidKey) on every resource.
// No key bytes are kept (a tracked key is two hashes of it), so key may
// point into a buffer the caller reuses.
func WithKey(key string) EntryOption { return EntryOption{key: key, hasKey: true} }

// tableID identifies a per-key rule's table across reloads: everything
// but its thresholds and MaxKeys, which a reload may change while the keys
// keep their counts; and which of the rules alike it is.
type tableID struct {
	resource, id string
	metric       Metric
	behavior     Behavior
	interval     time.Duration
	maxQueue     time.Duration
	global       bool // a Global rule's local fallback
	copy         int
}

// keyRule is a compiled PerKey rule.
type keyRule struct {
	t        *keytable.Table
	limit    int64   // Window: per window; Conc: in flight
	rate     float64 // Pace
	maxQueue int64   // Pace
	// spec holds the keys listed in the rule's Keys; nil when none.
	spec map[string]keySpec
	be   *BlockError
}

// keySpec is a listed key: its state, kept apart from the table (never
// evicted), its own threshold and the error that says so.
type keySpec struct {
	st    *keytable.State
	limit int64
	rate  float64
	be    *BlockError
}

// keyHeld is what a request took from a key, to give back if a later
// check blocks it.
type keyHeld struct {
	st *keytable.State
	b  int64 // Window: the bucket counted in; Pace: the cost
	// slot is a Pace rule's slot on the key's timeline (see
	// giveBackPace).
	slot int64
}

// maxKeyRules bounds a resource's PerKey QPS rules (held on the stack
// during Entry); it has at most one PerKey Concurrency rule.
const maxKeyRules = 4

// addKeyed adds PerKey rule r, whose table is identified by id, to rr.
func (e *Engine) addKeyed(next, old *ruleSet, rr *resourceRules, r *Rule, id tableID) {
	t := e.keyTable(next, old, rr, r, id)
	kr := keyRule{t: t, be: newBlockError(r, ReasonFlow)}
	limitOf := func(threshold float64) (int64, float64) {
		switch t.Kind() {
		case keytable.Conc:
			return int64(threshold), 0
		case keytable.Pace:
			return 0, threshold
		}
		return perWindow(threshold, r.StatInterval), 0
	}
	kr.limit, kr.rate = limitOf(r.Threshold)
	switch t.Kind() {
	case keytable.Conc:
		kr.be = newBlockError(r, ReasonConcurrency)
	case keytable.Pace:
		kr.maxQueue = int64(r.MaxQueueing)
		kr.be = newBlockError(r, ReasonQueue)
	}
	if len(r.Keys) > 0 {
		kr.spec = make(map[string]keySpec, len(r.Keys))
		for _, kl := range r.Keys {
			limit, rate := limitOf(kl.Threshold)
			kr.spec[kl.Key] = keySpec{st: t.Specific(kl.Key), limit: limit, rate: rate,
				be: newKeyBlockError(r, kr.be.Reason, kl.Threshold)}
		}
	}
	if t.Kind() == keytable.Conc {
		rr.keyConc = kr
	} else {
		rr.keyed = append(rr.keyed, kr)
	}
}

// keyTable returns the table of PerKey rule r in the set being built: the
// old set's, moved to a new one if MaxKeys changed, with the keys r lists
// in Keys kept apart and those it no longer lists put back.
func (e *Engine) keyTable(next, old *ruleSet, rr *resourceRules, r *Rule, id tableID) *keytable.Table {
	t := old.tables[id]
	if t == nil || t.Capacity() != keytable.CapacityFor(r.MaxKeys) {
		nt := keytable.New(keyTableConfig(r, e.now))
		nt.CountEvictions(rr.node.AddKeyEviction) // before Migrate: it evicts too
		if t != nil {
			nt.Migrate(t)
		}
		t = nt
	} else {
		t.CountEvictions(rr.node.AddKeyEviction) // the resource's node may be new
	}
	next.tables[id] = t
	listed := make([]string, len(r.Keys))
	for i, kl := range r.Keys {
		listed[i] = kl.Key
	}
	t.KeepSpecific(listed)
	return t
}

// keyTableConfig is the table of per-key rule r (valid, defaults in).
func keyTableConfig(r *Rule, now func() int64) keytable.Config {
	cfg := keytable.Config{MaxKeys: r.MaxKeys, Now: now}
	switch {
	case r.Metric == Concurrency:
		cfg.Kind = keytable.Conc
	case r.Behavior == Throttle:
		cfg.Kind = keytable.Pace
	default:
		cfg.Kind = keytable.Window
		cfg.Window = int64(r.StatInterval)
	}
	return cfg
}

// state returns the state and limits of the request's key.
func (kr *keyRule) state(key string, hasKey bool) (*keytable.State, int64, float64) {
	if !hasKey {
		return kr.t.NoKey(), kr.limit, kr.rate
	}
	if kr.spec != nil {
		if s, ok := kr.spec[key]; ok {
			return s.st, s.limit, s.rate
		}
	}
	return kr.t.Get(key), kr.limit, kr.rate
}

// blockError is the error a request of key is blocked with: the rule's,
// or a listed key's own (its Quota is the key's).
func (kr *keyRule) blockError(q *request) *BlockError {
	if q.hasKey && kr.spec != nil {
		if s, ok := kr.spec[q.key]; ok {
			return s.be
		}
	}
	return kr.be
}

// acquireKeyConc counts the request in its key's concurrency.
func (kr *keyRule) acquire(q *request) (*keytable.State, int64, bool) {
	for {
		st, limit, _ := kr.state(q.key, q.hasKey)
		seen, ok, dead := st.Acquire(q.n, limit)
		if !dead {
			return st, seen, ok
		}
		// Its state left the table as we counted: look again.
	}
}

// admit checks the request against a PerKey QPS rule. It returns how long
// a throttled request waits, or false, what the rule saw and when it could
// admit it.
func (kr *keyRule) admit(q *request, now int64, held *keyHeld) (wait int64, seen float64, rm room, ok bool) {
	return kr.admitQueue(q, now, held, kr.maxQueue)
}

// admitAt is admit of a PerKey Throttle rule's slot at instant t itself,
// with no queue past it (see Engine.align).
func (kr *keyRule) admitAt(q *request, t int64, held *keyHeld) (wait int64, seen float64, rm room, ok bool) {
	return kr.admitQueue(q, t, held, 0)
}

func (kr *keyRule) admitQueue(q *request, now int64, held *keyHeld, maxQueue int64) (wait int64, seen float64, rm room, ok bool) {
	for {
		st, limit, rate := kr.state(q.key, q.hasKey)
		if kr.t.Kind() == keytable.Pace {
			ph, d, ok := reservePace(st.Timeline(), maxQueue, now, q.n, rate)
			if !ok {
				return 0, rate, paceRoom(d, maxQueue), false
			}
			if st.Dead() {
				giveBackPace(st.Timeline(), ph)
				continue
			}
			*held = keyHeld{st: st, b: ph.cost, slot: ph.slot}
			return d, 0, room{}, true
		}
		b, s, ok, dead := kr.t.Admit(st, now, q.n, limit)
		if dead {
			continue
		}
		if !ok {
			retry, reset := kr.t.RoomIn(st, now, q.n, limit)
			return 0, float64(s), room{retry, reset}, false
		}
		*held = keyHeld{st: st, b: b}
		return 0, 0, room{}, true
	}
}

// undo gives back what a request took from a key.
func (kr *keyRule) undo(h keyHeld, n int64) {
	if h.st == nil {
		return
	}
	if kr.t.Kind() == keytable.Pace {
		giveBackPace(h.st.Timeline(), paceHeld{h.b, h.slot})
		return
	}
	h.st.Undo(h.b, n)
}

// checkKeyRules counts how many PerKey rules a rule set has per resource
// and in all, against the bounds (load time).
func (e *Engine) checkKeyRules(i int, r *Rule, perRes map[string][2]int, total *int) error {
	if !r.PerKey {
		return nil
	}
	c := perRes[r.Resource]
	if r.Global {
		// Counted with the resource's global rules; its local fallback
		// tracks keys too.
	} else if r.Metric == Concurrency {
		if c[1]++; c[1] > 1 {
			return r.errorf(i, "PerKey", true, "is a second PerKey Concurrency rule for resource %s: give one rule Keys instead", r.Resource)
		}
	} else if c[0]++; c[0] > maxKeyRules {
		return r.errorf(i, "PerKey", true, "exceeds %d PerKey QPS rules for resource %s", maxKeyRules, r.Resource)
	}
	perRes[r.Resource] = c
	if *total += r.MaxKeys; *total > e.maxKeys {
		return r.errorf(i, "MaxKeys", r.MaxKeys, "takes the rule set's keys to %d, over the engine's WithMaxKeys (%d)", *total, e.maxKeys)
	}
	return nil
}

// DefaultEngineMaxKeys is the most keys an engine's PerKey rules may track
// together (the sum of their MaxKeys) unless WithMaxKeys says otherwise.
const DefaultEngineMaxKeys = 1_000_000

// WithMaxKeys bounds the sum of MaxKeys over an engine's PerKey rules
// (default DefaultEngineMaxKeys): each tracked key costs about 230 bytes,
// so the default bounds per-key state near 230 MB.
func WithMaxKeys(n int) Option { return func(cfg *config) { cfg.maxKeys = n } }

func validateMaxKeys(n int) error {
	if n < 1 || n > 1<<30 {
		return fmt.Errorf("flow: WithMaxKeys must be in [1, 2^30], got %d", n)
	}
	return nil
}

// keyless counts a request without a key checked by per-key rules.
func keyless(node *stat.Node, q *request) {
	if !q.hasKey {
		node.AddKeyless()
	}
}
