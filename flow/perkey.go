package flow

import (
	"fmt"
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/callerkey"
	"github.com/leapflow/leapflow/internal/hotkeys"
	"github.com/leapflow/leapflow/internal/keytable"
	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/internal/pace"
	"github.com/leapflow/leapflow/internal/stats"
)

// keyRule is a compiled PerKey rule.
type keyRule struct {
	t        *keytable.Table
	limit    int64   // Window: per window; Conc: in flight
	rate     float64 // Pace
	maxQueue int64   // Pace
	// spec holds the keys listed in the rule's Keys; nil when none.
	spec map[string]keySpec
	be   *BlockError
	// hot holds a sample of the rule's requests by key (see sample).
	hot *hotkeys.Sketch
}

// sample adds one request in hotkeys.Every to the rule's sketch of its
// busiest keys, chosen by bits of the draw the request made with its
// clock read (not those the clock's refresh reads): a compare is all the
// others cost.
func (kr *keyRule) sample(q *request, refused bool, now int64) {
	// A draw of 0 (none made, or a second admission) samples nothing.
	if q.draw>>16&(hotkeys.Every-1) == hotkeys.Every-1 && q.hasKey {
		kr.hot.Add(q.key, refused, now)
	}
}

// keySpec is a listed key: its state, kept apart from the table (never
// evicted) while listed, and its life then, its own threshold and the
// error that says so.
type keySpec struct {
	st    *keytable.State
	life  keytable.Life
	limit int64
	rate  float64
	be    *BlockError
}

// keyHeld is what a request took from a key, to give back if a later
// check blocks it.
type keyHeld struct {
	st *keytable.State
	b  int64 // Window: the bucket counted in; Pace: the cost
	// t is a Window rule's table counted in, whose bucket length b is in:
	// the rule's, or the one a reload of another window moved the keys
	// to (see keytable.Table.Successor).
	t *keytable.Table
	// slot is a Pace rule's slot on the key's timeline (see
	// pace.GiveBack).
	slot int64
	// life is the state's when it counted (see keytable.Life: a state is
	// reused for other keys, and gives back only in its own life).
	life keytable.Life
}

// start is when a Window hold's bucket starts.
func (h *keyHeld) start() int64 { return h.b * h.t.BucketLen() }

// holds reports whether a Window hold's bucket holds instant t.
func (h *keyHeld) holds(t int64) bool { return t/h.t.BucketLen() == h.b }

// maxKeyRules bounds a resource's PerKey QPS rules (held on the stack
// during Entry); it has at most one PerKey Concurrency rule.
const maxKeyRules = 4

// addKeyed adds c's PerKey rule.
func addKeyed(c *compiling) {
	r, rr := c.r, c.rr
	t := c.e.keyTable(c)
	kr := keyRule{t: t, be: newBlockError(r, ReasonFlow)}
	kr.hot = keep(c, c.old.hot, c.next.hot, func(h *hotkeys.Sketch, _ *Rule) (*hotkeys.Sketch, bool) { return h, true }, hotkeys.New)
	kr.limit, kr.rate = keyLimit(t.Kind(), r, r.Threshold)
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
			limit, rate := keyLimit(t.Kind(), r, kl.Threshold)
			st, life := t.Specific(kl.Key)
			kr.spec[kl.Key] = keySpec{st: st, life: life, limit: limit, rate: rate,
				be: newKeyBlockError(r, kr.be.Reason, kl.Threshold)}
		}
	}
	if t.Kind() == keytable.Conc {
		rr.keyConc = kr
	} else {
		rr.keyed = append(rr.keyed, kr)
	}
}

// keyLimit is a key's limit under PerKey rule r at threshold: in flight
// (Conc), per window (Window), or its rate (Pace).
func keyLimit(k keytable.Kind, r *Rule, threshold float64) (int64, float64) {
	switch k {
	case keytable.Conc:
		return int64(threshold), 0
	case keytable.Pace:
		return 0, threshold
	}
	return perWindow(threshold, r.StatInterval), 0
}

