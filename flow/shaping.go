package flow

import (
	"math"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

const nsPerSecond = float64(time.Second)

// warmUp is the token-bucket model of Guava's SmoothWarmingUp, as Sentinel
// uses it: a cold resource holds maxToken tokens and admits Threshold /
// ColdFactor per second; every second the tokens drain by the previous
// second's passes and refill towards maxToken while traffic stays under the
// cold rate, and the allowed rate rises linearly as tokens fall towards
// warningToken, below which the full Threshold applies.
type warmUp struct {
	count        float64 // the threshold, per second
	coldFactor   float64
	warningToken int64
	maxToken     int64
	slope        float64

	stored     atomic.Int64 // tokens
	lastFilled atomic.Int64 // start of the last second synced, ns
}

func newWarmUp(r *Rule) *warmUp {
	period := r.WarmUpPeriod.Seconds()
	w := &warmUp{count: r.Threshold, coldFactor: r.ColdFactor}
	w.warningToken = int64(period * r.Threshold / (r.ColdFactor - 1))
	w.maxToken = w.warningToken + int64(2*period*r.Threshold/(1+r.ColdFactor))
	if w.maxToken > w.warningToken && r.Threshold > 0 {
		w.slope = (r.ColdFactor - 1) / r.Threshold / float64(w.maxToken-w.warningToken)
	}
	w.stored.Store(w.maxToken) // start cold
	w.lastFilled.Store(math.MinInt64 / 2)
	return w
}

// rate returns the admissions per second allowed at now. The previous whole
// second's pass count is read from node only by the goroutine that syncs a
// new second.
func (w *warmUp) rate(now int64, node *stat.Node) float64 {
	if w.count <= 0 {
		return 0
	}
	w.sync(now, node)
	rest := w.stored.Load()
	if rest < w.warningToken {
		return w.count
	}
	above := float64(rest - w.warningToken)
	return 1 / (above*w.slope + 1/w.count)
}

// sync refills and drains the tokens once per second. One goroutine wins
// the second by CAS on lastFilled and does the update; the rest read.
func (w *warmUp) sync(now int64, node *stat.Node) {
	cur := now - now%int64(time.Second)
	last := w.lastFilled.Load()
	if cur <= last || !w.lastFilled.CompareAndSwap(last, cur) {
		return
	}
	passed := node.PreviousSecond(now, metric.Pass)
	old := w.stored.Load()
	next := old
	refill := int64(float64(cur-last) / nsPerSecond * w.count)
	if last < 0 || refill < 0 { // first sync, or an overflow: full
		refill = w.maxToken
	}
	switch {
	case old < w.warningToken:
		next = old + refill
	case old > w.warningToken && float64(passed) < w.count/w.coldFactor:
		next = old + refill
	}
	next = min(next, w.maxToken) - passed
	w.stored.Store(max(next, 0))
}

// paceRoom is what a request a pacer refused with wait d is told: it may
// come back once its slot is within the queue.
func paceRoom(d, maxQueue int64) room {
	if d < 0 {
		return unknownRoom
	}
	return room{d - maxQueue, -1}
}
