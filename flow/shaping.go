package flow

import "github.com/leapflow/leapflow/internal/warmup"

// newWarmUp is the warm-up bucket of a WarmUp or WarmUpThrottle rule.
func newWarmUp(r *Rule) *warmup.Bucket {
	return warmup.New(r.Threshold, r.ColdFactor, r.WarmUpPeriod)
}

// paceRoom is what a request a pacer refused with wait d is told: it may
// come back once its slot is within the queue.
func paceRoom(d, maxQueue int64) room {
	if d < 0 {
		return unknownRoom
	}
	return room{d - maxQueue, -1}
}
