// Package flow is leapflow's API: rules, and Entry/Exit around each
// protected call.
//
//	eng, _ := flow.New()
//	_ = eng.LoadRules([]flow.Rule{{Resource: "api", Threshold: 100}})
//	en, err := eng.Entry("api")
//	if err != nil {
//		return err // errors.Is(err, flow.ErrBlocked)
//	}
//	defer en.Exit(nil)
//
// An Engine reads its clock once per Entry and once per Exit and passes the
// time down to stat and metric. Entry and Exit allocate nothing on the pass
// and block paths.
//
// # Rules
//
// A QPS rule counts admissions in a sliding window (1 s by default, shared
// by every rule of the resource on 1 s) and does one of four things over its
// threshold: Reject fails fast; WarmUp starts a cold resource at
// Threshold/ColdFactor and rises to Threshold over WarmUpPeriod (Guava's
// SmoothWarmingUp, as in Sentinel); Throttle spaces requests evenly at
// 1/Threshold and queues each for at most MaxQueueing; WarmUpThrottle paces
// at the warming-up rate. A Concurrency rule limits requests in flight.
// RelatedResource makes a rule read another resource's pass rate; Global
// asks a TokenSource (the Redis layer) and falls back as the rule says when
// the source fails.
//
// # Exactness
//
// Fast fail is strict: the check and the count are one atomic step
// (metric.Window.Admit), so no window ever holds more passes than its
// threshold, at any concurrency; several Reject and WarmUp rules on one
// window admit together at the smallest limit, so each pass is counted once.
// Concurrency rules admit by compare-and-swap on one exact counter, released
// by Exit; a Concurrency rule loaded while requests are in flight counts
// them first, from the resource's in-flight gauge (passes minus
// completions), and their Exits end that count (a request being admitted
// under the old rules at that instant is counted from its next admission).
// An admission that holds something (a Concurrency or PerKey Concurrency
// rule counted it) holds a slot that Exit releases once, so copies of its
// Entry exit once between them; an admission that holds nothing claims no
// slot, and each copy of its Entry that exits counts a completion: exit an
// Entry once. When a later rule blocks a request, what
// earlier rules granted is given back. Related-resource rules read statistics
// and are as exact as a read can be.
//
// With n buckets of a window W, any span shorter than W - W/n admits at most
// the threshold; a span of W can admit up to twice it (see metric).
//
// # Span-exact rules
//
// A Reject rule with SpanExact holds its threshold T in every continuous
// span of its StatInterval W, at any concurrency, in O(n) memory and with
// no lock: it admits against the last n+1 buckets of length b = W/n (a
// window of its own, n+1 buckets over W + b) instead of the last n. Its n
// is the engine's WithSpanBuckets (default 10), apart from the sample
// count of the plain windows.
//
// Proof. A pass is counted in the bucket of its admission time (a caller
// whose clock reading is behind the newest bucket is counted, and
// stamped, at that bucket's start: Entry.Start), and no pass is ever
// counted in a bucket once a newer one exists (metric.Window.Admit checks
// the bucket is still the newest after its write, and backs out
// otherwise). A borrowed (waiting) pass is stamped at the start of the
// bucket it borrowed and counted against every window containing that
// bucket before it is granted. So when bucket i is the newest, buckets
// i-n .. i-1 hold their final counts, and Admit keeps the sum of buckets
// i-n .. i at or below T, whatever the interleaving. A span [s, s+W) of
// length W = n*b meets at most n+1 consecutive buckets (those from
// floor(s/b) to floor((s+W)/b), the last only when s is not a multiple
// of b), every stamp in it lies in those buckets, and their sum is at most
// T. So no span of W admits more than T.
//
// Cost. The steady rate is n/(n+1) of the threshold: under saturation a
// greedy caller fills the window in its first bucket, then nothing is
// admitted until that bucket leaves the n+1, T per n+1 buckets; traffic
// spread evenly is admitted whole up to n/(n+1) of T per W, as n+1
// buckets of it must fit in T (91% with the default 10 buckets, 95% with
// 20, 98% with 50, at about 0.4 KB per bucket per resource on two cores). A rule
// meant to pass T per W steadily and never more than T' in any span sets
// T' as its threshold and n with n/(n+1) T' >= T. The span window is made per resource and interval beside
// the resource's plain windows, so plain rules keep their own; on the
// short path (one span-exact rule and nothing else) Entry costs one more
// atomic add than a plain rule (the pass is also counted in the resource's
// statistics).
//
// The same idea carries over to Global rules: the Redis source's window
// script sums n+1 buckets of the server's clock instead of n for a
// span-exact rule, so every span of W on the server's clock counts at
// most T; instances spend what it grants within the server bucket it was
// counted in, as they do for plain rules, give or take the round trip
// (see the global package). A Global span-exact rule's local fallback
// window is span-exact too.
//
// # Per-key limits
//
// A rule with PerKey applies its threshold to each caller key separately:
// a limit per user, API key, client address (AddrKey groups IPv6 by /64)
// or tenant, named per request with WithKey. Reject, Throttle and
// Concurrency rules can be PerKey, as can Global rules (one Redis limit per
// key). Keys lists specific keys with their own thresholds (a premium
// tenant at ten times the rule's, a known abuser at 0); they are kept apart
// and never evicted. Requests without a key share one "no key" entry,
// limited as one caller at the rule's threshold and counted in the
// resource's Keyless statistic: never an error for lacking a key, but all
// keyless traffic shares that one threshold, so name every caller before
// adding a PerKey rule. A key is not a resource: its state is one cache
// line (a window of four buckets packed with their epochs, a pacing
// timeline, or an in-flight count), with no statistics of its own; the
// resource counts every request as before.
//
// Memory is bounded: a rule tracks at most MaxKeys keys (default 100,000,
// rounded up to a multiple of 4) in a set-associative table, about 154
// bytes per tracked key with everything in (the table's 16 bytes a key up
// front, the sketch, and the state; measured with the table half full),
// and an engine's rules together at most
// WithMaxKeys (default 1,000,000). A key new to a full table replaces, in
// its two sets of four, the state that loses least: first one whose
// window is over, whose timeline is past or with nothing in flight. When
// more keys are active at once than the table holds, an active key goes:
// its per-bucket counts go into a count sketch (two rows of cells, as
// many per row as MaxKeys rounded up to a power of two, each keeping the
// largest count per bucket of the keys written to it), and the key, seen
// again, starts from the smaller of its two cells, each count back in its
// own bucket. Evicting a key therefore gives it nothing more: a key evicted
// k times in a window still admits at most its threshold in it. What
// remains: a key that shares both its cells with another evicted active
// key starts with that key's counts too, until they leave the window
// (stricter, never looser; keys are hashed with a secret seed per table,
// so a caller cannot aim at another's cells). Each eviction of an active
// key is counted in KeyEvictions. A Concurrency key with requests in
// flight is never dropped: it moves to a side table until its last
// request exits or it is seen again.
//
// Keys are identified in a table by two 64-bit hashes with secret seeds
// (no key bytes are kept): two keys share a state only if both collide,
// odds of 2^-128 per pair, and then they would share one window, stricter
// for both.
//
// Strictness per key is the same as for resources: the check and the
// count are one compare-and-swap on the key's newest bucket, so no window
// of a key holds more than its threshold at any concurrency. A key's
// window has four buckets whatever WithSampleCount says: any span shorter
// than 3/4 of it admits at most the threshold, a whole window up to twice
// it. A wait does not borrow for PerKey rules. A PerKey Concurrency
// rule counts requests admitted after it is loaded. A reload that changes
// a PerKey rule's threshold, Keys or MaxKeys keeps its keys' counts.
//
// # Waiting: Wait, Reserve and WithWait
//
// A request may wait for room under its rate rules instead of being
// blocked: Engine.Wait(ctx, resource) waits as long as ctx allows (x/time/
// rate's Wait), WithWait(d) up to d (Sentinel's priority borrowing is
// WithWait of its occupy timeout), and Engine.Reserve takes the same
// admission without sleeping, returning a Reservation with its Delay, to
// Entry or Cancel (x/time/rate's Reserve). It is one mechanism
// for every rate rule:
//   - a Reject (or span-exact) rule admits the request now against the
//     earliest later bucket within the wait that keeps every window
//     containing it within the threshold (at most one window ahead); the
//     request waits for that bucket to start and counts as Pass and
//     OccupiedPass there;
//   - a GCRA rule takes its tokens ahead (its theoretical arrival time
//     moves up to the wait past the burst), and the request waits until
//     they are due, as x/time/rate's reservations do;
//   - a Throttle rule queues it up to the longer of MaxQueueing and the
//     wait.
//
// The request waits for the latest of these, honouring its context. None
// of them ever admits over a threshold: each wait is for an admission
// already counted where it will land, and with several rate rules on a
// resource every one counts the request at the one instant it goes (a
// window in the bucket holding that instant, borrowed if need be; a GCRA
// rule's tokens and a Throttle slot at that instant; a WarmUp window too;
// a PerKey window that cannot count it there blocks it), so that no rule
// counts it before or after it happens. The cancel rule is the same for
// every rule: a request that is not admitted in the end (its context
// ended during the wait, or a later rule blocked it) gives back what it
// took: borrowed bucket counts (out of the bucket, if it had started
// meanwhile), and GCRA tokens and Throttle slots unless another request
// has reserved after them (giving them back then would hand that
// request's slot out twice, so they stay spent: stricter, never looser,
// as x/time/rate's cancel restores only what later reservations did not
// take). WarmUp rules, PerKey windows and Global rules do not make a
// request wait.
//
// # Where things live
//
// engine.go, entry.go, reserve.go, options.go and errors.go are the API;
// check.go runs a request through a resource's rules, kind by kind;
// kinds.go lists the rule kinds, each in a file of its own (window.go,
// warmup.go, paced.go, gcra.go, concurrency.go, related.go, global.go,
// perkey.go, dryrun.go) with its validation, compilation and per-request
// steps. The algorithms that need no Engine are internal packages with
// tests of their own (internal/gcra, pace, warmup, keytable, slots); the windows
// flow counts in are internal/window's. docs/architecture.md walks one
// admitted and one refused request through the files.
package flow
