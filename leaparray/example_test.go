package leaparray_test

import (
	"fmt"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/leaparray"
)

// A ring of four 250 ms buckets counting events; times are plain numbers.
func Example() {
	a, err := leaparray.New(4, time.Second, leaparray.Hooks[atomic.Int64]{})
	if err != nil {
		panic(err)
	}
	ms := int64(time.Millisecond)
	for _, t := range []int64{10, 260, 270, 990, 1100} {
		a.Current(t * ms).Value.Inc()
	}
	var sum int64
	for w := range a.Within(1100*ms, a.Interval()) {
		sum += w.Value.Load()
	}
	fmt.Println("last second at 1.1s:", sum) // the 0-250ms bucket has left
	// A time behind the newest bucket counts in it.
	fmt.Println(a.Current(500*ms).Start() / ms)
	// Output:
	// last second at 1.1s: 4
	// 1000
}
