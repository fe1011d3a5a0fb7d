// Package metric counts request events in sliding windows of time buckets.
//
// A Window is the engine's own (internal/window, on internal/ring: the
// ring leaparray offers), seen through the methods a standalone user
// needs; flow and stat reach the rest (borrowing future buckets for
// requests that wait, settling, stripe hints) there. Each
// bucket holds one counter per Event, the minimum RT and the maximum
// concurrency seen in its span. Like leaparray, it never reads a clock: every
// method takes now in nanoseconds from the caller's origin, and the layers
// above (stat, flow) read the clock once per operation and pass it down.
//
// # Hot counters
//
// Every count a request writes lives in the bucket's stripe of the caller's
// P: one cache line per stripe holding block, success, exception, RT and the
// passes admitted there, so on many cores requests stop fighting over one
// line. Reads add the stripes up; a read that runs alongside writers may
// miss the latest adds, never invent any.
//
// # A bucket's life
//
// Only the newest bucket is written: earlier times are clamped to it. When
// a newer bucket is made, the old one freezes: its stripes are sealed and
// summed into one word per event, so reads of every bucket but the newest
// cost one cache line, not one per stripe. When it leaves the ring it is
// sealed again and its final counts can be handed on (flow's statistics
// feed their minute window with them). A writer that loaded a bucket just before either step
// learns from the value its own atomic add returns whether the add landed
// before the seal (counted there) or after (made again on the newest
// bucket); a pass taken back after a seal is taken back from the frozen
// count, or corrected where it was handed on. No count is lost and none is
// counted twice.
//
// # Admission
//
// Admit (and Reserve) is an atomic check-and-count of Pass: the window's
// passes, plus everything borrowed from future buckets, never exceed the
// threshold, at any concurrency. The window's budget is handed to stripes in
// leases taken from the bucket's one shared word by compare-and-swap; a
// stripe then admits on its own line while its lease lasts. Leases shrink
// with the room left, down to the request itself near the threshold, and
// die with their bucket; tokens a stripe leased and has not used go back to
// the bucket when a request on another stripe finds no room (one sweep per
// spread of leases). A refused admission writes nothing shared but that
// sweep. The engine's windows also admit against future
// buckets (flow's waiting requests) under the same bound.
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
