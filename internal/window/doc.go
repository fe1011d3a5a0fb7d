// Package window is the engine's sliding window of event counts: the
// implementation behind package metric's Window, with the protocols only
// flow and stat use.
//
//   - Stripe hints (AddOn, AdmitOn, CompleteOn): the caller's P index,
//     pinned once per request, chooses the stripe.
//   - Borrowing (Borrow, BorrowAt, AdmitAt, Unborrow, Land, Arrived, Lend,
//     Borrows): admissions against future buckets for requests that wait,
//     on internal/ring's Occupiable.
//   - Settling (Settle, Locked, Clamp): handing buckets over by time for
//     readers of completed seconds.
//   - Reservation.Cancel: giving an admission back when a later rule
//     refuses the request.
//
// See package metric's doc for how a window counts (stripes, a bucket's
// life, admission by leases, precision); it describes this code.
package window
