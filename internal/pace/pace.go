// Package pace spaces admissions evenly on a timeline: a request of n
// costs n/rate seconds of it, its slot is that cost after the timeline's
// head (the slot before it), or now if that is past, and it waits for its
// slot if that is within its queue; so admissions never run faster than the
// rate.
//
// Package flow's Throttle and WarmUpThrottle rules hold a Pacer each, kept
// across reloads; its PerKey Throttle rules run Reserve and GiveBack on a
// head word of each key's own. Times are int64 nanoseconds of the caller's
// clock, passed in, so tests drive it with plain numbers.
package pace

import (
	"math"
	"time"

	"go.uber.org/atomic"
)

// maxCost bounds one request's cost on the timeline, so that the head plus
// a cost never overflows.
const maxCost = int64(1) << 61

// idle is a fresh timeline's head: far enough in the past that any
// request at any now >= math.MinInt64/4 starts it.
const idle = math.MinInt64 / 2

// Held is a slot reserved on a timeline: its cost, and the head the
// reservation set (its slot), for GiveBack. The zero Held holds nothing.
type Held struct{ Cost, Slot int64 }

// Reserve claims a slot for n at rate on the timeline whose head is head,
// queueing up to maxQueue ns. All arithmetic is in nanoseconds and the
// cost is rounded up, so the rate never exceeds rate. It returns the slot
// taken and how long to wait for it; refused, the wait it would have had
// (-1 when no wait would do: rate 0, or a cost beyond any queue).
func Reserve(head *atomic.Int64, maxQueue, now, n int64, rate float64) (h Held, wait int64, ok bool) {
	if rate <= 0 {
		return Held{}, -1, false
	}
	c := math.Ceil(float64(n) * float64(time.Second) / rate)
	if c > float64(maxCost) {
		// Longer than any wait allowed (and than int64 can hold for the
		// tiniest rates): never admitted.
		return Held{}, -1, false
	}
	cost := int64(c)
	for {
		last := head.Load()
		expected := last + cost
		if expected <= now {
			// Idle: the timeline restarts at now, no queueing.
			if head.CompareAndSwap(last, now) {
				return Held{cost, now}, 0, true
			}
			continue
		}
		wait = expected - now
		if wait > maxQueue {
			return Held{}, wait, false
		}
		if head.CompareAndSwap(last, expected) {
			return Held{cost, expected}, wait, true
		}
		// Another request moved the head; queue behind it.
	}
}

// Room is how long from now until a request of n at rate, queueing up to
// maxQueue, would be admitted on the timeline whose head is head, taking
// no slot (head nil: an idle timeline): 0 now, -1 never (rate 0, or a
// cost beyond any queue).
func Room(head *atomic.Int64, maxQueue, now, n int64, rate float64) int64 {
	if rate <= 0 {
		return -1
	}
	c := math.Ceil(float64(n) * float64(time.Second) / rate)
	if c > float64(maxCost) {
		return -1
	}
	last := int64(idle) // a nil head: an idle timeline
	if head != nil {
		last = head.Load()
	}
	return max(last+int64(c)-now-maxQueue, 0)
}

// GiveBack returns an abandoned slot to the timeline whose head is head,
// if it is still the last one taken: the next request takes it. Once a
// request queued behind it, the slot stays spent: moving the head back
// under that request's slot would give two requests one slot.
func GiveBack(head *atomic.Int64, h Held) {
	if h.Cost != 0 {
		head.CompareAndSwap(h.Slot, h.Slot-h.Cost)
	}
}

// Pacer is a timeline of its own. It is safe for simultaneous use by
// multiple goroutines and must not be copied after first use.
type Pacer struct {
	head atomic.Int64
}

// New returns an idle pacer.
func New() *Pacer {
	p := &Pacer{}
	p.head.Store(idle)
	return p
}

// Reserve is Reserve on the pacer's timeline, queueing up to maxQueue:
// the caller passes its rule's queue or the longer wait a request allows,
// or 0 for a slot at now itself.
func (p *Pacer) Reserve(now, n int64, rate float64, maxQueue int64) (h Held, wait int64, ok bool) {
	return Reserve(&p.head, maxQueue, now, n, rate)
}

// Room is Room on the pacer's timeline.
func (p *Pacer) Room(now, n int64, rate float64, maxQueue int64) int64 {
	return Room(&p.head, maxQueue, now, n, rate)
}

// GiveBack returns an abandoned slot (see GiveBack).
func (p *Pacer) GiveBack(h Held) { GiveBack(&p.head, h) }

// Rescale makes what is queued on the timeline whose head is head, paced
// at one rate until now, take as long at a rate ratio times slower (ratio
// is the old rate over the new): the queue ahead of now is ratio times as
// long, rounded up, so its requests keep their place and none is admitted
// sooner than the new rate allows after them. A past head is left alone.
func Rescale(head *atomic.Int64, now int64, ratio float64) {
	if ratio == 1 || !(ratio > 0) || math.IsInf(ratio, 0) {
		return
	}
	for {
		h := head.Load()
		if h <= now {
			return
		}
		ahead := math.Ceil(float64(h-now) * ratio)
		next := now + int64(min(ahead, float64(maxCost)))
		if head.CompareAndSwap(h, next) {
			return
		}
	}
}

// Rescale rescales the pacer's timeline (see Rescale).
func (p *Pacer) Rescale(now int64, ratio float64) { Rescale(&p.head, now, ratio) }
