package gcra

import (
	"testing"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// TestLanesKeepTheBoundOnAClockPast2To62: real goroutines, no replay: two goroutines per
// lane, a shared clock starting at 1<<62, a third of admissions given back.
func TestLanesKeepTheBoundOnAClockPast2To62(t *testing.T) {
	burst := int64(8*cpu.Stripes()) * 200
	var c Cell
	l := New(&c, 1e9, burst)
	var clock atomic.Int64
	clock.Store(1 << 62)
	hammerLanes(t, &l, 8, func(g int) []taken {
		var mine []taken
		for i := range 20000 {
			now := clock.Add(int64(i % 3))
			n := int64(1 + (i*7+g)%4)
			if _, tok, ok, _, _ := l.TakeOn(g%2, now, n, 0); ok {
				if i%3 == 0 && l.GiveOn(g%2, n, tok) {
					continue
				}
				mine = append(mine, taken{now, n})
			}
		}
		return mine
	})
}
