package global_test

import (
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global"
)

// A rule enforced across every instance that shares the Redis server: 500
// requests a second in all, falling back to 100 a second per instance (a
// fifth of it) while Redis is unreachable.
func Example() {
	// Dial builds the client as the Source needs it (context deadlines
	// honoured, one attempt per dial). Requests wait at most 50 ms for
	// Redis (a Redis up to about 25 ms away); calls run on for up to a
	// second in the background.
	src, err := global.Dial(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}},
		global.WithTimeout(50*time.Millisecond))
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close()
	eng, err := flow.New(flow.WithTokenSource(src))
	if err != nil {
		log.Fatal(err)
	}
	if err := eng.LoadRules([]flow.Rule{{
		Resource: "checkout", Threshold: 500, Global: true,
		Fallback: flow.FallbackLocal, LocalShare: 0.2,
	}}); err != nil {
		log.Fatal(err)
	}
	if en, err := eng.Entry("checkout"); err == nil {
		defer en.Exit(nil)
		// ... serve the request
	}
}
