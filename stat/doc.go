// Package stat holds what an engine's statistics are made of and read as:
// the Clock every operation reads once, a resource's Snapshot (the sliding
// last second, the previous whole second, the last minute, the in-flight
// gauge) and the Second a Feed delivers for each resource and second. The
// per-resource nodes and their registry are flow's own.
//
// # Clocks
//
// Clock.Now returns nanoseconds from an origin of the clock's choosing.
// NewMonotonic reads Go's monotonic clock (time.Since), immune to wall-clock
// steps; measured on the 2-core dev machine it costs 20-40 ns a call, a
// third of an Entry. DefaultClock, what engines use when given none, serves
// a cached value that a background goroutine refreshes every millisecond
// and its readers refresh too (one read in 16, at random), for the price of
// an atomic load and a random draw, at the cost of a millisecond in RTs and
// bucket edges; the readers' share keeps it up when a saturated CPU starves
// the ticker. The stattest package has a manual clock for tests.
//
// # Windows and precision
//
// A resource's second window defaults to 4 buckets of 250 ms
// (flow.WithSampleCount). With n buckets over W, any span shorter than
// W - W/n admits at most a rule's threshold and a span of W at most twice
// it (see metric). More buckets tighten the short-span guarantee (n = 10:
// 900 ms) but cost memory per resource and an allocation per bucket
// rotation; 4 keeps every span under 750 ms exact at a quarter of
// Sentinel-golang's memory for 10.
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
