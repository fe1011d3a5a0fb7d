// Package keytable is the state of flow's PerKey rules: a bounded table of
// compact per-key states (a window of Buckets buckets, a pacing timeline,
// or a count in flight), and ghosts that remember what evicted keys had.
// flow keeps the rules (thresholds, listed keys, errors) and calls Get,
// Admit, Undo, Acquire and Release on a request's key; nothing here knows
// the Engine, and the tests drive it with plain numbers.
//
// A key is not a resource: its state is one cache line, with no stripes
// and no statistics of its own; the resource's node counts every request.
//
// When a key new to the table finds both its sets full, it replaces the
// state that loses least, and none of them lets a key exceed its threshold
// in any window:
//   - A key whose window is over (Window), whose timeline is past (Pace)
//     or with nothing in flight (Conc) goes first: nothing is lost.
//   - Else the key least recently counted in is evicted while active (more
//     keys active at once than the table holds). Its count in its last
//     window, bucket by bucket (or its timeline), is kept as its ghost, by
//     its hash alone (see ghosts): the key, seen again, takes its ghost
//     back and starts from its own counts, each in its own bucket, so
//     evicting a key k times in a window gives it nothing more; a key never
//     seen starts from nothing, whatever other keys left behind. The
//     ghosts hold 5.5 per key the table tracks: every key evicted while at
//     most 4 x MaxKeys are per window. Beyond, the ghost whose key gains
//     least (the smallest count) is forgotten and counted (see
//     Table.CountForgotten). Each eviction of an active key calls the
//     table's eviction counter (see Table.CountEvictions).
//   - A Conc key with requests in flight is never dropped: evicted, it
//     moves to a side table until its last request exits or it is seen
//     again.
//
// The state an eviction frees is the new key's: evicting allocates
// nothing. Each use of a state is a life (see Life): a lookup returns the
// life it found the state in, and a request that found a key's state just
// before it was evicted (or reused) counts nothing in it after: it sees
// its life gone, takes back what it counted in that life, and looks the
// key up again. Window words carry 8 bits of the life, so that a late
// write of one life reads as empty in the next.
package keytable
