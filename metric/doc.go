// Package metric counts request events in sliding windows of time buckets.
//
// It sits on leaparray: a Window is a leaparray.Occupiable of Buckets, each
// bucket holding one counter per Event, the minimum RT and the maximum
// concurrency seen in its span. Like leaparray, it never reads a clock: every
// method takes now in nanoseconds from the caller's origin, and the layers
// above (stat, flow) read the clock once per operation and pass it down.
//
// # Hot counters
//
// Pass is one word per bucket, padded to its own cache line, because
// admission (Reserve) needs one exact, shared count. Block, Success,
// Exception and RT are only ever summed, so each bucket spreads them over
// stripes, one cache line per stripe, picked by the running P: on many cores
// adds stop fighting over one line. Reads sum the stripes; a read that runs
// alongside writers may miss the latest adds, never invent any.
//
// # Admission
//
// Reserve is an atomic check-and-add of Pass on the current bucket: the
// window's Pass, plus everything borrowed from future buckets, never exceeds
// the threshold, at any concurrency. Borrow admits against a future bucket
// (priority requests in flow) under the same bound.
//
// # Precision
//
// With n buckets over a window W, Reserve bounds the passes in every window
// of the array, so any span shorter than W - W/n holds at most the threshold
// (such a span always fits inside one window of the array). A span of length
// W can see up to twice the threshold: the last bucket of one window and the
// first of the next. n = 1 is the fixed window, with its full double burst at
// the boundary.
package metric
