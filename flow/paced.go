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
