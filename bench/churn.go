package main

import (
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// churnCase is one row of the churn table: active resources under one
// kind of rule, at a GOMAXPROCS (the stripes each bucket is made with).
type churnCase struct {
	procs int
	rule  string
}

// churnRules are the rule kinds the churn table measures.
var churnRules = map[string]func(name string) flow.Rule{
	"Reject":     func(name string) flow.Rule { return flow.Rule{Resource: name, Threshold: 1e9} },
	"span-exact": func(name string) flow.Rule { return flow.Rule{Resource: name, Threshold: 1e9, SpanExact: true} },
}

// churnResult is what rotations cost: heap allocations and bytes per
// active resource per second of traffic.
type churnResult struct {
	churnCase
	allocs, bytes float64
}

// churnWarmUp is the simulated time before a churn measurement: past the
// minute window of 60 one-second buckets, the longest a resource keeps,
// and its spare, so that every window has made every bucket it reuses.
const churnWarmUp = 65

// churn measures cases of n active resources, each taking one request
// every 100 ms of a simulated clock for seconds (after churnWarmUp
// seconds), so that every bucket of every window rotates in its turn.
func churn(cases []churnCase, n, seconds int) ([]churnResult, error) {
	was := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(was)
	var out []churnResult
	for _, c := range cases {
		runtime.GOMAXPROCS(c.procs) // buckets are made with a stripe per P
		clock := stattest.NewClock(time.Hour)
		e, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(n+1))
		if err != nil {
			return nil, err
		}
		rules := make([]flow.Rule, n)
		for i := range rules {
			rules[i] = churnRules[c.rule](fmt.Sprintf("r%d", i))
		}
		if err := e.LoadRules(rules); err != nil {
			return nil, err
		}
		handles := make([]*flow.Resource, n)
		for i := range handles {
			if handles[i], err = e.Resource(rules[i].Resource); err != nil {
				return nil, err
			}
		}
		step := func(secs int) {
			for range secs * 10 {
				clock.Advance(100 * time.Millisecond)
				for _, r := range handles {
					en, err := r.Entry()
					if err != nil {
						panic(err) // a threshold no run reaches
					}
					en.Exit(nil)
				}
			}
		}
		step(churnWarmUp) // every window's buckets made once
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		step(seconds)
		runtime.ReadMemStats(&after)
		per := float64(n * seconds)
		out = append(out, churnResult{c, float64(after.Mallocs-before.Mallocs) / per, float64(after.TotalAlloc-before.TotalAlloc) / per})
	}
	return out, nil
}

// churnSection prints what bucket rotations allocate as resources stay
// active, at GOMAXPROCS 2 and 64 (stripes per bucket).
func churnSection(cfg config, w io.Writer) error {
	n, seconds := 1000, 60
	if cfg.quick {
		n, seconds = 200, 10
	}
	var cases []churnCase
	for _, procs := range []int{2, 64} {
		for _, rule := range []string{"Reject", "span-exact"} {
			cases = append(cases, churnCase{procs, rule})
		}
	}
	res, err := churn(cases, n, seconds)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "Churn: %d resources, each one request every 100 ms of a simulated clock for %d s, after %d s of warm-up:\n"+
		"heap allocations and bytes per active resource per second (bucket rotations, in steady state).\n\n", n, seconds, churnWarmUp)
	printed(w, []string{"GOMAXPROCS", "rule", "allocs/resource/s", "allocs/resource/min", "bytes/resource/s"}, func(row func(...string)) {
		for _, r := range res {
			row(fmt.Sprint(r.procs), r.rule, fmt.Sprintf("%.2f", r.allocs), fmt.Sprintf("%.3f", 60*r.allocs), fmt.Sprintf("%.0f", r.bytes))
		}
	})
	fmt.Fprintln(w, "\nTarget (issue 31): under 1 allocation per active resource per minute.")
	return nil
}
