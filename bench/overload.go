package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/overloadsim"
)

// overloadCase is one run of the overload section.
type overloadCase struct {
	name string
	load float64
	bbr  bool
}

var overloadCases = []overloadCase{
	{"unloaded (0.5x), no rule", 0.5, false},
	{"3x overload, no rule", 3, false},
	{"3x overload, SystemBBR", 3, true},
}

// overloadConfig is the simulated service: 8 workers of 10 ms (±10%), 800
// requests per second; 2 s at half of it, then 20 s at the case's load,
// of which the last 15 s are measured.
func overloadConfig(c overloadCase) overloadsim.Config {
	cfg := overloadsim.Config{Workers: 8, Service: 10 * time.Millisecond, Jitter: 0.1, Load: c.load, Warm: 2 * time.Second,
		Run: 20 * time.Second, Skip: 5 * time.Second, Seed: 7}
	if c.bbr {
		cfg.Rules = []flow.Rule{{Resource: "inbound", System: flow.SystemBBR, Threshold: 0.8}}
	}
	return cfg
}

// overloadSection simulates a service of fixed capacity, unloaded and
// under 3x overload with and without a SystemBBR rule, in simulated time
// (the engine on a fake clock, its CPU reading the workers' busy share):
// goodput, latency and shed requests, in a table and two charts.
func overloadSection(cfg config, w io.Writer) error {
	fmt.Fprintf(w, "Overload: a simulated service of 8 workers x 10 ms (±10%%), 800 requests/s, under Poisson arrivals, in simulated time;\n"+
		"the rule is {System: SystemBBR, Threshold: 0.8} on the one inbound resource. Measured: the last 15 s of 20.\n\n")
	var results []overloadsim.Result
	for _, c := range overloadCases {
		r, err := overloadsim.Simulate(overloadConfig(c))
		if err != nil {
			return err
		}
		results = append(results, r)
	}
	ms := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 1, 64) }
	printed(w, []string{"case", "goodput/s", "of capacity", "p50 ms", "p99 ms", "shed", "arrived", "longest queue"}, func(row func(...string)) {
		for i, c := range overloadCases {
			r := results[i]
			row(c.name, fmt.Sprintf("%.0f", r.Goodput), fmt.Sprintf("%.1f%%", 100*r.Goodput/r.Capacity), ms(r.P50), ms(r.P99),
				strconv.FormatInt(r.Shed, 10), strconv.FormatInt(r.Arrived, 10), strconv.Itoa(r.MaxQueue))
		}
	})
	unloaded, without, with := results[0], results[1], results[2]
	fmt.Fprintf(w, "\nWith SystemBBR: goodput %.1f%% of capacity (target: within 10%%), p99 %.2fx the unloaded p99 (target: at most 2x);\n"+
		"without a rule the queue grows by 1,600 requests a second and p99 reaches %v.\n", 100*with.Goodput/with.Capacity,
		float64(with.P99)/float64(unloaded.P99), without.P99.Round(time.Millisecond))
	var failed []string
	if with.Goodput < 0.9*with.Capacity {
		failed = append(failed, "goodput")
	}
	if with.P99 > 2*unloaded.P99 {
		failed = append(failed, "p99")
	}
	if err := overloadCharts(cfg.out, results); err != nil {
		return err
	}
	fmt.Fprintf(w, "Charts in %s/ (overload-goodput.svg, overload-latency.svg)\n", cfg.out)
	if len(failed) > 0 {
		return fmt.Errorf("bench: overload: the SystemBBR run missed its targets: %v", failed)
	}
	return nil
}

// overloadCharts draws goodput and shed requests per second against the
// capacity, and p50 and p99 latency (log scale: without a rule they are
// seconds), into dir.
func overloadCharts(dir string, rs []overloadsim.Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var cats []string
	good, shed := series{name: "goodput/s"}, series{name: "shed/s"}
	p50, p99 := series{name: "p50 ms"}, series{name: "p99 ms"}
	for i, c := range overloadCases {
		r := rs[i]
		cats = append(cats, c.name)
		good.points = append(good.points, r.Goodput)
		shed.points = append(shed.points, float64(r.Shed)/(overloadConfig(c).Run-overloadConfig(c).Skip).Seconds())
		p50.points = append(p50.points, float64(r.P50)/1e6)
		p99.points = append(p99.points, float64(r.P99)/1e6)
	}
	var b bytes.Buffer
	if err := barChart(&b, "Overload: requests completed and shed per second (higher goodput is better)", "requests/s", cats,
		[]series{good, shed}, rs[0].Capacity, "capacity"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "overload-goodput.svg"), b.Bytes(), 0o644); err != nil {
		return err
	}
	b.Reset()
	if err := lineChart(&b, "Overload: latency, arrival to completion (lower is better)", "ms (log)", cats, []series{p50, p99}); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "overload-latency.svg"), b.Bytes(), 0o644)
}
