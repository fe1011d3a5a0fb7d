package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Every kind describes itself: Rule.String names the rule, its metric and
// threshold, and what its kind does with them (the dashboard's words).
func TestEveryKindDescribesItself(t *testing.T) {
	for _, c := range []struct {
		r    Rule
		want string
	}{
		{Rule{ID: "api-limit", Resource: "api", Threshold: 2}, "api-limit: QPS 2/s Reject"},
		{Rule{Resource: "api", Threshold: 50, SpanExact: true, StatInterval: 2 * time.Second}, "QPS 50/s Reject span-exact over 2s"},
		{Rule{Resource: "api", Threshold: 100, Behavior: WarmUp, WarmUpPeriod: 10 * time.Second}, "QPS 100/s WarmUp warming 10s"},
		{Rule{Resource: "api", Threshold: 10, Behavior: Throttle, MaxQueueing: 500 * time.Millisecond}, "QPS 10/s Throttle queueing 500ms"},
		{Rule{Resource: "api", Threshold: 10, Behavior: GCRA, Burst: 5}, "QPS 10/s GCRA burst 5"},
		{Rule{Resource: "api", Metric: Concurrency, Threshold: 8}, "Concurrency 8 in flight"},
		{Rule{Resource: "api", Threshold: 10, RelatedResource: "db"}, "QPS 10/s Reject of db"},
		{Rule{Resource: "api", Threshold: 10, Global: true}, "QPS 10/s Reject global"},
		{Rule{Resource: "api", Threshold: 10, Global: true, PerKey: true}, "QPS 10/s Reject per key global"},
		{Rule{Resource: "api", Threshold: 10, PerKey: true}, "QPS 10/s Reject per key"},
		{Rule{Resource: "api", Metric: Concurrency, Threshold: 3, PerKey: true}, "Concurrency 3 in flight per key"},
		{Rule{Resource: "api", Threshold: 5, DryRun: true}, "QPS 5/s Reject (dry run)"},
	} {
		assert.Equal(t, c.want, c.r.String())
	}
}

// The kind table takes every rule: each is of exactly the first kind that
// says so, and the window kind takes what no other does.
func TestEveryRuleHasAKind(t *testing.T) {
	for _, r := range []Rule{{}, {DryRun: true, PerKey: true}, {Global: true, PerKey: true}, {Metric: Concurrency, PerKey: true}} {
		k := kindOf(&r)
		for _, before := range kinds {
			if before == k {
				break
			}
			assert.False(t, before.is(&r), "an earlier kind takes %+v", r)
		}
	}
	assert.Same(t, &windowKind, kindOf(&Rule{Resource: "api"}))
	assert.Same(t, &perKeyKind, kindOf(&Rule{PerKey: true, Metric: Concurrency}))
	assert.Same(t, &globalKind, kindOf(&Rule{PerKey: true, Global: true}))
}
