// Package ruleview reads what the exporters (promflow, otelflow) show of
// an engine's rules, a series per resource and rule name (rules without
// IDs on one resource share a name), and sums a resource's delivered
// seconds.
package ruleview

import (
	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/breakers"
	"github.com/leapflow/leapflow/stat"
)

// Series is a resource and a rule name.
type Series struct{ Resource, Rule string }

// Threshold is the strictest threshold of a series' rules of one metric
// ("qps" or "concurrency").
type Threshold struct {
	Series
	Metric string
	Value  float64
}

// Thresholds returns the rules' thresholds, in the rules' order. Dry-run
// rules, breakers (a share or a count of failures) and system rules (a
// CPU usage) have none.
func Thresholds(eng *flow.Engine) []Threshold {
	var out []Threshold
	at := map[[3]string]int{}
	for _, rule := range eng.Rules() {
		if rule.DryRun || rule.Breaker != flow.NotBreaker || rule.System != flow.NotSystem {
			continue
		}
		metric := "qps"
		if rule.Metric == flow.Concurrency {
			metric = "concurrency"
		}
		k := [3]string{rule.Resource, rule.Name(), metric}
		if i, dup := at[k]; dup {
			out[i].Value = min(out[i].Value, rule.Threshold)
			continue
		}
		at[k] = len(out)
		out = append(out, Threshold{Series{k[0], k[1]}, metric, rule.Threshold})
	}
	return out
}

// Count is a series' count.
type Count struct {
	Series
	N int64
}

// WouldBlock returns what the dry-run rules would have blocked, summed by
// series.
func WouldBlock(eng *flow.Engine) []Count {
	var out []Count
	at := map[Series]int{}
	for _, d := range eng.DryRuns() {
		k := Series{d.Rule.Resource, d.Rule.Name()}
		if i, dup := at[k]; dup {
			out[i].N += d.WouldBlock
			continue
		}
		at[k] = len(out)
		out = append(out, Count{k, d.WouldBlock})
	}
	return out
}

// Breaker is a series' circuit breakers: the state that refuses most, and
// their changes of state summed by the state gone into.
type Breaker struct {
	Series
	State flow.BreakerState
	Into  [3]int64
}

// Breakers returns the engine's breakers by series.
func Breakers(eng *flow.Engine) []Breaker {
	var out []Breaker
	at := map[Series]int{}
	for _, b := range eng.Breakers() {
		k := Series{b.Rule.Resource, b.Rule.Name()}
		i, dup := at[k]
		if !dup {
			i = len(out)
			at[k] = i
			out = append(out, Breaker{Series: k, State: b.State})
		}
		if breakers.Worse(b.State, out[i].State) {
			out[i].State = b.State
		}
		for s, n := range b.Transitions {
			out[i].Into[s] += n
		}
	}
	return out
}

// Unreached returns the series of the rules that cannot take effect as
// named (flow.Engine.Unreached), each once.
func Unreached(eng *flow.Engine) []Series {
	var out []Series
	seen := map[Series]bool{}
	for _, r := range eng.Unreached() {
		if k := (Series{r.Resource, r.Name()}); !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// Totals are a resource's sums over its delivered seconds.
type Totals struct {
	Pass, Block, Occupied, Success, Exception int64
	RT                                        float64 // seconds
}

// Add sums s into t.
func (t *Totals) Add(s *stat.Second) {
	t.Pass += s.Pass
	t.Block += s.Block
	t.Occupied += s.Occupied
	t.Success += s.Success
	t.Exception += s.Exception
	t.RT += s.RT.Seconds()
}
