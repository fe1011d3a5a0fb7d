package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

func scenarioName(n int) string {
	if n == 1 {
		return "one hot resource"
	}
	return fmt.Sprintf("%d resources", n)
}

// cell returns the result of impl at (resources, goroutines).
func (r *report) cell(impl string, n, g int) (result, bool) {
	for _, x := range r.throughput {
		if x.impl == impl && x.resources == n && x.goroutines == g {
			return x, true
		}
	}
	return result{}, false
}

// ratio is how many times slower than leapflow's pass path impl is.
func (r *report) ratio(x result) float64 {
	base, ok := r.cell("leapflow", x.resources, x.goroutines)
	if !ok || base.nsPerOp == 0 {
		return 0
	}
	return x.nsPerOp / base.nsPerOp
}

func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func (r *report) machine() string {
	return fmt.Sprintf("%s, %d CPUs, GOMAXPROCS %d, %s %s/%s", cpuModel(), runtime.NumCPU(), runtime.GOMAXPROCS(0),
		runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

func (r *report) printTables(w io.Writer) {
	fmt.Fprintf(w, "leapflow bench — %s\n", r.machine())
	for _, n := range r.cfg.resources {
		fmt.Fprintf(w, "\nThroughput, %s: ns/op for the whole machine (x = times slower than leapflow)\n", scenarioName(n))
		header := []string{"impl"}
		for _, g := range r.cfg.goroutines {
			header = append(header, fmt.Sprintf("g=%d", g))
		}
		var rows [][]string
		for _, im := range impls {
			row := []string{im.name}
			var allocs float64
			for _, g := range r.cfg.goroutines {
				x, _ := r.cell(im.name, n, g)
				row = append(row, fmt.Sprintf("%.1f (x%.1f)", x.nsPerOp, r.ratio(x)))
				allocs = max(allocs, x.allocs)
			}
			rows = append(rows, append(row, fmt.Sprintf("%.2f", allocs)))
		}
		table(w, false, append(header, "allocs/op"), rows)
	}
	fmt.Fprintf(w, "\nAccuracy: threshold %d per %v; spans are continuous, 'own' is the limiter's own windows\n", r.cfg.threshold, r.cfg.window)
	var rows [][]string
	for _, a := range r.accuracy {
		own := "-"
		if a.maxOwn >= 0 {
			own = fmt.Sprint(a.maxOwn)
		}
		rows = append(rows, []string{a.limiter, a.scenario, fmt.Sprint(a.total), a.rate(), own, fmt.Sprint(a.maxHalf), fmt.Sprint(a.maxShort), fmt.Sprint(a.maxFull), fmt.Sprint(a.over())})
	}
	table(w, false, []string{"limiter", "scenario", "admitted", "per W", "max own", "max W/2", "max W-W/n", "max W", "over T"}, rows)
	writePrecision(w, false, r.cfg.threshold, r.cfg.window, r.cfg.accG, r.precision)
	fmt.Fprintf(w, "\nSaturated CPU: busy goroutines hammer one rule of %d/s while one more sleeps 5 ms in a loop\n", r.cfg.threshold)
	table(w, false, saturationHeader, r.saturationRows())
	fmt.Fprintf(w, "\nGlobal limit on Redis (one hot rule; ns/op for the whole machine, Redis round trips per decision)\n")
	if r.globalNote != "" {
		fmt.Fprintln(w, r.globalNote)
	} else {
		table(w, false, []string{"impl", "g", "ns/op", "calls/decision"}, r.globalRows())
		if a := r.globalAcc; a != nil {
			fmt.Fprintf(w, "%d instances, threshold %d/s: admitted %d, fullest server window %d, %d round trips (%.4f per admission), %d fallbacks\n",
				a.instances, a.threshold, a.admitted, a.fullest, a.calls, float64(a.calls)/float64(max(a.admitted, 1)), a.fallbacks)
		}
	}
	r.gcraTables(w, false)
	r.kindsTables(w, false)
	r.perKeyTables(w, false)
	r.middlewareTables(w, false)
	fmt.Fprintf(w, "\nMemory: bytes per limiter, over %d of them\n", r.cfg.memN)
	table(w, false, []string{"limiter", "bytes", "what"}, r.memoryRows())
}

var saturationHeader = []string{"clock", "goroutines", "seconds", "of which starting them", "admitted", "clock behind, at worst"}

func (r *report) saturationRows() [][]string {
	var rows [][]string
	for _, x := range r.saturation {
		rows = append(rows, []string{x.clock, fmt.Sprint(x.goroutines), fmt.Sprintf("%.1f", x.duration.Seconds()),
			x.startup.Round(time.Millisecond).String(), fmt.Sprint(x.admitted), x.maxLag.Round(time.Millisecond).String()})
	}
	return rows
}

func (r *report) globalRows() [][]string {
	var rows [][]string
	for _, x := range r.global {
		rows = append(rows, []string{x.impl, fmt.Sprint(x.goroutines), fmt.Sprintf("%.1f", x.nsPerOp), fmt.Sprintf("%.5f", x.callsPerOp)})
	}
	return rows
}

func (r *report) memoryRows() [][]string {
	var rows [][]string
	for _, m := range r.memory {
		rows = append(rows, []string{m.name, fmt.Sprintf("%.0f", m.bytes), m.note})
	}
	return rows
}

func (r *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var md strings.Builder
	r.markdown(&md)
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(md.String()), 0o644); err != nil {
		return err
	}
	for _, n := range r.cfg.resources {
		if err := r.writeSVG(filepath.Join(dir, fmt.Sprintf("throughput-%d.svg", n)), func(w io.Writer) error {
			xs := make([]string, len(r.cfg.goroutines))
			for i, g := range r.cfg.goroutines {
				xs[i] = fmt.Sprint(g)
			}
			var ss []series
			for _, im := range impls {
				s := series{name: im.name}
				for _, g := range r.cfg.goroutines {
					x, _ := r.cell(im.name, n, g)
					s.points = append(s.points, x.mops())
				}
				ss = append(ss, s)
			}
			return lineChart(w, "Throughput, "+scenarioName(n)+" (higher is better)", "Mops/s, whole machine (log)", xs, ss)
		}); err != nil {
			return err
		}
	}
	return r.writeSVG(filepath.Join(dir, "accuracy.svg"), func(w io.Writer) error {
		var cats []string
		for _, l := range accLimiters {
			cats = append(cats, l.name)
		}
		var ss []series
		for _, sc := range []struct {
			name, scenario string
			pick           func(accuracy) int64
		}{
			{"boundary: max in W", "boundary", func(a accuracy) int64 { return a.maxFull }},
			{"hammer: max in W - W/n", "hammer", func(a accuracy) int64 { return a.maxShort }},
			{"hammer: max in W", "hammer", func(a accuracy) int64 { return a.maxFull }},
		} {
			s := series{name: sc.name}
			for _, l := range accLimiters {
				for _, a := range r.accuracy {
					if a.limiter == l.name && a.scenario == sc.scenario {
						s.points = append(s.points, float64(sc.pick(a)))
					}
				}
			}
			ss = append(ss, s)
		}
		return barChart(w, fmt.Sprintf("Most admitted in any continuous span (n = %d; lower is stricter)", leapflowBuckets), "admissions", cats, ss,
			float64(r.cfg.threshold), fmt.Sprintf("threshold %d", r.cfg.threshold))
	})
}

func (r *report) writeSVG(path string, draw func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := draw(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func (r *report) markdown(w io.Writer) {
	c := r.cfg
	fmt.Fprintf(w, "# leapflow bench report\n\n")
	fmt.Fprintf(w, "- Machine: %s\n- Run: %s, %v per throughput cell, accuracy hammer %v with %d goroutines\n- Command: `go run ./bench%s`\n\n",
		r.machine(), r.started.UTC().Format(time.RFC3339), c.duration, c.accDuration, c.accG, map[bool]string{true: " -quick"}[c.quick])
	fmt.Fprintf(w, "## Throughput\n\n")
	fmt.Fprintf(w, "ns/op is wall time over operations for the whole machine (lower is better); "+
		"the factor is how many times slower than leapflow's pass path (Entry+Exit) at the same goroutine count.\n\n")
	for _, im := range impls {
		fmt.Fprintf(w, "- **%s**: %s\n", im.name, im.note)
	}
	for _, n := range c.resources {
		fmt.Fprintf(w, "\n### %s\n\n![throughput](throughput-%d.svg)\n\n| impl |", scenarioName(n), n)
		for _, g := range c.goroutines {
			fmt.Fprintf(w, " g=%d |", g)
		}
		fmt.Fprint(w, " allocs/op |\n|---|")
		for range c.goroutines {
			fmt.Fprint(w, "---:|")
		}
		fmt.Fprint(w, "---:|\n")
		for _, im := range impls {
			fmt.Fprintf(w, "| %s |", im.name)
			var allocs float64
			for _, g := range c.goroutines {
				x, _ := r.cell(im.name, n, g)
				fmt.Fprintf(w, " %.1f ns (x%.1f, %.1f Mops/s) |", x.nsPerOp, r.ratio(x), x.mops())
				allocs = max(allocs, x.allocs)
			}
			fmt.Fprintf(w, " %.2f |\n", allocs)
		}
	}
	fmt.Fprintf(w, "\n## Accuracy\n\nThreshold %d per window W = %v. Scenarios: **boundary** — the seeds' example on a fake clock, "+
		"%d requests at 1.9 W then %d at 2.0 W; **greedy** — a fake clock ticking every millisecond for 3 W, asking until refused; "+
		"**hammer** — %d goroutines on the real clock for %v. Columns: admissions in total, the most in any of the limiter's own windows "+
		"(`-` for limiters without windows), the rate admitted per W (greedy: the steady rate, greedy callers every millisecond for 220 W counted after the first 20; hammer: over the run; `-` for the boundary's two bursts), the most in any continuous span of W/2, W - W/n (n = %d, leapflow's buckets) and W, "+
		"and over-admission against the threshold (the larger of own-window and span-W excess).\n\n",
		c.threshold, c.window, c.threshold, c.threshold, c.accG, c.accDuration, leapflowBuckets)
	fmt.Fprintf(w, "![accuracy](accuracy.svg)\n\n| limiter | scenario | admitted | per W | max own window | max W/2 | max W-W/n | max W | over T |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, a := range r.accuracy {
		own := "-"
		if a.maxOwn >= 0 {
			own = fmt.Sprint(a.maxOwn)
		}
		fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %d | %d | %d | %d |\n", a.limiter, a.scenario, a.total, a.rate(), own, a.maxHalf, a.maxShort, a.maxFull, a.over())
	}
	writePrecision(w, true, c.threshold, c.window, c.accG, r.precision)
	fmt.Fprintf(w, "\n## Saturated CPU\n\nBusy goroutines outnumbering the cores hammer one rule of %d/s through a flow.Resource "+
		"while one more goroutine sleeps 5 ms in a loop (every service has timers). A clock advanced only by a ticker goroutine "+
		"falls behind here, because the ticker waits behind every busy goroutine; the default clock is also refreshed by its "+
		"readers. The monotonic clock is the reference. *Clock behind* is the engine clock's worst lag behind real time, "+
		"sampled every 10 ms by a goroutine that is itself delayed by the load. *Seconds* run from before the first busy goroutine "+
		"starts (starting them is part of the load).\n\n", c.threshold)
	table(w, true, saturationHeader, r.saturationRows())
	fmt.Fprintf(w, "\n## Global limit on Redis\n\n")
	if r.globalNote != "" {
		fmt.Fprintf(w, "%s\n", r.globalNote)
	} else {
		fmt.Fprintf(w, "One hot rule through a flow.Resource, well below its limit, against a local redis-server the bench starts: "+
			"the same rule kept local, global with leasing (default options), and global with one round trip per request. "+
			"ns/op is for the whole machine; calls/decision is Redis round trips per Entry.\n\n")
		table(w, true, []string{"impl", "goroutines", "ns/op", "calls/decision"}, r.globalRows())
		if a := r.globalAcc; a != nil {
			fmt.Fprintf(w, "\n%d instances (engines with their own clients), %d goroutines in all, one global rule of %d/s for %v: "+
				"admitted %d; the fullest server window held %d (threshold %d); %d round trips (%.4f per admission); %d fallbacks.\n",
				a.instances, c.accG, a.threshold, c.accDuration, a.admitted, a.fullest, a.threshold, a.calls, float64(a.calls)/float64(max(a.admitted, 1)), a.fallbacks)
		}
	}
	r.gcraTables(w, true)
	r.kindsTables(w, true)
	r.perKeyTables(w, true)
	r.middlewareTables(w, true)
	fmt.Fprintf(w, "\n## Memory\n\nHeap bytes per limiter, measured with runtime.MemStats over %d of them.\n\n", c.memN)
	table(w, true, []string{"limiter", "bytes", "what"}, r.memoryRows())
}
