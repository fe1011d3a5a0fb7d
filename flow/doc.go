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
// Fast fail is strict: the check and the count are one atomic step, so no
// window ever holds more passes than its threshold, at any concurrency;
// several Reject and WarmUp rules on one window admit together at the
// smallest limit, so each pass is counted once. Concurrency rules admit by
// compare-and-swap on one exact counter, released by Exit; a Concurrency
// rule loaded while requests are in flight counts them first. An Entry
// that holds a concurrency count exits once whichever copy exits; any
// other Entry counts a completion for each copy that exits: exit an Entry
// once. When a later rule blocks a request, what earlier rules granted is
// given back (to the window, for any core's requests). A window's cores
// take its room in leases; a request that finds no room takes back what
// other cores' leases hold unused (once per spread of leases), so a window
// refuses within its threshold only for an instant of a race: it errs
// towards refusing, never past its threshold. With n buckets of a window W, any span shorter than W - W/n
// admits at most the threshold; a span of W can admit up to twice it (see
// metric). docs/guarantees.md has the details.
//
// # Span-exact rules
//
// A Reject rule with SpanExact holds its threshold T in every continuous
// span of its StatInterval W, at any concurrency, in O(n) memory and with
// no lock: it admits against the last n+1 buckets of length W/n instead of
// the last n (n is WithSpanBuckets, default 10). Its steady rate is
// n/(n+1) of T (91% with 10 buckets); a rule meant to pass T per W and
// never more than T' in any span sets T' as its threshold and n with
// n/(n+1) T' >= T. Global span-exact rules hold the same on the server's
// clock. The proof and the costs are in docs/guarantees.md.
//
// # Per-key limits
//
// A rule with PerKey applies its threshold to each caller key separately:
// a limit per user, API key, client address (AddrKey groups IPv6 by /64)
// or tenant, named per request with WithKey. Reject, Throttle and
// Concurrency rules can be PerKey, as can Global rules (one Redis limit per
// key). Keys lists specific keys with their own thresholds, never evicted.
// Requests without a key share one "no key" entry at the rule's threshold
// (counted in the resource's Keyless statistic): name every caller before
// adding a PerKey rule. A key's state is one cache line, with no
// statistics of its own; its check and count are one compare-and-swap, so
// no window of a key holds more than its threshold (while the rule
// remembers the keys it evicts; see below).
//
// Memory is bounded: a rule tracks at most MaxKeys keys (default 100,000),
// about 135 bytes a key, at most 234 with what it remembers of evicted
// keys after a flood, and an engine's rules together at most WithMaxKeys
// (default 1,000,000). A key evicted while active leaves its own counts
// behind, so eviction gives it nothing more (KeyEvictions counts them),
// and no key starts from another's: a flood of keys shuts out none. A
// rule remembers every key evicted while at most 4 x MaxKeys are per
// window; beyond, it forgets those that gain least by it (KeysForgotten
// counts them). docs/guarantees.md has the table, the ghosts and the
// hashing.
//
// A reload keeps what a rule counted while it stays the same rule: its
// Resource, ID (or both none), Metric and PerKey, and its kind of state (a
// window, a queue, a GCRA cell, a dry run, a Global rule's fallback).
// Windows, keys' counts and holds, warm-up and queues survive changes of
// Threshold, MaxKeys, Keys, Burst, MaxQueueing, and Behavior between
// Reject and WarmUp; a queue or GCRA debt is stretched to the new rate,
// and a window of a new StatInterval starts from what the old one counted
// over its span (erring strict). A change between Throttle and Reject, of
// Metric, DryRun or Global starts the rule afresh.
//
// # Waiting: Wait, Reserve and WithWait
//
// A request may wait for room under its rate rules instead of being
// blocked: Engine.Wait(ctx, resource) waits as long as ctx allows (x/time/
// rate's Wait), WithWait(d) up to d (Sentinel's priority borrowing is
// WithWait of its occupy timeout), and Engine.Reserve takes the same
// admission without sleeping, returning a Reservation with its Delay, to
// Entry or Cancel (x/time/rate's Reserve). A Reject rule admits it against
// the earliest later bucket that keeps every window within the threshold,
// a GCRA rule takes its tokens ahead, a Throttle rule queues it. Every
// rule counts the request at the one instant it goes, so none admits over
// its threshold; a request not admitted in the end gives back what it took,
// where no later request reserved after it. WarmUp rules, PerKey windows
// and Global rules do not make a request wait. docs/guarantees.md has the
// mechanism and the cancel rule.
//
// # System rules
//
// A system rule (Rule.System) protects a process from overload that no
// fixed threshold foresaw, as Sentinel's system rules and Kratos' BBR
// limiter do. It reads the statistics of the resource it names: give the
// process's inbound requests one resource (an adapter's catch-all, or an
// Entry on "inbound" around each handler) and put the system rules there,
// beside a Concurrency rule for a limit on requests in flight and a QPS
// rule for one on the total rate. SystemBBR sheds, while the CPU usage is
// hot, the requests past what the resource has shown it completes in
// flight; SystemCPU refuses everything while it is hot; SystemRT while the
// average RT is over MaxRT. The CPU usage comes from a CPUMeter given with
// WithCPU (package cpuusage reads a container's cgroup v2, or /proc/stat):
// the meter samples in the background and its owner starts and closes it;
// the engine starts nothing. Engine.Systems reads what the rules saw.
//
// # Where things live
//
// engine.go, entry.go, reserve.go, options.go and errors.go are the API;
// check.go runs a request through a resource's rules, kind by kind;
// kinds.go lists the rule kinds, each in a file of its own (window.go,
// warmup.go, paced.go, gcra.go, concurrency.go, related.go, global.go,
// perkey.go, dryrun.go, breaker.go, system.go) with its validation,
// compilation and per-request steps. The algorithms that need no Engine
// are internal packages with tests of their own (internal/gcra, pace,
// warmup, keytable, slots, breaker); the windows flow counts in are
// internal/window's. docs/architecture.md walks one
// admitted and one refused request through the files.
package flow
