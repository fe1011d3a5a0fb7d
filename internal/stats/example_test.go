package stats_test

import (
	"fmt"
	"time"

	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/metric"
)

func ExampleNode_Snapshot() {
	n, _ := stats.NewNode("api", stats.NodeConfig{})
	sec := int64(time.Second)
	w := n.Second()
	w.Add(0, metric.Pass, 3)
	w.Complete(sec+sec/5, 2, int64(40*time.Millisecond), false) // two done at 1.2s, 40ms in all
	w.Add(sec+sec/10, metric.Pass, 1)
	s := n.Snapshot(sec + sec/2)
	fmt.Println(s.PassQPS, s.PrevPass, s.MinutePass, s.Inflight, s.AvgRT)
	// Output: 1 3 4 2 20ms
}
