package flow

import "github.com/leapflow/leapflow/stat"

type pacedRule struct {
	p    *pacer
	rate float64 // Throttle
	warm *warmUp // WarmUpThrottle
	be   *BlockError
}

// pace is the paced rule's rate at now.
func (pr *pacedRule) pace(now int64, node *stat.Node) float64 {
	if pr.warm != nil {
		return pr.warm.rate(now, node)
	}
	return pr.rate
}

var pacedKind = kind{
	name:     "paced",
	is:       func(r *Rule) bool { return r.Behavior == Throttle || r.Behavior == WarmUpThrottle },
	validate: validatePaced,
	compile:  compilePaced,
	describe: describeRate,
}

// compilePaced adds a Throttle or WarmUpThrottle rule: its timeline (and
// warm-up model) kept across reloads that keep the rule.
func compilePaced(c *compiling) {
	r := c.r
	p := reuse(c.old.pacers, c.k, func() *pacer { return newPacer(r.MaxQueueing) })
	c.next.pacers[c.k] = p
	pr := pacedRule{p: p, rate: r.Threshold, be: newBlockError(r, ReasonQueue)}
	if r.Behavior == WarmUpThrottle {
		pr.warm = reuse(c.old.warm, c.k, func() *warmUp { return newWarmUp(r) })
		c.next.warm[c.k] = pr.warm
	}
	c.rr.paced = append(c.rr.paced, pr)
}

// takePaced reserves the request's slot on each Throttle rule's timeline,
// queueing it up to the longer of the rule's MaxQueueing and its own wait.
func (rr *resourceRules) takePaced(h *held, now, wait int64, q *request) (int64, refusal, bool) {
	for i := range rr.paced {
		pr := &rr.paced[i]
		rate := pr.pace(now, rr.node)
		ph, d, ok := pr.p.reserve(now, q.n, rate, q.wait)
		if !ok {
			return wait, refusal{pr.be, rate, paceRoom(d, max(pr.p.maxQueue, q.wait))}, false
		}
		h.paced[i] = ph
		wait = max(wait, d)
	}
	return wait, refusal{}, true
}

// releasePaced gives back the request's slots (see pacer.giveBack).
func (rr *resourceRules) releasePaced(h *held) {
	for i := range rr.paced {
		rr.paced[i].p.giveBack(h.paced[i])
	}
}

// alignPaced takes each Throttle rule's slot again at t itself (no queue
// past it).
func (rr *resourceRules) alignPaced(h *held, now, t, n int64) (refusal, bool) {
	for i := range rr.paced {
		pr := &rr.paced[i]
		pr.p.giveBack(h.paced[i])
		h.paced[i] = paceHeld{}
		rate := pr.pace(now, rr.node)
		ph, _, ok := reservePace(&pr.p.latest, 0, t, n, rate)
		if !ok {
			return refusal{pr.be, rate, unknownRoom}, false
		}
		h.paced[i] = ph
	}
	return refusal{}, true
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