// keyThresholds returns a key's threshold under PerKey rule r: its own if
// r lists it, else the rule's.
func keyThresholds(r *Rule) func(key string) float64 {
	own := make(map[string]float64, len(r.Keys))
	for _, kl := range r.Keys {
		own[kl.Key] = kl.Threshold
	}
	return func(key string) float64 {
		if t, ok := own[key]; ok {
			return t
		}
		return r.Threshold
	}
}

// keyTable returns the table of c's PerKey rule (or a Global PerKey rule's
// local fallback). A reload that keeps the rule keeps its keys' counts and
// holds:
//   - of the same kind of table (Throttle and Reject, or QPS and
//     Concurrency, keep nothing of each other's);
//   - moved to a new table if MaxKeys changed (see keytable.Migrate);
//   - over a window of a new StatInterval, from what the old window
//     counted over the new one's span (see keytable.Rewindow);
//   - a throttled key's queue stretched to its new rate;
//   - the keys r lists in Keys kept apart, those it no longer lists put
//     back.
func (e *Engine) keyTable(c *compiling) *keytable.Table {
	r, rr := c.r, c.rr
	cfg := keyTableConfig(r, e.now)
	var was *Rule // the rule the kept table was made for; nil: none
	listed := make([]string, len(r.Keys))
	for i, kl := range r.Keys {
		listed[i] = kl.Key
	}
	t := keep(c, c.old.tables, c.next.tables, func(t *keytable.Table, old *Rule) (*keytable.Table, bool) {
		if t.Kind() != cfg.Kind {
			return nil, false
		}
		was = old
		if t.Kind() == keytable.Pace {
			before, after := keyThresholds(was), keyThresholds(r)
			keyRate := func(key string) float64 { return slower(before(key), after(key)) }
			t.RescaleTimelines(c.now, slower(was.Threshold, r.Threshold), keyRate)
		}
		switch {
		case t.Kind() == keytable.Window && t.BucketLen() != cfg.Window/keytable.Buckets:
			nt := newKeyTable(cfg, rr)
			// In the table's terms: a Global rule's local fallback admits
			// LocalShare of its thresholds.
			before, after := keyThresholds(was), keyThresholds(r)
			limits := func(key string) keytable.Limits {
				return keytable.Limits{Was: perWindow(before(key)*tableShare(was), was.StatInterval),
					Now: perWindow(after(key)*tableShare(r), r.StatInterval)}
			}
			rule := keytable.Limits{Was: perWindow(was.Threshold*tableShare(was), was.StatInterval),
				Now: perWindow(r.Threshold*tableShare(r), r.StatInterval)}
			nt.Rewindow(t, rule, limits, listed)
			return nt, true
		case t.Capacity() != keytable.CapacityFor(r.MaxKeys):
			nt := newKeyTable(cfg, rr) // counting before Migrate: it evicts too
			nt.Migrate(t)
			return nt, true
		}
		countKeys(t, rr) // the resource's node may be new
		return t, true
	}, func() *keytable.Table { return newKeyTable(cfg, rr) })
	t.KeepSpecific(listed)
	if t.Kind() == keytable.Pace {
		t.SetPaceLife(slowestSlot(r))
		if was != nil {
			// A key listed anew came from the sets (or its ghost), its
			// queue stretched by the rule's ratio: its own is the rule's
			// old rate over its new one.
			wasListed := make(map[string]bool, len(was.Keys))
			for _, kl := range was.Keys {
				wasListed[kl.Key] = true
			}
			for _, kl := range r.Keys {
				if !wasListed[kl.Key] {
					t.RescaleListed(kl.Key, c.now, slower(r.Threshold, kl.Threshold))
				}
			}
		}
	}
	return t
}

// tableShare is the share of PerKey rule r's thresholds its key table
// admits: a Global rule's LocalShare (its local fallback), else all.
func tableShare(r *Rule) float64 {
	if r.Global {
		return r.LocalShare
	}
	return 1
}

// slowestSlot is the longest slot of PerKey Throttle rule r, at its
// slowest positive rate (ns): how long a key's timeline matters after its
// last slot.
func slowestSlot(r *Rule) int64 {
	slowest := r.Threshold
	for _, kl := range r.Keys {
		if kl.Threshold > 0 && (slowest <= 0 || kl.Threshold < slowest) {
			slowest = kl.Threshold
		}
	}
	if slowest <= 0 {
		return 0
	}
	return int64(math.Ceil(float64(time.Second) / slowest))
}

