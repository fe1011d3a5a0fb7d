// Package stat keeps per-resource statistics for flow: a Node per resource
// with a second-level window, a minute of 1 s buckets and an in-flight gauge,
// a Registry of nodes with a cap, and the Clock that every operation reads
// once and passes down to metric.
//
// # Clocks
//
// Clock.Now returns nanoseconds from an origin of the clock's choosing.
// NewMonotonic reads Go's monotonic clock (time.Since), immune to wall-clock
// steps; measured on the 2-core dev machine it costs 20-40 ns a call, a
// third of an Entry. NewCoarse serves a cached value that a background
// goroutine refreshes every tick and its readers refresh too (one read in
// 16, at random), for the price of an atomic load and a random draw, at the
// cost of that resolution in RTs and bucket edges; the readers' share keeps
// it up when a saturated CPU starves the ticker (see Coarse for the bound).
// Engines default to DefaultClock, one 1 ms Coarse clock per process. The
// stattest package has a manual clock for tests.
//
// # Windows and precision
//
// A Node's second window defaults to 4 buckets of 250 ms. With n buckets
// over W, any span shorter than W - W/n admits at most a rule's threshold
// and a span of W at most twice it (see metric). More buckets tighten the
// short-span guarantee (n = 10: 900 ms) but cost memory per resource (each
// bucket is a few cache lines per P) and an allocation per bucket rotation;
// 4 keeps every span under 750 ms exact at a quarter of Sentinel-golang's
// memory for 10. Set NodeConfig.SampleCount to choose.
//
// # Minute statistics
//
// The minute window is written only when a bucket leaves the second window:
// the second window hands its final counts over as it retires them, and
// minute reads add the buckets not yet handed over. Requests therefore pay
// for one window, not two. The hand-over is exact (metric seals a retiring
// bucket), so minute totals count every request once, however writes race
// the rotation.
package stat
