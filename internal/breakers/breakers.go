// Package breakers orders circuit breakers' states for the packages that
// show one state for several breakers of a resource (promflow, metriclog,
// the dashboard): the one that refuses most.
package breakers

import "github.com/leapflow/leapflow/flow"

// refuses ranks the states by how much they refuse: open every request,
// half-open all but its probe, closed none.
var refuses = [...]int{flow.BreakerClosed: 0, flow.BreakerOpen: 2, flow.BreakerHalfOpen: 1}

// Worse reports whether state a refuses more than state b.
func Worse(a, b flow.BreakerState) bool { return rank(a) > rank(b) }

func rank(s flow.BreakerState) int {
	if int(s) < len(refuses) {
		return refuses[s]
	}
	return 0
}
