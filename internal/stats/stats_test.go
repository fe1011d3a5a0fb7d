package stats

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/leapflow/leapflow/internal/clocks"
	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/pins"
	"github.com/leapflow/leapflow/stat"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat/stattest"
)

func TestNodeConfigErrors(t *testing.T) {
	_, err := NewNode("x", NodeConfig{SampleCount: 7})
	assert.ErrorContains(t, err, "SampleCount must divide 1s into whole nanoseconds, got 7")
	_, err = NewRegistry(-1, NodeConfig{}, nil)
	assert.ErrorContains(t, err, "max resources must be >= 0, got -1")
}

// TestNodeStepByStep drives a node second by second with synthetic time and
// checks each read against counts kept by the test.
func TestNodeStepByStep(t *testing.T) {
	n, err := NewNode("api", NodeConfig{})
	require.NoError(t, err)
	sec := int64(time.Second)
	ms := int64(time.Millisecond)
	w := n.Second()
	// stat.Second k gets k+1 passes spread over its buckets, one block, and one
	// success of RT (k+1) ms.
	for k := range int64(70) {
		for i := range k + 1 {
			w.Add(k*sec+i*sec/(k+1), metric.Pass, 1)
		}
		w.Add(k*sec+900*ms, metric.Block, 1)
		w.Complete(k*sec+950*ms, 1, (k+1)*ms, k%10 == 0)
		now := k*sec + 999*ms
		assert.InDelta(t, float64(k+1), n.Rate(now, metric.Pass), 1e-9, "second %d", k)
		assert.Equal(t, time.Duration(k+1)*time.Millisecond, n.AvgRT(now), "second %d", k)
		assert.Equal(t, time.Duration(k+1)*time.Millisecond, n.MinRT(now), "second %d", k)
		if k > 0 {
			assert.Equal(t, k, n.PreviousSecond(now, metric.Pass), "second %d", k)
			assert.Equal(t, int64(1), n.PreviousSecond(now, metric.Block), "second %d", k)
		}
		var wantMinute int64
		for j := max(0, k-59); j <= k; j++ {
			wantMinute += j + 1
		}
		assert.Equal(t, wantMinute, n.Minute(now, metric.Pass), "second %d: minute pass", k)
		assert.Equal(t, min(k+1, 60), n.Minute(now, metric.Success), "second %d: minute success", k)
	}
	s := n.Snapshot(69*sec + 999*ms)
	assert.Equal(t, "api", s.Resource)
	assert.InDelta(t, 70.0, s.PassQPS, 1e-9)
	assert.InDelta(t, 1.0, s.BlockQPS, 1e-9)
	assert.InDelta(t, 1.0, s.SuccessQPS, 1e-9)
	assert.Equal(t, int64(69), s.PrevPass)
	assert.Equal(t, int64(6), s.MinuteErrors, "seconds 10, 20, ..., 60")
	// After a quiet minute everything reads zero, and nothing is revived.
	late := 200 * sec
	assert.Zero(t, n.Minute(late, metric.Pass))
	assert.Zero(t, n.Rate(late, metric.Pass))
	assert.Zero(t, n.AvgRT(late))
}

// TestMinuteIsExactUnderConcurrency hammers a node while time moves and
// compares the minute total with the number of adds.
func TestMinuteIsExactUnderConcurrency(t *testing.T) {
	n, err := NewNode("hot", NodeConfig{SampleCount: 2})
	require.NoError(t, err)
	clock := stattest.NewClock(0)
	const g, m = 8, 3000
	var wg sync.WaitGroup
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range m {
				n.Second().Add(int64(clock.Advance(100*time.Microsecond)), metric.Success, 1)
			}
		}()
	}
	wg.Wait()
	// 2.4 s of time passed: all of it is inside the minute.
	got := n.Minute(clock.Now(), metric.Success)
	// Nothing is lost and nothing counted twice: a write that raced the
	// retirement of its bucket is either in the hand-over or redone.
	assert.Equal(t, int64(g*m), got)
}

