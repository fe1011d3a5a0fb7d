// Command hello limits one resource to 2 requests a second and shows the
// third request refused.
package main

import (
	"fmt"
	"log"

	"github.com/leapflow/leapflow/flow"
)

func main() {
	eng, err := flow.New()
	if err != nil {
		log.Fatal(err)
	}
	// 2 requests a second on "hello". A bad rule is an error naming the
	// field and value, and changes nothing.
	if err := eng.LoadRules([]flow.Rule{{Resource: "hello", Threshold: 2}}); err != nil {
		log.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		en, err := eng.Entry("hello")
		if err != nil { // errors.Is(err, flow.ErrBlocked); en.Refusal().RetryAfter says when to retry
			fmt.Printf("request %d: %v\n", i, err)
			continue
		}
		fmt.Printf("request %d: admitted\n", i)
		en.Exit(nil) // Exit(err) counts an exception; every admitted Entry exits once
	}
}
