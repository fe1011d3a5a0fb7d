// Package baseline holds the seeds' own rate-limiting algorithms, written
// plainly, as honest baselines for the bench: the fixed-window counter and
// the linked-list sliding log (from the Sentinel article), and the mutex
// ring-buffer sliding-window counter with a rolling total (from the
// sliding-window article's pseudo-code). Each takes its time from a func so
// the bench can drive it with real or synthetic time, in nanoseconds.
package baseline
