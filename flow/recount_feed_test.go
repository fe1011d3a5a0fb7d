package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat"
)

// hookClock is a manual clock that runs hook once, inside the read
// it is armed for, and returns the reading taken before the hook: a
// request that read the clock and was descheduled while others ran.
type hookClock struct {
	t     atomic.Int64
	armed atomic.Bool
	hook  func()
}

func (c *hookClock) Now() int64 {
	v := c.t.Load()
	if c.armed.CompareAndSwap(true, false) {
		c.hook()
	}
	return v
}

// A request reads the clock just before a second boundary; meanwhile the
// registry lets its idle resource go (a new resource needed the room).
// Its pass lands on the dropped node, so flow counts it again on the node
// Replace makes, at the request's time. That node was made after the
// boundary and keeps only the seconds from its creation on: the pass, in
// the second before, is dropped from the feed (its Exit is delivered).
func TestFeedHostileRecountOnReplacedNodeLost(t *testing.T) {
	clock := &hookClock{}
	clock.t.Store(int64(10 * time.Second))
	e, err := New(WithClock(clock), WithMaxResources(1))
	require.NoError(t, err)
	f := e.Feed()
	var pass, success int64
	f.Subscribe(func(b []stat.Second) {
		for _, s := range b {
			if s.Resource == "victim" {
				pass += s.Pass
				success += s.Success
			}
		}
	})
	clock.t.Store(int64(11 * time.Second))
	require.True(t, try(e, "victim"))
	for s := 12; s <= 75; s++ {
		clock.t.Store(int64(time.Duration(s) * time.Second))
		f.Poll()
	}
	clock.t.Store(int64(75*time.Second + 900*time.Millisecond))
	clock.hook = func() {
		clock.t.Store(int64(76*time.Second + 100*time.Millisecond))
		require.True(t, try(e, "other"), "the registry lets victim go")
	}
	clock.armed.Store(true)
	before := e.registry.Lookup("victim")
	en, err := e.Entry("victim") // reads 75.9 s
	require.NoError(t, err)
	require.NotSame(t, before, e.registry.Lookup("victim"), "recounted on a new node")
	en.Exit(nil)
	for s := 77; s <= 80; s++ {
		clock.t.Store(int64(time.Duration(s) * time.Second))
		f.Poll()
	}
	f.Close()
	assert.Equal(t, int64(2), success)
	assert.Equal(t, int64(2), pass, "every pass is delivered once")
}
