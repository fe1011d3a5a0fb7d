package promflow

import (
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// BenchmarkScrape10k is one scrape (Gather: collect, check, sort) of an
// engine with 10,000 resources, each with a rule and a delivered second.
func BenchmarkScrape10k(b *testing.B) {
	const n = 10_000
	clock := stattest.NewClock(0)
	eng, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(n))
	if err != nil {
		b.Fatal(err)
	}
	rules := make([]flow.Rule, n)
	for i := range rules {
		rules[i] = flow.Rule{Resource: "res-" + strconv.Itoa(i), Threshold: 1000}
	}
	if err := eng.LoadRules(rules); err != nil {
		b.Fatal(err)
	}
	defer eng.Feed().Close()
	c := New(eng)
	defer c.Close()
	clock.Set(time.Second)
	for _, r := range rules {
		en, err := eng.Entry(r.Resource)
		if err != nil {
			b.Fatal(err)
		}
		en.Exit(nil)
	}
	clock.Set(3 * time.Second)
	eng.Feed().Poll()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	b.ReportAllocs()
	for b.Loop() {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) == 0 {
			b.Fatal(err)
		}
	}
}
