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
// by Exit; a Concurrency rule loaded while requests are in flight counts them
// first. Every admission holds a slot that Exit releases once, so copies of
// an Entry exit once between them. When a later rule blocks a request, what
// earlier rules granted is given back. Related-resource rules read statistics
// and are as exact as a read can be.
//
// With n buckets of a window W, any span shorter than W - W/n admits at most
// the threshold; a span of W can admit up to twice it (see metric).
//
// # Priority
//
// A priority request that a Reject rule blocks may be admitted against the
// next window that has room, within the engine's occupy timeout; it waits
// for that window, and counts as Pass and OccupiedPass there. Borrowing
// never lets any window exceed its threshold. A borrow is not given back if
// the wait is cancelled or a later rule blocks: it errs towards blocking.
package flow
