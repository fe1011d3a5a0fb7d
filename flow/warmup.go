package flow

import (
	"fmt"
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/warmup"
)

type warmRule struct {
	w  *warmup.Bucket
	be *BlockError
}

var warmUpKind = kind{
	is:       func(r *Rule) bool { return r.Behavior == WarmUp },
	validate: validateWarmUp,
	compile:  compileWarmUp,
	describe: describeRate,
}

// compileWarmUp adds a WarmUp rule to its window's group: the group admits
// at the smallest of its rules' limits, a warm-up rule's at its rate now.
func compileWarmUp(c *compiling) {
	r := c.r
	g := c.rr.windowGroupOf(c.e, r)
	wu := keepWarmUp(c)
	g.warm = append(g.warm, warmRule{w: wu, be: newBlockError(r, ReasonFlow)})
	g.borrowable = false
}

// validateWarmUp checks the warm-up model of a WarmUp or WarmUpThrottle
// rule.
func validateWarmUp(r *Rule, i int) error {
	if r.Behavior != WarmUp && r.Behavior != WarmUpThrottle {
		return nil
	}
	switch {
	case r.WarmUpPeriod <= 0:
		return r.errorf(i, "WarmUpPeriod", r.WarmUpPeriod, "must be > 0 for "+r.Behavior.String())
	case r.WarmUpPeriod > maxWarmUpPeriod:
		return r.errorf(i, "WarmUpPeriod", r.WarmUpPeriod, "must be at most 24h")
	case math.IsNaN(r.ColdFactor) || r.ColdFactor <= 1 || r.ColdFactor > maxColdFactor:
		return r.errorf(i, "ColdFactor", r.ColdFactor, "must be > 1 and at most 1e6")
	case warmUpTokens(r) > maxWarmUpTokens:
		return r.errorf(i, "ColdFactor", r.ColdFactor, fmt.Sprintf("is too close to 1 for this WarmUpPeriod and Threshold: the warm-up model would hold %.3g tokens, more than %g", warmUpTokens(r), float64(maxWarmUpTokens)))
	}
	return nil
}

// warmUpTokens is the most tokens the warm-up model of r holds (see
// warmup.New).
func warmUpTokens(r *Rule) float64 {
	warning, cold := warmup.Tokens(r.Threshold, r.ColdFactor, r.WarmUpPeriod)
	return warning + cold
}

// Warm-up bounds keep the token counts of the warm-up model within range.
const (
	maxWarmUpPeriod = 24 * time.Hour
	maxColdFactor   = 1e6
	maxWarmUpTokens = 1e15
)

// keepWarmUp is the warm-up bucket of c's WarmUp or WarmUpThrottle rule:
// the old one if the rule stays the same rule, as warm as it was.
func keepWarmUp(c *compiling) *warmup.Bucket {
	r := c.r
	return keep(c, c.old.warm, c.next.warm, func(b *warmup.Bucket, was *Rule) (*warmup.Bucket, bool) {
		if was.Threshold == r.Threshold && was.ColdFactor == r.ColdFactor && was.WarmUpPeriod == r.WarmUpPeriod {
			return b, true
		}
		nb := newWarmUp(r)
		nb.Follow(b)
		return nb, true
	}, func() *warmup.Bucket { return newWarmUp(r) })
}

// newWarmUp is the warm-up bucket of a WarmUp or WarmUpThrottle rule.
func newWarmUp(r *Rule) *warmup.Bucket {
	return warmup.New(r.Threshold, r.ColdFactor, r.WarmUpPeriod)
}
