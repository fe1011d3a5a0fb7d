package flow

import (
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

type relatedRule struct {
	node      *stat.Node
	threshold float64
	be        *BlockError
}

var relatedKind = kind{
	name:     "related",
	is:       func(r *Rule) bool { return r.RelatedResource != "" },
	compile:  compileRelated,
	describe: func(r *Rule) string { return "/s " + r.Behavior.String() + " of " + r.RelatedResource },
}

func compileRelated(c *compiling) {
	c.rr.related = append(c.rr.related, relatedRule{node: c.related, threshold: c.r.Threshold, be: newBlockError(c.r, ReasonFlow)})
}

// takeRelated refuses the request while a related resource's pass rate
// is over its rule's threshold.
func (rr *resourceRules) takeRelated(now, n int64) (refusal, bool) {
	for _, rel := range rr.related {
		if seen := rel.node.Rate(now, metric.Pass); seen+float64(n) > rel.threshold {
			return refusal{rel.be, seen, unknownRoom}, false
		}
	}
	return refusal{}, true
}
