package flow

import (
	"github.com/leapflow/leapflow/internal/pace"
	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/internal/warmup"
	"github.com/leapflow/leapflow/metric"
)

type pacedRule struct {
	p        *pace.Pacer
	maxQueue int64          // MaxQueueing, ns
	rate     float64        // Throttle
	warm     *warmup.Bucket // WarmUpThrottle
	be       *BlockError
}

// pace is the paced rule's rate at now.
func (pr *pacedRule) pace(now int64, node *stats.Node) float64 {
	if pr.warm != nil {
		return pr.warm.Rate(now, func() int64 { return node.PreviousSecond(now, metric.Pass) })
	}
	return pr.rate
}

var pacedKind = kind{
	is:       func(r *Rule) bool { return r.Behavior == Throttle || r.Behavior == WarmUpThrottle },
	validate: validatePaced,
	compile:  compilePaced,
	describe: describeRate,
}

// compilePaced adds a Throttle or WarmUpThrottle rule: its timeline (and
// warm-up model) kept across reloads that keep the rule.
func compilePaced(c *compiling) {
	r := c.r
	// A new rate stretches (or shrinks) what is queued, in place: the
	// old rules' requests go on counting on the same timeline.
	p := keep(c, c.old.pacers, c.next.pacers, func(p *pace.Pacer, was *Rule) (*pace.Pacer, bool) {
		p.Rescale(c.now, slower(was.Threshold, r.Threshold))
		return p, true
	}, pace.New)
	pr := pacedRule{p: p, maxQueue: int64(r.MaxQueueing), rate: r.Threshold, be: newBlockError(r, ReasonQueue)}
	if r.Behavior == WarmUpThrottle {
		pr.warm = keepWarmUp(c)
	}
	c.rr.paced = append(c.rr.paced, pr)
}

// takePaced reserves the request's slot on each Throttle rule's timeline,
// queueing it up to the longer of the rule's MaxQueueing and its own wait.
func (rr *resourceRules) takePaced(h *held, now, wait int64, q *request, rf *refusal) (int64, bool) {
	for i := range rr.paced {
		pr := &rr.paced[i]
		rate := pr.pace(now, rr.node)
		queue := max(pr.maxQueue, q.wait)
		if q.noQueue {
			queue = 0
		}
		ph, d, ok := pr.p.Reserve(now, q.n, rate, queue)
		if !ok {
			rm := paceRoom(d, queue)
			if pr.warm != nil {
				rm = unknownRoom // its rate moves while the caller waits
			}
			*rf = refusal{pr.be, rate, rm, i}
			return wait, false
		}
		h.paced[i] = ph
		wait = max(wait, d)
	}
	return wait, true
}

// releasePaced gives back the request's slots (see pace.Pacer.GiveBack).
func (rr *resourceRules) releasePaced(h *held) {
	for i := range rr.paced {
		rr.paced[i].p.GiveBack(h.paced[i])
	}
}

// alignPaced takes each Throttle rule's slot again at t itself (no queue
// past it).
func (rr *resourceRules) alignPaced(h *held, now, t, n int64, rf *refusal) bool {
	for i := range rr.paced {
		pr := &rr.paced[i]
		pr.p.GiveBack(h.paced[i])
		h.paced[i] = pace.Held{}
		rate := pr.pace(now, rr.node)
		ph, _, ok := pr.p.Reserve(t, n, rate, 0)
		if !ok {
			*rf = refusal{pr.be, rate, unknownRoom, i}
			return false
		}
		h.paced[i] = ph
	}
	return true
}

// validatePaced checks a Throttle or WarmUpThrottle rule's rate, which
// has no window.
func validatePaced(r *Rule, i int) error {
	if r.Behavior != Throttle && r.Behavior != WarmUpThrottle {
		return nil
	}
	if r.Threshold > 0 && r.Threshold < minPacedRate {
		return r.errorf(i, "Threshold", r.Threshold, "must be 0 or at least 0.001 (one request per 1000 s) for "+r.Behavior.String())
	}
	if r.Metric == QPS {
		return r.oneSecond(i, r.Behavior.String()+" rules")
	}
	return nil
}

// paceRoom is what a request a pacer refused with wait d is told: it may
// come back once its slot is within the queue.
func paceRoom(d, maxQueue int64) room {
	if d < 0 {
		return unknownRoom
	}
	return room{d - maxQueue, -1}
}
