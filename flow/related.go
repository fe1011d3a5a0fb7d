package flow

import (
	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/metric"
)

type relatedRule struct {
	node      *stats.Node
	threshold float64
	be        *BlockError
}

var relatedKind = kind{
	is:       func(r *Rule) bool { return r.RelatedResource != "" },
	validate: validateRelated,
	compile:  compileRelated,
	describe: func(r *Rule) string { return "/s " + r.Behavior.String() + " of " + r.RelatedResource },
}

func compileRelated(c *compiling) {
	c.rr.related = append(c.rr.related, relatedRule{node: c.related, threshold: c.r.Threshold, be: newBlockError(c.r, ReasonFlow)})
}

// takeRelated refuses the request while a related resource's pass rate
// is over its rule's threshold.
func (rr *resourceRules) takeRelated(now, n int64, rf *refusal) bool {
	for i, rel := range rr.related {
		if seen := rel.node.Rate(now, metric.Pass); seen+float64(n) > rel.threshold {
			*rf = refusal{rel.be, seen, unknownRoom, i}
			return false
		}
	}
	return true
}

// validateRelated checks a related-resource rule: a QPS Reject rule over
// the other resource's second window.
func validateRelated(r *Rule, i int) error {
	if r.RelatedResource == "" {
		return nil
	}
	switch {
	case r.RelatedResource == r.Resource:
		return r.errorf(i, "RelatedResource", r.RelatedResource, "must differ from Resource")
	case r.Global:
		return r.errorf(i, "RelatedResource", r.RelatedResource, "cannot be combined with Global")
	case r.Metric != QPS || r.Behavior != Reject:
		return r.errorf(i, "RelatedResource", r.RelatedResource, "needs a QPS rule with Behavior Reject")
	}
	return r.oneSecond(i, "a related-resource rule")
}
