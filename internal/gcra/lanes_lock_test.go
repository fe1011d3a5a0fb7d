package gcra

import "testing"

// TestALockedLaneRefusesAClockPastTheLock: with the clock past 1<<62 (the lanes' locked
// mark is MaxInt64/2), a request takes from a lane another request has
// locked in relane; that one then gives the run (with the slots just
// taken) back to the cell. Replayed: relane's lock, X's whole TakeOn, the
// rest of relane.
func TestALockedLaneRefusesAClockPastTheLock(t *testing.T) {
	var c Cell
	burst := laneBurst()
	l := New(&c, 1e6, burst)
	requireLanes(t, &l)
	now, p := int64(1<<62)+1e9, 0
	var admitted int64
	if _, _, ok, _, _ := l.TakeOn(p, now, 1, 0); !ok { // leases a run
		t.Fatal("setup")
	}
	admitted++
	ln := &c.lanes.Load().l[p]
	// R runs relane: its first step locks the lane.
	at := ln.next.Load()
	if !ln.next.CompareAndSwap(at, locked) {
		t.Fatal("lock")
	}
	// X: a whole TakeOn on the locked lane.
	if _, tok, ok, _, _ := l.TakeOn(p, now, 2, 0); ok {
		admitted += 2
		t.Logf("X took from the locked lane: tok %d (lane next was the lock %d < now %d)", tok, locked, now)
	}
	// R's relane goes on: gives the run back to the cell.
	if l.c.giveBack(ln, at) {
		ln.next.Store(max(at, ln.end.Load()))
	}
	for {
		if _, _, ok, _, _ := l.Take(now, 1, 0); !ok {
			break
		}
		admitted++
	}
	if admitted > burst {
		t.Fatalf("admitted %d tokens at one instant, burst %d", admitted, burst)
	}
}
