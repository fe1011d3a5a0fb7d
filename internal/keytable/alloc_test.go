package keytable

import (
	"strconv"
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
			st := win.Get(string(key))
			if b, _, ok, _ := win.Admit(st, now, 1, 1<<30); ok {
				st.Undo(b, 1)
			}
		},
		"refuse": func() {
			st := win.Get(string(key))
			if _, _, ok, _ := win.Admit(st, now, 2, 1); !ok {
				win.RoomIn(st, now, 2, 1)
			}
		},
		"pace": func() { pace.Get(string(key)).Timeline().Add(1) },
		"conc": func() {
			st := conc.Get(string(key))
			if _, ok, _ := st.Acquire(1, 8); ok {
				conc.Release(st, 1)
			}
		},
	} {
		fn()
		assert.Zero(t, testing.AllocsPerRun(1000, fn), name)
	}
}

// A new key through a full table, evicting another on every request,
// allocates only its state (one object): the sets' and the memory's
// locks are values, not closures.
func TestANewKeyThroughAFullTableAllocatesOnlyItsState(t *testing.T) {
	var now int64
	win := newWindowTable(1024, &now)
	keys := make([]string, 64*1024)
	for i := range keys {
		keys[i] = "user-" + strconv.Itoa(1_000_000+i)
	}
	for _, k := range keys[:4096] { // full, and evicting
		win.Get(k)
	}
	i := 4096
	allocs := testing.AllocsPerRun(2000, func() {
		win.Get(keys[i%len(keys)])
		i++
	})
	assert.LessOrEqual(t, allocs, 1.0)
}
