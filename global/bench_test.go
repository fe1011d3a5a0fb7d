package global

import (
	"fmt"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
	"github.com/leapflow/leapflow/internal/hammer"
)

// BenchmarkGlobal is Entry+Exit on one hot global rule well below its
// limit, with leasing on and off, next to the same rule kept local. It
// reports round trips to Redis per decision.
func BenchmarkGlobal(b *testing.B) {
	srv := redistest.Start(b)
	for _, tc := range []struct {
		name  string
		batch int64 // MaxBatch; 0: a local rule
	}{{"local", 0}, {"lease=on", 100_000}, {"lease=off", 1}} {
		b.Run("impl="+tc.name, func(b *testing.B) {
			for _, g := range hammer.Goroutines {
				b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
					opts := []flow.Option{}
					var src *Source
					rule := flow.Rule{Resource: "api", Threshold: 1e12}
					if tc.batch > 0 {
						src = newSource(b, srv.Client(), WithMaxBatch(tc.batch))
						opts = append(opts, flow.WithTokenSource(src))
						rule.Global, rule.ID, rule.Fallback = true, fmt.Sprintf("bench-%d-%d-%d", tc.batch, g, time.Now().UnixNano()), flow.FallbackClosed
					}
					eng, err := flow.New(opts...)
					if err != nil {
						b.Fatal(err)
					}
					if err := eng.LoadRules([]flow.Rule{rule}); err != nil {
						b.Fatal(err)
					}
					r, err := eng.Resource("api")
					if err != nil {
						b.Fatal(err)
					}
					hammer.Run(b, g, func(_, n int) {
						for range n {
							// Blocked only when Redis failed (the rule
							// fails closed): counted below.
							if en, err := r.Entry(); err == nil {
								en.Exit(nil)
							}
						}
					})
					if src != nil {
						st := src.Stats()
						b.ReportMetric(float64(st.Calls)/float64(b.N), "calls/op")
						b.ReportMetric(float64(st.Errors+st.Refused)/float64(b.N), "fallbacks/op")
					}
				})
			}
		})
	}
}
