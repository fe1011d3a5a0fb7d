package leaparray_test

import (
	"fmt"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/leaparray"
)

// A ring of four 250 ms buckets counting events; times are plain numbers.
func Example() {
	a, err := leaparray.New[atomic.Int64](4, time.Second, nil)
	if err != nil {
		panic(err)
	}
	ms := int64(time.Millisecond)
	for _, t := range []int64{10, 260, 270, 990, 1100} {
		a.Current(t * ms).Value.Inc()
	}
	var sum int64
	a.ForEach(1100*ms, func(w *leaparray.WindowWrap[atomic.Int64]) bool {
		sum += w.Value.Load()
		return true
	})
	fmt.Println("last second at 1.1s:", sum) // the 0-250ms bucket has left
	// A time behind the newest bucket counts in it.
	fmt.Println(a.Current(500*ms).Start() / ms)
	// Output:
	// last second at 1.1s: 4
	// 1000
}
