package breakers

import (
	"testing"

	"github.com/leapflow/leapflow/flow"
)

// Open refuses more than half-open, which refuses more than closed; no
// state is worse than itself.
func TestWorseOrdersStatesByWhatTheyRefuse(t *testing.T) {
	order := []flow.BreakerState{flow.BreakerClosed, flow.BreakerHalfOpen, flow.BreakerOpen}
	for i, a := range order {
		for j, b := range order {
			if got := Worse(a, b); got != (i > j) {
				t.Errorf("Worse(%v, %v) = %v", a, b, got)
			}
		}
	}
}