// newKeyTable is a table of cfg counting its evictions in rr's node.
func newKeyTable(cfg keytable.Config, rr *resourceRules) *keytable.Table {
	t := keytable.New(cfg)
	countKeys(t, rr)
	return t
}

// countKeys makes t count its evictions and forgotten keys in rr's node.
func countKeys(t *keytable.Table, rr *resourceRules) {
	t.CountEvictions(rr.node.AddKeyEviction)
	t.CountForgotten(rr.node.AddKeyForgotten)
}

// keyTableConfig is the table of per-key rule r (valid, defaults in).
func keyTableConfig(r *Rule, now func() int64) keytable.Config {
	cfg := keytable.Config{MaxKeys: r.MaxKeys, Now: now}
	switch {
	case r.Metric == Concurrency:
		cfg.Kind = keytable.Conc
	case r.Behavior == Throttle:
		cfg.Kind = keytable.Pace
		cfg.PaceLife = slowestSlot(r)
	default:
		cfg.Kind = keytable.Window
		cfg.Window = int64(r.StatInterval)
	}
	return cfg
}

// state returns the state of the request's key, the life it found it in,
// and the key's limits.
func (kr *keyRule) state(key string, hasKey bool) (*keytable.State, keytable.Life, int64, float64) {
	if !hasKey {
		st, life := kr.t.NoKeyState()
		return st, life, kr.limit, kr.rate
	}
	if kr.spec != nil {
		if s, ok := kr.spec[key]; ok {
			if s.st.Alive(s.life) {
				return s.st, s.life, s.limit, s.rate
			}
			// A reload that no longer lists the key put its state in the
			// sets, which evicted it: the key is in the table now.
			st, life := kr.t.Get(key)
			return st, life, s.limit, s.rate
		}
	}
	st, life := kr.t.Get(key)
	return st, life, kr.limit, kr.rate
}

// room is how long from now until the rule would admit the request under
// its key, taking nothing and adding no key (a key the table lacks has
// room now); -1 when it never would.
func (kr *keyRule) room(q *request, now int64) int64 {
	st, limit, rate := kr.peek(q)
	if kr.t.Kind() == keytable.Pace {
		queue := kr.maxQueue
		if q.noQueue {
			queue = 0
		}
		if st == nil {
			return pace.Room(nil, queue, now, q.n, rate)
		}
		return pace.Room(st.Timeline(), queue, now, q.n, rate)
	}
	if q.n > limit {
		return -1
	}
	if st == nil {
		return 0
	}
	retry, _ := kr.t.RoomIn(st, now, q.n, limit)
	return retry
}

