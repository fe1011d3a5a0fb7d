package keytable

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestTrackedKeyPathsAllocateNothing: a request on a key the table
// tracks allocates nothing, whatever it does.
func TestTrackedKeyPathsAllocateNothing(t *testing.T) {
	var now int64
	win := newWindowTable(64, &now)
	pace := New(Config{Kind: Pace, MaxKeys: 64, Now: func() int64 { return now }})
	conc := newConcTable(64)
	key := []byte("user-0000000001")
	for name, fn := range map[string]func(){
		"admit": func() {
			now += 10
			st, stL := win.Get(string(key))
			if b, _, ok, _ := win.Admit(st, stL, now, 1, 1<<30); ok {
				st.Undo(b, stL, 1)
			}
		},
		"refuse": func() {
			st, stL := win.Get(string(key))
			if _, _, ok, _ := win.Admit(st, stL, now, 2, 1); !ok {
				win.RoomIn(st, now, 2, 1)
			}
		},
		"pace": func() { stateOf(pace, string(key)).Timeline().Add(1) },
		"conc": func() {
			st, stL := conc.Get(string(key))
			if _, ok, _ := conc.Acquire(st, stL, 1, 8); ok {
				conc.Release(st, 1)
			}
		},
	} {
		fn()
		assert.Zero(t, testing.AllocsPerRun(1000, fn), name)
	}
}
