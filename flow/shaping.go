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

// pacer spaces admissions evenly: each costs n/rate seconds of a timeline
// whose head is latest; a request that finds the head in the past starts it
// at now, otherwise it queues behind it, if that wait is within maxQueue.
// All arithmetic is in nanoseconds, and the cost is rounded up, so the rate
// never exceeds the threshold.
type pacer struct {
	latest   atomic.Int64
	maxQueue int64
}

func newPacer(maxQueue time.Duration) *pacer {
	p := &pacer{maxQueue: int64(maxQueue)}
	p.latest.Store(math.MinInt64 / 2)
	return p
}

// maxCost bounds one request's cost on the timeline, so that the head plus
// a cost never overflows.
const maxCost = int64(1) << 61

// reserve claims a slot for n at rate, queueing up to the longer of
// MaxQueueing and the request's own wait. It returns how long to wait and
// the cost to give back if the request is abandoned; refused, the wait it
// would have had (-1 when no wait would do: rate 0, or a cost beyond any
// queue).
func (p *pacer) reserve(now, n int64, rate float64, wait int64) (paceHeld, int64, bool) {
	return reservePace(&p.latest, max(p.maxQueue, wait), now, n, rate)
}

// paceHeld is a slot reserved on a timeline: its cost, and the head the
// reservation set (its slot), for giveBack.
type paceHeld struct{ cost, slot int64 }

// reservePace is pacer.reserve on a timeline head of its own (a key's).
// It returns the slot taken, and the wait (refused: the wait it would
// have had, -1 when no wait would do).
func reservePace(latest *atomic.Int64, maxQueue, now, n int64, rate float64) (ph paceHeld, wait int64, ok bool) {
	if rate <= 0 {
		return paceHeld{}, -1, false
	}
	c := math.Ceil(float64(n) * nsPerSecond / rate)
	if c > float64(maxCost) {
		// Longer than any wait allowed (and than int64 can hold for the
		// tiniest rates): never admitted.
		return paceHeld{}, -1, false
	}
	cost := int64(c)
	for {
		last := latest.Load()
		expected := last + cost
		if expected <= now {
			// Idle: the timeline restarts at now, no queueing.
			if latest.CompareAndSwap(last, now) {
				return paceHeld{cost, now}, 0, true
			}
			continue
		}
		wait = expected - now
		if wait > maxQueue {
			return paceHeld{}, wait, false
		}
		if latest.CompareAndSwap(last, expected) {
			return paceHeld{cost, expected}, wait, true
		}
		// Another request moved the head; queue behind it.
	}
}

// giveBackPace returns an abandoned slot to timeline head latest, if it
// is still the last one taken: the next request takes it. Once a request
// queued behind it, the slot stays spent: moving the head back under
// that request's slot would give two requests one slot.
func giveBackPace(latest *atomic.Int64, h paceHeld) {
	if h.cost != 0 {
		latest.CompareAndSwap(h.slot, h.slot-h.cost)
	}
}

// giveBack returns an abandoned slot (see giveBackPace).
func (p *pacer) giveBack(h paceHeld) { giveBackPace(&p.latest, h) }

// paceRoom is what a request a pacer refused with wait d is told: it may
// come back once its slot is within the queue.
func paceRoom(d, maxQueue int64) room {
	if d < 0 {
		return unknownRoom
	}
	return room{d - maxQueue, -1}
}
