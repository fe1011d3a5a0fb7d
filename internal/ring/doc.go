// Package ring is the engine's ring of time buckets: the LeapArray that
// package leaparray offers users, with the protocols only the engine uses
// (see leaparray's package doc for the ring itself).
//
//   - Occupiable adds future buckets that a waiting admission borrows from:
//     a borrow is folded into its bucket when the bucket is made, or lapses
//     if no bucket is made within an interval of it.
//   - Head, Newest, Locked and RetireStale are the rotation protocols that
//     internal/window's hand-over and stat's completed seconds rely on.
//
// Time comes in as an argument: the package never reads a clock.
package ring
