package gcra

import (
	"testing"

	"github.com/leapflow/leapflow/internal/cpu"
)

// TestASwapAfterTheRunChangedTakesOnlyTheLanesSlots replays one
// interleaving: request X runs TakeOn's lane path up to its swap (next
// and end read), then on the same P a request gives the run back, one on a
// clock behind leases a new run, and gives its token back, so that next
// is what X read again; then X swaps. Whatever X takes must be the lane's
// own (a run never ends before the lane's last), so one instant never
// admits more than the burst.
func TestASwapAfterTheRunChangedTakesOnlyTheLanesSlots(t *testing.T) {
	var c Cell
	burst := int64(8*cpu.Stripes()) * 200 // lanes lease 200-token runs
	l := New(&c, 1e9, burst)              // 1 ns a token
	requireLanes(t, &l)
	T, p := l.tolerance, 0
	now := int64(1_000_000)
	var admitted int64 // tokens admitted at instant now (net of gives)

	// The bucket nearly empty (50 tokens left), then a lane run on P p.
	if _, _, ok, _, _ := l.Take(now, burst-50, 0); !ok {
		t.Fatal("setup")
	}
	admitted += burst - 50
	if _, _, ok, _, _ := l.TakeOn(p, now, 1, 0); !ok {
		t.Fatal("setup lease")
	}
	admitted++
	ln := &c.lanes.Load().l[p]
	t.Logf("lane run (%d, %d], tat %d", ln.next.Load()-now, ln.end.Load()-now, c.tat.Load()-now)

	// X: TakeOn(p, now, 40, 0), fast path, up to its swap (code of TakeOn).
	nX := int64(40)
	costX := nX * l.interval
	atX := ln.next.Load()
	nextX := max(atX, now) + costX
	endX := ln.end.Load()
	if !(nextX <= endX && nextX-now <= T) {
		t.Fatal("X would not take the fast path")
	}

	// Y (same P, same now, 60 tokens): gives the run back, is refused.
	if _, _, ok, _, _ := l.TakeOn(p, now, 60, 0); ok {
		t.Fatal("Y admitted")
	}
	// Z (same P, clock read 20 ns earlier): leases a shorter run, then is
	// given back (a later rule refused it).
	_, tokZ, okZ, _, _ := l.TakeOn(p, now-20, 1, 0)
	if !okZ || !l.GiveOn(p, 1, tokZ) {
		t.Fatal("Z")
	}
	t.Logf("after Y, Z: lane run (%d, %d], tat %d", ln.next.Load()-now, ln.end.Load()-now, c.tat.Load()-now)

	// X's swap.
	if ln.next.CompareAndSwap(atX, nextX) {
		admitted += nX
		t.Logf("X admitted %d tokens, its slots end at %d, past the lane's end %d", nX, nextX-now, ln.end.Load()-now)
	}
	// W (another P, same now): takes what the cell still has.
	for {
		if _, _, ok, _, _ := l.TakeOn(1, now, 1, 0); !ok {
			break
		}
		admitted++
	}
	if admitted > burst {
		t.Fatalf("admitted %d tokens at one instant, burst %d", admitted, burst)
	}
}