// TestInflightExactUnderRotation admits and completes requests on a window
// of one bucket, so every rotation retires the bucket writers are using,
// with some admissions cancelled: in-flight must end at exactly the requests
// left open, and the minute must hold every pass once.
func TestInflightExactUnderRotation(t *testing.T) {
	n, err := NewNode("hot", NodeConfig{SampleCount: 1})
	require.NoError(t, err)
	clock := stattest.NewClock(0)
	const g, m = 8, 3000
	var open, passed, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := n.Second()
			for k := range m {
				now := int64(clock.Advance(50 * time.Microsecond))
				r, ok := w.Admit(now, 1, math.MaxInt32)
				if !ok {
					refused.Add(1) // checked on the test goroutine
					return
				}
				switch (i + k) % 4 {
				case 0:
					r.Cancel()
				case 1:
					open.Add(1) // admitted, never completed
					passed.Add(1)
				default:
					passed.Add(1)
					w.Complete(int64(clock.Advance(50*time.Microsecond)), 1, 1, false)
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, refused.Load(), "admissions refused far below the threshold")
	assert.Equal(t, open.Load(), n.Inflight())
	assert.Equal(t, passed.Load(), n.Minute(clock.Now(), metric.Pass))
}

func TestRegistryCapAndSharing(t *testing.T) {
	r, err := NewRegistry(50, NodeConfig{}, nil)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := map[string]*Node{}
	refused := 0
	// Found by the goroutines, checked on the test goroutine once they end.
	var wrongErrs []error
	var twins []string
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for range 200 {
				name := fmt.Sprintf("r%d", rng.IntN(100))
				n, err := r.Node(name)
				mu.Lock()
				switch prev, seen := got[name]; {
				case err != nil && errors.Is(err, stat.ErrTooManyResources):
					refused++
				case err != nil:
					wrongErrs = append(wrongErrs, err)
				case seen && prev != n:
					twins = append(twins, name)
				default:
					got[name] = n
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Empty(t, wrongErrs, "only stat.ErrTooManyResources refuses")
	require.Empty(t, twins, "one node per resource")
	assert.Equal(t, 50, r.Len())
	assert.Len(t, got, 50)
	assert.Positive(t, refused)
	_, err = r.Node("one-more")
	assert.EqualError(t, err, "stat: too many resources (cap 50)")
	assert.Nil(t, r.Lookup("one-more"))
	count := 0
	r.Range(func(*Node) bool { count++; return true })
	assert.Equal(t, 50, count)
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = r.Node("one-more") }), "refusals allocate nothing")
}

func TestNodeWindowsPersist(t *testing.T) {
	n, err := NewNode("x", NodeConfig{})
	require.NoError(t, err)
	w1, err := n.Window(2*time.Second, 4)
	require.NoError(t, err)
	w2, err := n.Window(2*time.Second, 4)
	require.NoError(t, err)
	assert.Same(t, w1, w2)
	_, err = n.Window(time.Microsecond, 3)
	assert.Error(t, err)
}

func TestInflightSpansRotations(t *testing.T) {
	n, err := NewNode("x", NodeConfig{})
	require.NoError(t, err)
	sec := int64(time.Second)
	w := n.Second()
	w.Add(0, metric.Pass, 5)
	assert.Equal(t, int64(5), n.Inflight())
	w.Complete(3*sec, 2, 10, false)
	assert.Equal(t, int64(3), n.Inflight(), "the passes' bucket was retired and handed over")
	w.Add(3*sec, metric.Pass, 1)
	w.Complete(10*sec, 4, 10, true)
	assert.Zero(t, n.Inflight())
	assert.Zero(t, n.Snapshot(10*sec).Inflight)
}

// The registry's protocol with flow is registered when stat starts, under
// the type flow asserts: pinned nodes stay, unpinned idle ones go, and a
// dropped node is replaced by the live one.
func TestRegistryProtocolIsRegisteredForFlow(t *testing.T) {
	p, ok := pins.Stat.(pins.Protocol[*Registry, *Node, *clocks.Coarse])
	require.True(t, ok, "pins.Stat is %T", pins.Stat)
	r, err := NewRegistry(2, NodeConfig{}, stattest.NewClock(0))
	require.NoError(t, err)
	nodes, err := p.Pin(r, []string{"a", "b"})
	require.NoError(t, err)
	require.Len(t, nodes, 2)
	_, err = p.Pin(r, []string{"c"})
	assert.ErrorIs(t, err, stat.ErrTooManyResources, "pinned nodes make no room")
	assert.Same(t, nodes[0], p.Replace(r, nodes[0]), "a live node stands for itself")
	p.Unpin(r, []string{"a", "b"})
	assert.Same(t, nodes[1], r.Lookup("b"), "unpinned, kept until it idles")
}

// TestAllowedStripesArePadded: each stripe of Allow's total is alone on
// its cache line.
func TestAllowedStripesArePadded(t *testing.T) {
	assert.Equal(t, uintptr(cpu.CacheLine), unsafe.Sizeof(paddedCount{}))
}
