package flow_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// The README's example: at most 2 requests a second to "api".
func Example() {
	clock := stattest.NewClock(0) // omit WithClock for the real, monotonic one
	eng, _ := flow.New(flow.WithClock(clock))
	if err := eng.LoadRules([]flow.Rule{{Resource: "api", Threshold: 2}}); err != nil {
		panic(err)
	}
	for i := range 3 {
		en, err := eng.Entry("api")
		if errors.Is(err, flow.ErrBlocked) {
			fmt.Println(i, "blocked:", err)
			continue
		}
		fmt.Println(i, "passed")
		en.Exit(nil) // or en.Exit(err) to count an exception
	}
	clock.Advance(time.Second)
	_, err := eng.Entry("api")
	fmt.Println("a second later:", err)
	// Output:
	// 0 passed
	// 1 passed
	// 2 blocked: flow: "api" blocked by rule "api" (QPS 2, Reject, flow)
	// a second later: <nil>
}

func ExampleEngine_LoadRules() {
	eng, _ := flow.New()
	err := eng.LoadRules([]flow.Rule{
		{Resource: "api", Threshold: 100},
		{ID: "db-conc", Resource: "db", Metric: flow.Concurrency, Threshold: -5},
	})
	fmt.Println(err)
	fmt.Println(len(eng.Rules()), "rules in force")
	// Output:
	// flow: rule "db-conc" (#1): Threshold must be a finite number >= 0, got -5
	// 0 rules in force
}
