// Package leaparray is the bottom layer of leapflow: a lock-free ring of time
// buckets (a "leap array", after Sentinel's LeapArray).
//
// A LeapArray splits an interval into n equal buckets and keeps one
// WindowWrap per slot of a ring. The bucket for a time now lives in slot
// (now/len) % n and starts at now - now%len. The package never reads a clock:
// every method takes now, an int64 count of nanoseconds from an origin of the
// caller's choosing (flow and stat use a monotonic clock), so tests drive it
// with plain numbers.
//
// # Rotation
//
// An empty slot is filled under the array's lock; a slot holding an older
// bucket is replaced, under the same lock and after re-checking the slot, by a
// freshly allocated bucket. Buckets are never reset in place: a writer that
// loaded a bucket just before it was replaced can only touch the retired
// bucket, never the new one, so counts cannot leak across windows and a
// rotation cannot erase counts that belong to the new window. The cost is one
// allocation per bucket length per slot that sees traffic (a few per second),
// never one per operation. Callers that must not lose a count racing a
// rotation check that their bucket is still the newest after their write
// (internal/ring's Newest) and redo it; metric also seals the counters of a retiring bucket, so that a count handed over
// to a longer window is never made twice.
//
// # Time going backwards
//
// The array remembers the start of the newest bucket it has ever made. A time
// behind it (a stale goroutine, or a clock stepped back) is clamped to it:
// writes land in the newest bucket and reads see the window that ends there.
// Nothing is dropped and the gate never reopens; after a step back of D the
// window simply holds still for D. With the monotonic clock that flow uses by
// default, only goroutines that read the clock a moment before a rotation are
// ever clamped.
//
// # Reads
//
// A bucket is valid at now iff start <= now and now-start < interval
// (half-open); Within and Previous visit only valid buckets, allocate
// nothing, and never create or revive one.
//
// # Where the rest lives
//
// The ring itself is internal/ring, which leapflow's engine uses directly;
// this package is its standalone surface. What only the engine uses stays
// there: the ring of future buckets that admissions borrow from (Occupiable,
// folded into a bucket when it is made), and the rotation protocols that
// metric's hand-over and stat's completed seconds rely on (Head, Newest,
// Locked, RetireStale).
package leaparray
