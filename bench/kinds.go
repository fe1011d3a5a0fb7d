package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/leapflow/leapflow/flow"
)

// The rule-kind section: what one Entry+Exit costs on a resource with one
// rule of each kind (a limit no request reaches), through a flow.Resource
// on one goroutine, beside a resource with no rule: a rule pays only for
// what it uses.

// kindCase is one kind's resource: its rules and the options of each
// request.
type kindCase struct {
	name  string
	rules []flow.Rule
	opts  []flow.EntryOption
}

func kindCases() []kindCase {
	r := func(rules ...flow.Rule) []flow.Rule {
		for i := range rules {
			rules[i].Resource = "api"
		}
		return rules
	}
	key := []flow.EntryOption{flow.WithKey("user-42")}
	var sixteen []flow.Rule
	for i := range 16 {
		sixteen = append(sixteen, flow.Rule{Threshold: 1e12, StatInterval: time.Duration(i+1) * time.Second})
	}
	return []kindCase{
		{name: "no rule"},
		{name: "QPS Reject", rules: r(flow.Rule{Threshold: 1e12})},
		{name: "QPS Reject, span-exact", rules: r(flow.Rule{Threshold: 1e12, SpanExact: true})},
		{name: "QPS Reject, 2 windows", rules: r(flow.Rule{Threshold: 1e12}, flow.Rule{Threshold: 1e12, StatInterval: 10 * time.Second})},
		{name: "QPS Reject, 16 windows", rules: r(sixteen...)},
		{name: "WarmUp", rules: r(flow.Rule{Threshold: 1e12, Behavior: flow.WarmUp, WarmUpPeriod: time.Second})},
		{name: "Throttle", rules: r(flow.Rule{Threshold: 1e12, Behavior: flow.Throttle, MaxQueueing: time.Second})},
		{name: "GCRA", rules: r(flow.Rule{Threshold: 1e9, Behavior: flow.GCRA, Burst: 1e6})},
		{name: "Concurrency", rules: r(flow.Rule{Metric: flow.Concurrency, Threshold: 1e9})},
		{name: "related resource", rules: r(flow.Rule{Threshold: 1e12, RelatedResource: "other"})},
		{name: "PerKey QPS", rules: r(flow.Rule{Threshold: 1e9, PerKey: true}), opts: key},
		{name: "PerKey Concurrency", rules: r(flow.Rule{Metric: flow.Concurrency, Threshold: 1e9, PerKey: true}), opts: key},
		{name: "Global (stub source)", rules: r(flow.Rule{Threshold: 1e12, Global: true})},
		{name: "dry run", rules: r(flow.Rule{Threshold: 1, DryRun: true})},
		{name: "circuit breaker (closed)", rules: r(flow.Rule{Breaker: flow.ErrorRatio, Threshold: 0.5, MinRequests: 10, RetryTimeout: time.Second})},
		{name: "SystemBBR (CPU cool)", rules: r(flow.Rule{System: flow.SystemBBR, Threshold: 0.8})},
	}
}

// kindCost is one row of the section.
type kindCost struct {
	name           string
	nsPerOp, plain float64
	allocs         float64
}

// stubSource admits every global request without a call out: the engine's
// own cost of a Global rule (the token source's is in the Global section).
type stubSource struct{}

func (stubSource) Acquire(context.Context, flow.GlobalRequest) (bool, error) { return true, nil }

// coolCPU is a CPU reading under every system rule's threshold.
type coolCPU struct{}

func (coolCPU) CPUUsage() float64 { return 0.1 }

// kindsSection measures every kind.
func kindsSection(cfg config, tick func(string)) []kindCost {
	var rows []kindCost
	for _, c := range kindCases() {
		tick("rule kind " + c.name)
		e, err := flow.New(flow.WithTokenSource(stubSource{}), flow.WithCPU(coolCPU{}))
		if err != nil {
			panic(err)
		}
		if err := e.LoadRules(c.rules); err != nil {
			panic(fmt.Sprintf("bench: the %s case: %v", c.name, err))
		}
		h, err := e.Resource("api")
		if err != nil {
			panic(err)
		}
		opts := c.opts
		ns, allocs, _ := measure(func(int, int) {
			en, err := h.Entry(opts...)
			if err != nil {
				panic(fmt.Sprintf("bench: the %s case refused a request: %v", c.name, err))
			}
			en.Exit(nil)
		}, 1, cfg.duration)
		rows = append(rows, kindCost{name: c.name, nsPerOp: ns, allocs: allocs})
	}
	for i := range rows {
		rows[i].plain = rows[0].nsPerOp
	}
	return rows
}

func kindSteps() int { return len(kindCases()) }

// kindsTables writes the section.
func (r *report) kindsTables(w io.Writer, md bool) {
	if md {
		fmt.Fprintf(w, "\n## What each rule kind costs\n\nOne Entry+Exit through a flow.Resource on one goroutine, on a resource "+
			"with one rule of the kind (a limit no request reaches; Global on a token source that admits without a call out), "+
			"cells of %v; *x no rule* is the ratio to a resource without rules.\n\n", r.cfg.duration)
	} else {
		fmt.Fprintf(w, "\nWhat each rule kind costs: Entry+Exit through a flow.Resource, one goroutine, a limit no request reaches\n")
	}
	var rows [][]string
	for _, k := range r.kinds {
		rows = append(rows, []string{k.name, fmt.Sprintf("%.1f", k.nsPerOp), fmt.Sprintf("%.2f", k.nsPerOp/k.plain), fmt.Sprintf("%.2f", k.allocs)})
	}
	table(w, md, []string{"rule kind", "ns/op", "x no rule", "allocs/op"}, rows)
}
