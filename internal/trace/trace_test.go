package trace

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTraces(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	even := Even(100, time.Second, 4)
	require.Len(t, even, 100)
	assert.Equal(t, 10*time.Millisecond, even[1].At-even[0].At)
	assert.Equal(t, 3, even[3].Instance)

	p := Poisson(rng, 10_000, time.Second, 4)
	assert.InDelta(t, 10_000, len(p), 500, "about rate x duration")
	for i := 1; i < len(p); i++ {
		require.GreaterOrEqual(t, p[i].At, p[i-1].At)
	}
	hot := OneHot(rng, 10_000, time.Second, 4, 0.9)
	on0 := 0
	for _, a := range hot {
		if a.Instance == 0 {
			on0++
		}
	}
	assert.InDelta(t, 0.9, float64(on0)/float64(len(hot)), 0.02)

	b := Bursty(rng, 10_000, 100*time.Millisecond, 500*time.Millisecond, 2*time.Second, 2)
	assert.InDelta(t, 4*1000, len(b), 400, "four bursts of 100 ms at 10,000/s")
	for i := 1; i < len(b); i++ {
		require.GreaterOrEqual(t, b[i].At, b[i-1].At)
	}
}

// TestOracle checks the oracle against a brute-force count of the buckets
// in the window of each request.
func TestOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	base := time.Unix(1_700_000_000, 0)
	var outs []Outcome
	at := base
	for range 5000 {
		at = at.Add(time.Duration(rng.Int64N(int64(2 * time.Millisecond))))
		outs = append(outs, Outcome{At: at})
	}
	const threshold, buckets = 50, 4
	window := 200 * time.Millisecond
	blen := int64(window) / buckets
	var admittedAt []int64 // bucket of each admission
	for _, o := range outs {
		b := o.At.UnixNano() / blen
		n := 0
		for _, a := range admittedAt {
			if a > b-buckets && a <= b {
				n++
			}
		}
		if n < threshold {
			admittedAt = append(admittedAt, b)
		}
	}
	assert.Equal(t, int64(len(admittedAt)), Oracle(outs, threshold, window, buckets))
	assert.Equal(t, 1.0, Ratio(0, 0))
	assert.Equal(t, 0.5, Ratio(1, 2))
}

func TestReplay(t *testing.T) {
	tr := Even(1000, 50*time.Millisecond, 3)
	seen := make([]int, 3)
	outs := Replay(tr, 3, func(i int) bool { seen[i]++; return i == 0 })
	require.Len(t, outs, len(tr))
	assert.Equal(t, []int{17, 17, 16}, seen)
	assert.Equal(t, int64(17), Admitted(outs))
	for i := 1; i < len(outs); i++ {
		assert.False(t, outs[i].At.Before(outs[i-1].At), "in order of sending")
	}
	assert.GreaterOrEqual(t, outs[len(outs)-1].At.Sub(outs[0].At), 40*time.Millisecond, "sent in real time")
}
