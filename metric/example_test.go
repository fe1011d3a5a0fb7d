package metric_test

import (
	"fmt"
	"time"

	"github.com/leapflow/leapflow/metric"
)

// A 1 s window of 2 buckets admitting at most 3 passes. Times are
// nanoseconds from any origin; here they are written by hand.
func ExampleWindow_Reserve() {
	w, err := metric.NewWindow(2, time.Second)
	if err != nil {
		panic(err)
	}
	ms := int64(time.Millisecond)
	for i := range 4 {
		fmt.Println(i, w.Reserve(100*ms, 1, 3))
	}
	fmt.Println("pass:", w.Sum(100*ms, metric.Pass))
	// The 0-500ms bucket leaves the window at 1000ms.
	fmt.Println("at 1s:", w.Reserve(1000*ms, 3, 3))
	// Output:
	// 0 true
	// 1 true
	// 2 true
	// 3 false
	// pass: 3
	// at 1s: true
}

func ExampleWindow_View() {
	w, _ := metric.NewWindow(10, 10*time.Second) // 10 s of 1 s buckets
	sec := int64(time.Second)
	for s := range int64(10) {
		w.Add(s*sec, metric.Success, 1)
	}
	last, _ := w.View(time.Second)
	fmt.Println(w.Sum(9*sec, metric.Success), last.Sum(9*sec, metric.Success))
	// Output: 10 1
}