// peek is state for a reader: the state and limits of the request's key,
// the state nil when the table lacks the key (nothing is added).
func (kr *keyRule) peek(q *request) (*keytable.State, int64, float64) {
	if !q.hasKey {
		return kr.t.NoKey(), kr.limit, kr.rate
	}
	if s, ok := kr.spec[q.key]; ok {
		if s.st.Alive(s.life) {
			return s.st, s.limit, s.rate
		}
		return kr.t.Peek(q.key), s.limit, s.rate
	}
	return kr.t.Peek(q.key), kr.limit, kr.rate
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

// acquire counts the request in its key's concurrency.
func (kr *keyRule) acquire(q *request) (*keytable.State, int64, bool) {
	for {
		st, life, limit, _ := kr.state(q.key, q.hasKey)
		seen, ok, dead := kr.t.Acquire(st, life, q.n, limit)
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
	if kr.t.Kind() == keytable.Window {
		seen, rm, ok = kr.admitWindow(q, now, held)
		return 0, seen, rm, ok
	}
	if q.noQueue {
		return kr.admitPaced(q, now, held, 0)
	}
	return kr.admitPaced(q, now, held, kr.maxQueue)
}

// admitAt is admit of a PerKey Throttle rule's slot at instant t itself,
// with no queue past it (see Engine.align).
func (kr *keyRule) admitAt(q *request, t int64, held *keyHeld) (wait int64, seen float64, rm room, ok bool) {
	again := *q
	again.draw = 0 // sampled once, when first admitted (see sample)
	return kr.admitPaced(&again, t, held, 0)
}

// admitWindow is admit of a PerKey Window rule (Reject): the request
// counted in its key's window at now, or false, what the window held and
// when it would have room.
func (kr *keyRule) admitWindow(q *request, now int64, held *keyHeld) (seen float64, rm room, ok bool) {
	t := kr.t
	var st *keytable.State
	var life keytable.Life
	limit := kr.limit
	if q.hasKey && kr.spec == nil {
		st, life = t.Get(q.key) // state, spelled out for the common case
	} else {
		st, life, limit, _ = kr.state(q.key, q.hasKey)
	}
	for {
		b, s, ok, dead := t.Admit(st, life, now, q.n, limit)
		if dead {
			// Left the table as we counted: look again, in the table a
			// reload of a new window moved the keys to, if it did (under
			// the stricter of the key's two limits).
			if nt, lim := t.Successor(q.key, q.hasKey, limit); nt != nil {
				t, limit = nt, lim
			}
			st, life = t.Lookup(q.key, q.hasKey)
			continue
		}
		kr.sample(q, !ok, now)
		if !ok {
			retry, reset := t.RoomIn(st, now, q.n, limit)
			return float64(s), room{retry, reset}, false
		}
		held.st, held.b, held.t, held.life = st, b, t, life
		return 0, room{}, true
	}
}

// admitPaced is admit of a PerKey Throttle rule with a queue of at most
// maxQueue (ns).
func (kr *keyRule) admitPaced(q *request, now int64, held *keyHeld, maxQueue int64) (wait int64, seen float64, rm room, ok bool) {
	st, life, _, rate := kr.state(q.key, q.hasKey)
	for {
		ph, d, ok := pace.Reserve(st.Timeline(), maxQueue, now, q.n, rate)
		if !ok {
			kr.sample(q, true, now)
			return 0, rate, paceRoom(d, maxQueue), false
		}
		if !st.Alive(life) {
			// Left its life as it reserved: the slot stays where it
			// landed (its key's memory, or the next key's timeline:
			// stricter, never looser); look again.
			st, life = kr.t.Lookup(q.key, q.hasKey)
			continue
		}
		*held = keyHeld{st: st, b: ph.Cost, slot: ph.Slot, life: life}
		kr.sample(q, false, now)
		return d, 0, room{}, true
	}
}

// undo gives back what a request took from a key.
func (kr *keyRule) undo(h keyHeld, n int64) {
	if h.st == nil {
		return
	}
	if kr.t.Kind() == keytable.Pace {
		// Not into another key's timeline: its head may be this slot's
		// end too.
		h.st.GiveBack(h.life, pace.Held{Cost: h.b, Slot: h.slot})
		return
	}
	h.st.Undo(h.b, h.life, n)
}

// keyless counts a request without a key checked by per-key rules.
func keyless(node *stats.Node, q *request) {
	if !q.hasKey {
		node.AddKeyless()
	}
}

var perKeyKind = kind{
	is:       func(r *Rule) bool { return r.PerKey && !r.Global },
	validate: validatePerKeyKind,
	compile:  addKeyed,
	describe: func(r *Rule) string {
		if r.Metric == Concurrency {
			return " in flight per key"
		}
		return describeRate(r) + " per key"
	},
}

// validatePerKeyKind checks what a PerKey rule adds.
func validatePerKeyKind(r *Rule, i int) error {
	if !r.PerKey {
		return nil
	}
	return r.validatePerKey(i)
}

// takeKeyConcurrency counts the request in flight under its key of the
// PerKey Concurrency rule.
func (rr *resourceRules) takeKeyConcurrency(h *held, now int64, q *request, rf *refusal) bool {
	st, seen, ok := rr.keyConc.acquire(q)
	rr.keyConc.sample(q, !ok, now)
	if !ok {
		*rf = refusal{rr.keyConc.blockError(q), float64(seen), unknownRoom, 0}
		return false
	}
	h.kc = st
	return true
}

// takeKeyed admits the request under its key of each PerKey rate rule;
// a key's window moves now to its newest bucket.
func (rr *resourceRules) takeKeyed(h *held, now, wait int64, q *request, rf *refusal) (int64, int64, bool) {
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		d, seen, rm, ok := kr.admit(q, now, &h.keys[i])
		if !ok {
			*rf = refusal{kr.blockError(q), seen, rm, i}
			return now, wait, false
		}
		if kr.t.Kind() == keytable.Window {
			now = max(now, h.keys[i].start())
		}
		wait = max(wait, d)
	}
	return now, wait, true
}

// releaseKeyed gives back what the request took under its keys.
func (rr *resourceRules) releaseKeyed(h *held, n int64) {
	if h.kc != nil {
		rr.keyConc.t.Release(h.kc, n)
	}
	for i := range rr.keyed {
		rr.keyed[i].undo(h.keys[i], n)
	}
}

// keyedHold reports whether every key window of the request counts it at
// instant t.
func (h *held) keyedHold(rr *resourceRules, t int64) bool {
	for i := range rr.keyed {
		if kr := &rr.keyed[i]; kr.t.Kind() == keytable.Window && h.keys[i].st != nil && !h.keys[i].holds(t) {
			return false
		}
	}
	return true
}

// alignKeyed checks that each key window holds t already (it cannot count
// ahead of its newest bucket) and takes each key's Throttle slot again at
// t.
func (rr *resourceRules) alignKeyed(h *held, t int64, q *request, rf *refusal) bool {
	n := q.n
	for i := range rr.keyed {
		kr := &rr.keyed[i]
		if kr.t.Kind() == keytable.Window {
			if h.keys[i].st != nil && !h.keys[i].holds(t) {
				*rf = refusal{kr.blockError(q), 0, unknownRoom, i}
				return false
			}
			continue
		}
		kr.undo(h.keys[i], n)
		h.keys[i] = keyHeld{}
		if _, seen, _, ok := kr.admitAt(q, t, &h.keys[i]); !ok {
			*rf = refusal{kr.blockError(q), seen, unknownRoom, i}
			return false
		}
	}
	return true
}

// validatePerKey checks what a PerKey rule adds.
func (r *Rule) validatePerKey(i int) error {
	bad := func(field string, value any, reason string) error { return r.errorf(i, field, value, reason) }
	switch {
	case r.Behavior == WarmUp || r.Behavior == WarmUpThrottle:
		return bad("Behavior", r.Behavior, "must be Reject or Throttle for a PerKey rule")
	case r.RelatedResource != "":
		return bad("RelatedResource", r.RelatedResource, "cannot be combined with PerKey")
	case r.MaxKeys < 1 || r.MaxKeys > maxMaxKeys:
		return bad("MaxKeys", r.MaxKeys, fmt.Sprintf("must be in [1, %d]", maxMaxKeys))
	case len(r.Keys) > maxKeyLimits:
		return bad("Keys", len(r.Keys), fmt.Sprintf("must list at most %d keys", maxKeyLimits))
	}
	if err := r.validateKeyThreshold(i, "Threshold", r.Threshold); err != nil {
		return err
	}
	seen := make(map[string]bool, len(r.Keys))
	for k, kl := range r.Keys {
		field := fmt.Sprintf("Keys[%d]", k)
		switch {
		case kl.Key == "":
			return bad(field+".Key", `""`, "must not be empty")
		case len(kl.Key) > maxKeyLen:
			return bad(field+".Key", names.Abbrev(kl.Key), fmt.Sprintf("must be at most %d bytes", maxKeyLen))
		case seen[callerkey.Bound(kl.Key)]:
			// As loaded: a key over 256 bytes stands for its start and a
			// hash, which another listed key may spell out.
			return bad(field+".Key", names.Abbrev(kl.Key), "is listed twice")
		case math.IsNaN(kl.Threshold) || math.IsInf(kl.Threshold, 0) || kl.Threshold < 0 || kl.Threshold > maxThreshold:
			return bad(field+".Threshold", kl.Threshold, fmt.Sprintf("must be a finite number in [0, %g]", float64(maxThreshold)))
		}
		seen[callerkey.Bound(kl.Key)] = true
		if err := r.validateKeyThreshold(i, field+".Threshold", kl.Threshold); err != nil {
			return err
		}
	}
	return nil
}

// validateKeyThreshold checks a per-key threshold against what a key's
// compact state holds.
func (r *Rule) validateKeyThreshold(i int, field string, t float64) error {
	if err := r.validateWhole(i, field, t); err != nil {
		return err
	}
	switch {
	case r.Metric == QPS && r.Behavior == Reject && perWindow(t, r.StatInterval) > maxKeyWindowCount:
		return r.errorf(i, field, t, "admits %d per window, more than a key's window holds (%d)", perWindow(t, r.StatInterval), int64(maxKeyWindowCount))
	case r.Behavior == Throttle && t > 0 && t < minPacedRate:
		return r.errorf(i, field, t, "must be 0 or at least 0.001 (one request per 1000 s) for Throttle")
	}
	return nil
}

// Per-key bounds.
const (
	// defaultMaxKeys is the MaxKeys of a PerKey rule with none.
	defaultMaxKeys = 100_000
	// maxMaxKeys is the largest MaxKeys a rule accepts.
	maxMaxKeys = 1 << 24
	// maxKeyLen is the longest key WithKey accepts, in bytes.
	maxKeyLen = 1024
	// maxKeyWindowCount is the most a PerKey QPS rule (or a specific key)
	// may admit per window: Threshold x StatInterval / 1s.
	maxKeyWindowCount = 1<<32 - 1
	// maxKeyLimits bounds a rule's Keys.
	maxKeyLimits = 10_000
)

// KeyStats is what a PerKey rule (not Global) holds of its keys, as
// Engine.KeyStats reads it.
type KeyStats struct {
	Rule Rule
	// Tracked is how many keys its table holds now, of at most Capacity
	// (MaxKeys rounded up to a whole set; listed keys are kept apart).
	Tracked, Capacity int
	// Evictions and Forgotten are the resource's (its PerKey rules add
	// to them alike): keys evicted while their window held admissions,
	// and those forgotten while it mattered (stat.Snapshot's
	// KeyEvictions and KeysForgotten).
	Evictions, Forgotten int64
	// Passed and Refused are the keys with the most admissions and
	// refusals by the rule over the last minute, at most ten each, most
	// first. They are estimates from a sample of one request in 256 (the
	// request path pays for the draw, and a sampled request for the
	// sketch): a key with few requests may be missing, and counts are
	// multiples of 256.
	Passed, Refused []KeyCount
}

// KeyCount is a key and its estimated count.
type KeyCount struct {
	Key   string
	Count int64
}

// topKeys is how many keys of each outcome KeyStats reports.
const topKeys = 10

// KeyStats returns each PerKey rule's keys (Global ones excepted), in
// the order of the rules in force. It reads off the request path: the
// sampled keys under their sketch's lock, the counts from the table.
func (e *Engine) KeyStats() []KeyStats {
	set := e.ruleSet()
	if len(set.hot) == 0 {
		return nil
	}
	of := make(map[*Rule]*hotkeys.Sketch, len(set.hot))
	tables := make(map[*Rule]*keytable.Table, len(set.tables))
	for _, k := range set.hot {
		of[k.r] = k.v
	}
	for _, k := range set.tables {
		tables[k.r] = k.v
	}
	now := e.now()
	var out []KeyStats
	for i := range set.rules {
		r := &set.rules[i]
		h, t := of[r], tables[r]
		if h == nil || t == nil {
			continue
		}
		ks := KeyStats{Rule: *r, Tracked: int(t.Len()), Capacity: t.Capacity()}
		if snap, ok := e.Snapshot(r.Resource); ok {
			ks.Evictions, ks.Forgotten = snap.KeyEvictions, snap.KeysForgotten
		}
		passed, refused := h.Top(now, topKeys)
		ks.Passed, ks.Refused = keyCounts(passed), keyCounts(refused)
		out = append(out, ks)
	}
	return out
}

func keyCounts(cs []hotkeys.Count) []KeyCount {
	out := make([]KeyCount, len(cs))
	for i, c := range cs {
		out[i] = KeyCount(c)
	}
	return out
}
