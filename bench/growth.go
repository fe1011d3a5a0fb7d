package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/time/rate"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
)

// The growth section: what one request costs as the work grows, on one
// goroutine: resources (round-robin through their handles), distinct
// windows on one resource, keys of a PerKey rule (uniform), beside the
// peers where they have a counterpart.

// growthRow is one size of one dimension: leapflow's cost, and each
// peer's.
type growthRow struct {
	dim, size string
	impls     []string
	ns, alloc []float64
}

// growthSizes are the sizes measured; -quick measures smaller ones.
func growthSizes(quick bool) (resources, windows, keys []int) {
	if quick {
		return []int{1, 100, 1000}, []int{1, 4, 16}, []int{1000, 10_000}
	}
	return []int{1, 100, 10_000}, []int{1, 4, 16}, []int{1000, 100_000, 1_000_000}
}

func growthSection(cfg config, w io.Writer) error {
	d := cfg.duration
	if d == 0 {
		d = 150 * time.Millisecond
	}
	resources, windows, keys := growthSizes(cfg.quick)
	var rows []growthRow
	for _, n := range resources {
		r := growthRow{dim: "resources", size: fmt.Sprint(n)}
		handles := growthResources(n)
		ns, allocs, _ := measure(func(_, i int) {
			en, err := handles[i%n].Entry()
			if err != nil {
				panic(err)
			}
			en.Exit(nil)
		}, 1, d)
		r.add("leapflow", ns, allocs)
		lims := make([]*rate.Limiter, n)
		for i := range lims {
			lims[i] = rate.NewLimiter(rate.Inf, 1)
		}
		ns, allocs, _ = measure(func(_, i int) { lims[i%n].Allow() }, 1, d)
		r.add("x/time/rate", ns, allocs)
		rows = append(rows, r)
	}
	for _, n := range windows {
		r := growthRow{dim: "windows", size: fmt.Sprint(n)}
		h := growthWindows(n)
		ns, allocs, _ := measure(func(int, int) {
			en, err := h.Entry()
			if err != nil {
				panic(err)
			}
			en.Exit(nil)
		}, 1, d)
		r.add("leapflow", ns, allocs)
		rows = append(rows, r)
	}
	for _, n := range keys {
		r := growthRow{dim: "keys", size: fmt.Sprint(n)}
		s := uniformStream(n)
		for _, l := range keyLimiters {
			if l.name != "leapflow" && l.name != "sethvargo/go-limiter" && l.name != "map+x/time/rate" {
				continue
			}
			take, closeFn := l.make(hugeKeyRate, n)
			for _, k := range s.distinct { // every key tracked before the run
				take(k)
			}
			ns, allocs, _ := measure(func(_, i int) { take(s.keys[i&(len(s.keys)-1)]) }, 1, d)
			closeFn()
			r.add(l.name, ns, allocs)
		}
		rows = append(rows, r)
	}
	fmt.Fprintf(w, "Growth: one request's cost on one goroutine as the work grows (ns/op, allocs/op), GOMAXPROCS %d\n\n", runtime.GOMAXPROCS(0))
	printed(w, []string{"grows", "size", "leapflow", "x/time/rate", "sethvargo/go-limiter", "map+x/time/rate"}, func(row func(...string)) {
		for _, r := range rows {
			cells := []string{r.dim, r.size}
			for _, name := range []string{"leapflow", "x/time/rate", "sethvargo/go-limiter", "map+x/time/rate"} {
				cells = append(cells, r.cell(name))
			}
			row(cells...)
		}
	})
	if err := growthChart(cfg.out, rows); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nChart in %s/growth.svg\n", cfg.out)
	return nil
}

func (r *growthRow) add(impl string, ns, allocs float64) {
	r.impls, r.ns, r.alloc = append(r.impls, impl), append(r.ns, ns), append(r.alloc, allocs)
}

// cell is impl's figure in the row, "-" without one.
func (r *growthRow) cell(impl string) string {
	for i, name := range r.impls {
		if name == impl {
			return fmt.Sprintf("%.0f (%.1f)", r.ns[i], r.alloc[i])
		}
	}
	return "-"
}

// growthResources returns handles of n resources, each under a QPS rule
// no request reaches.
func growthResources(n int) []*flow.Resource {
	e, err := flow.New(flow.WithClock(stat.DefaultClock()), flow.WithMaxResources(n))
	if err != nil {
		panic(err)
	}
	rules := make([]flow.Rule, n)
	for i := range rules {
		rules[i] = flow.Rule{Resource: fmt.Sprintf("r%05d", i), Threshold: 1e12}
	}
	if err := e.LoadRules(rules); err != nil {
		panic(err)
	}
	hs := make([]*flow.Resource, n)
	for i := range hs {
		if hs[i], err = e.Resource(rules[i].Resource); err != nil {
			panic(err)
		}
	}
	return hs
}

// growthWindows returns the handle of a resource with n QPS rules on
// distinct windows (1 s to n s).
func growthWindows(n int) *flow.Resource {
	e, err := flow.New(flow.WithClock(stat.DefaultClock()))
	if err != nil {
		panic(err)
	}
	var rules []flow.Rule
	for i := range n {
		rules = append(rules, flow.Rule{Resource: "api", Threshold: 1e12, StatInterval: time.Duration(i+1) * time.Second})
	}
	if err := e.LoadRules(rules); err != nil {
		panic(err)
	}
	h, err := e.Resource("api")
	if err != nil {
		panic(err)
	}
	return h
}

// growthChart draws every row's ns/op, by implementation.
func growthChart(dir string, rows []growthRow) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	names := []string{"leapflow", "x/time/rate", "sethvargo/go-limiter", "map+x/time/rate"}
	var cats []string
	ss := make([]series, len(names))
	for i, n := range names {
		ss[i].name = n
	}
	for _, r := range rows {
		cats = append(cats, r.dim+" "+r.size)
		for i, n := range names {
			v := 0.0
			for j, impl := range r.impls {
				if impl == n {
					v = r.ns[j]
				}
			}
			ss[i].points = append(ss[i].points, v)
		}
	}
	var b bytes.Buffer
	if err := barChart(&b, "Growth: ns per request as resources, windows and keys grow (lower is better)", "ns/op, 1 goroutine", cats, ss, 0, ""); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "growth.svg"), b.Bytes(), 0o644)
}
