// Command bench is leapflow's main job: on whatever machine it runs, a
// head-to-head throughput table against what a user would pick instead, an
// accuracy report for every algorithm, and a memory table. It prints
// aligned tables and writes a Markdown report and SVG charts to -out.
//
//	go run ./bench            # at most 3 minutes on a 2-core machine (runBudget)
//	go run ./bench -quick     # at most 20 seconds (quickBudget)
//	go run ./bench -only=NAME # one named section (-h lists them)
//
// Both runs print their wall time at the end, section by section, and say
// when it went over its budget. A section that needs more time runs only
// by name.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
)

// The wall-time budgets of a run on a 2-core machine: every section that
// needs more runs only by name (-only).
const (
	runBudget   = 3 * time.Minute
	quickBudget = 20 * time.Second
)

type config struct {
	quick       bool
	duration    time.Duration // per throughput cell
	accDuration time.Duration // per accuracy hammer
	goroutines  []int
	resources   []int
	threshold   int64
	window      time.Duration
	accG        int
	memN        int
	out         string
	progress    bool
	only        string        // a named section to run alone
	soak        time.Duration // the reload soak's length
}

func defaultGoroutines() []int {
	var gs []int
	for g := 1; g <= 4*runtime.GOMAXPROCS(0); g *= 2 {
		gs = append(gs, g)
	}
	if gs[len(gs)-1] < 256 {
		gs = append(gs, 256)
	}
	return gs
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("bench: -goroutines wants positive integers, got %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := config{resources: []int{1, 1000}, window: time.Second}
	var gs string
	fs.BoolVar(&c.quick, "quick", false, "short run (under 20 s): fewer goroutine counts, shorter cells")
	fs.DurationVar(&c.duration, "duration", 0, "time per throughput cell (default 150ms, 25ms with -quick)")
	fs.DurationVar(&c.accDuration, "accuracy-duration", 0, "time per accuracy hammer (default 2s, 250ms with -quick)")
	fs.StringVar(&gs, "goroutines", "", "comma-separated goroutine counts (default 1, 2, 4, ... 4 x GOMAXPROCS, 256)")
	fs.Int64Var(&c.threshold, "threshold", 1000, "admissions per window in the accuracy runs")
	fs.IntVar(&c.accG, "accuracy-goroutines", 64, "goroutines of the accuracy hammer")
	fs.StringVar(&c.out, "out", "bench-out", "folder for the report and charts")
	fs.BoolVar(&c.progress, "progress", true, "show a progress bar on stderr")
	fs.StringVar(&c.only, "only", "", "run only the named section, printing its tables; one of:"+sectionNames())
	fs.DurationVar(&c.soak, "soak", time.Minute, "how long -only=perkey-reload-soak runs")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.threshold < 1 {
		return c, fmt.Errorf("bench: -threshold must be >= 1, got %d", c.threshold)
	}
	c.memN = 100_000
	switch {
	case gs != "":
		g, err := parseInts(gs)
		if err != nil {
			return c, err
		}
		c.goroutines = g
	case c.quick:
		c.goroutines = []int{1, runtime.GOMAXPROCS(0), 256}
		if runtime.GOMAXPROCS(0) == 1 {
			c.goroutines = []int{1, 256}
		}
	default:
		c.goroutines = defaultGoroutines()
	}
	if c.duration == 0 {
		c.duration = 150 * time.Millisecond
		if c.quick {
			c.duration = 25 * time.Millisecond
		}
	}
	if c.accDuration == 0 {
		c.accDuration = 2 * time.Second
		if c.quick {
			c.accDuration = 250 * time.Millisecond
		}
	}
	if c.quick {
		c.memN = 10_000
	}
	return c, nil
}

func main() {
	if c := os.Getenv(outageChildEnv); c != "" {
		if err := runOutageChild(c); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err == flag.ErrHelp {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	run := run
	if cfg.only != "" {
		run = func(cfg config, stdout, _ io.Writer) error { return runOnly(cfg, stdout) }
	}
	if err := run(cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// report is everything one run measured.
type report struct {
	cfg        config
	started    time.Time
	throughput []result
	accuracy   []accuracy
	precision  []precisionRow
	memory     []memResult
	global     []globalResult
	globalAcc  *globalAccuracy
	globalNote string
	saturation []saturationResult
	perKey     []perKeyResult
	perKeyMem  []perKeyMem
	perKeyAcc  []perKeyAcc
	middleware []mwResult
	gcra       gcraResult
	kinds      []kindCost
	took       []timed // each section's wall time
}

func run(cfg config, stdout, stderr io.Writer) error {
	rep := &report{cfg: cfg, started: time.Now()}
	steps := len(impls)*len(cfg.goroutines)*len(cfg.resources) + 3*len(accLimiters) + 2*len(precisionBuckets) + len(memCases) + 3*len(cfg.goroutines) + 2 + 2*len(keyLimiters)*(len(perKeyGoroutines)+1) + mwCaseCount*len(mwGoroutines()) + gcraSteps() + kindSteps()
	var bar *progressbar.ProgressBar
	tick := func(desc string) {}
	if cfg.progress {
		bar = progressbar.NewOptions(steps, progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("leapflow bench"), progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30), progressbar.OptionClearOnFinish())
		tick = func(desc string) {
			bar.Describe(desc)
			_ = bar.Add(1)
		}
	}
	rep.section("throughput", func() {
		for _, n := range cfg.resources {
			for _, im := range impls {
				o, cleanup := im.setup(n)
				for _, g := range cfg.goroutines {
					tick(fmt.Sprintf("%s x%d g=%d", im.name, n, g))
					ns, allocs, ops := measure(o, g, cfg.duration)
					rep.throughput = append(rep.throughput, result{impl: im.name, resources: n, goroutines: g, nsPerOp: ns, allocs: allocs, ops: ops})
				}
				cleanup()
			}
		}
	})
	rep.section("accuracy", func() {
		for _, l := range accLimiters {
			tick("accuracy " + l.name)
			rep.accuracy = append(rep.accuracy, boundary(l, cfg.threshold, cfg.window))
			tick("accuracy " + l.name)
			rep.accuracy = append(rep.accuracy, greedy(l, cfg.threshold, cfg.window))
			tick("accuracy " + l.name)
			rep.accuracy = append(rep.accuracy, hammerAccuracy(l, cfg.threshold, cfg.window, cfg.accG, cfg.accDuration))
		}
	})
	rep.section("precision", func() { rep.precision = precisionSection(cfg, tick) })
	rep.section("memory", func() {
		for _, c := range memCases {
			tick("memory " + c.name)
			rep.memory = append(rep.memory, measureMemory(c, cfg.memN))
		}
	})
	rep.section("saturation", func() {
		tick("saturated CPU")
		rep.saturation = saturation(cfg)
	})
	rep.section("perkey", func() { rep.perKey, rep.perKeyMem, rep.perKeyAcc = perKeySection(cfg, tick) })
	rep.section("middleware", func() { rep.middleware = middlewareSection(cfg, tick) })
	rep.section("global", func() { rep.global, rep.globalAcc, rep.globalNote = globalSection(cfg, tick) })
	rep.section("gcra", func() { rep.gcra = gcraSection(cfg, tick) })
	rep.section("kinds", func() { rep.kinds = kindsSection(cfg, tick) })
	if bar != nil {
		_ = bar.Finish()
	}
	rep.printTables(stdout)
	if err := rep.write(cfg.out); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nReport and charts in %s/ (report.md, throughput-*.svg, accuracy.svg)\n", cfg.out)
	took, budget := time.Since(rep.started), runBudget
	if cfg.quick {
		budget = quickBudget
	}
	fmt.Fprintf(stdout, "Wall time %v (%s)\n", took.Round(time.Second), rep.times())
	if took > budget {
		fmt.Fprintf(stdout, "Over the budget of %v: a busy machine, or a section to run only by name\n", budget)
	}
	return nil
}

// section runs one section of the report, timing it.
func (r *report) section(name string, fn func()) {
	start := time.Now()
	fn()
	r.took = append(r.took, timed{name, time.Since(start)})
}

// times lists each section's time.
func (r *report) times() string {
	var parts []string
	for _, t := range r.took {
		parts = append(parts, fmt.Sprintf("%s %.1fs", t.name, t.d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

type timed struct {
	name string
	d    time.Duration
}
