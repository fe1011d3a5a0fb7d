package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/stat"
)

// precisionBuckets are the bucket counts of the precision-against-slots
// table (the seeds' table, measured): each divides 1 s into whole
// nanoseconds.
var precisionBuckets = []int{1, 2, 4, 5, 10, 20, 50}

// precisionRow is one bucket count and variant (plain or span-exact).
type precisionRow struct {
	buckets   int
	spanExact bool
	// Most admitted in any continuous W and W - W/n: in the boundary
	// scenario and under the hammer.
	boundaryFull, hammerFull, hammerShort int64
	// steady is the admitted count per W under saturation (greedy, on a
	// fake clock, after the first windows).
	steady float64
	// bytes per resource with the rule, after one Entry; ns per Entry+Exit
	// at 1 goroutine and at GOMAXPROCS.
	bytes      float64
	ns1, nsMax float64
}

// precisionLimiter is leapflow with n buckets, plain or span-exact.
func precisionLimiter(n int, spanExact bool) accLimiter {
	name := fmt.Sprintf("leapflow n=%d", n)
	if spanExact {
		name += " span-exact"
	}
	return accLimiter{name: name, make: func(t int64, w time.Duration, clock func() int64, _ func(time.Duration)) func(int64) (bool, int64) {
		eng, err := flow.New(flow.WithClock(funcClock(clock)), flow.WithSampleCount(n), flow.WithSpanBuckets(n))
		if err != nil {
			panic(err)
		}
		if err := eng.LoadRules([]flow.Rule{{Resource: "r", Threshold: float64(t) * float64(time.Second) / float64(w), SpanExact: spanExact}}); err != nil {
			panic(err)
		}
		return func(int64) (bool, int64) {
			en, err := eng.Entry("r")
			if err != nil {
				return false, 0
			}
			en.Exit(nil)
			return true, en.Start()
		}
	}}
}

// steadyRate asks every millisecond for 220 W, as many times as admitted,
// and returns what was admitted per W after the first 20.
func steadyRate(l accLimiter, threshold int64, w time.Duration) float64 {
	c := &fakeClock{}
	allow := l.make(threshold, w, c.read, c.sleep)
	var admitted int64
	from, end := int64(20*w), int64(220*w)
	for tick := int64(0); tick < end; tick += int64(time.Millisecond) {
		c.set(tick)
		for range 2*threshold + 1 {
			ok, at := allow(c.read())
			if ok && at >= from && at < end {
				admitted++
			}
			if !ok || at >= tick+int64(time.Millisecond) {
				break // refused, or a pacer slept past this tick
			}
		}
	}
	return float64(admitted) / 200
}

// precisionSection measures the table: for each bucket count, plain then
// span-exact.
func precisionSection(cfg config, tick func(string)) []precisionRow {
	var rows []precisionRow
	buckets := precisionBuckets
	if cfg.quick {
		buckets = []int{1, 4, 10}
	}
	for _, n := range buckets {
		for _, span := range []bool{false, true} {
			l := precisionLimiter(n, span)
			tick("precision " + l.name)
			W := int64(cfg.window)
			short := W - W/int64(n)
			r := precisionRow{buckets: n, spanExact: span}
			b := boundary(l, cfg.threshold, cfg.window)
			r.boundaryFull = b.maxFull
			h := steppedHammer(l, cfg.threshold, cfg.window, cfg.accG)
			r.hammerFull = maxSpan(h, W)
			if short > 0 {
				r.hammerShort = maxSpan(h, short)
			}
			r.steady = steadyRate(l, cfg.threshold, cfg.window)
			r.bytes = precisionBytes(n, span, cfg.memN/10)
			r.ns1 = entryExitNs(n, span, 1, cfg.duration)
			r.nsMax = entryExitNs(n, span, runtime.GOMAXPROCS(0), cfg.duration)
			rows = append(rows, r)
		}
	}
	return rows
}

// steppedHammer runs g goroutines against a fresh limiter on a shared
// clock that each of them moves a random 0-40 µs before every request,
// through 4 W: the hammer's contention and interleavings over many
// windows in a fraction of the real time, every bucket edge crossed by
// callers racing on both sides of it. It returns the admission instants,
// sorted.
func steppedHammer(l accLimiter, threshold int64, w time.Duration, g int) []int64 {
	var now atomic.Int64
	allow := l.make(threshold, w, now.Load, func(d time.Duration) { now.Add(int64(d)) })
	per := make([][]int64, g)
	end := int64(4 * w)
	var wg sync.WaitGroup
	for i := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 1))
			for {
				t := now.Add(r.Int64N(int64(40 * time.Microsecond)))
				if t >= end {
					return
				}
				if ok, at := allow(t); ok {
					per[i] = append(per[i], at)
				}
			}
		}()
	}
	wg.Wait()
	var ts []int64
	for _, p := range per {
		ts = append(ts, p...)
	}
	slices.Sort(ts)
	return ts
}

// precisionBytes is the heap per resource with the rule, after an
// Entry+Exit on each in every bucket of a window and one more (every
// bucket made).
func precisionBytes(n int, spanExact bool, k int) float64 {
	before := heap()
	var now atomic.Int64
	eng, err := flow.New(flow.WithSampleCount(n), flow.WithSpanBuckets(n), flow.WithMaxResources(k+1), flow.WithClock(funcClock(now.Load)))
	if err != nil {
		panic(err)
	}
	res := names(k)
	rules := make([]flow.Rule, k)
	for i, r := range res {
		rules[i] = flow.Rule{Resource: r, Threshold: 100, SpanExact: spanExact}
	}
	if err := eng.LoadRules(rules); err != nil {
		panic(err)
	}
	for range n + 1 {
		for _, r := range res {
			if en, err := eng.Entry(r); err == nil {
				en.Exit(nil)
			}
		}
		now.Add(int64(time.Second) / int64(n))
	}
	after := heap()
	runtime.KeepAlive(eng)
	return float64(int64(after)-int64(before)) / float64(k)
}

// entryExitNs is Entry+Exit on one resource whose rule never blocks, ns
// per call for the whole machine.
func entryExitNs(n int, spanExact bool, g int, d time.Duration) float64 {
	eng, err := flow.New(flow.WithSampleCount(n), flow.WithSpanBuckets(n), flow.WithClock(stat.NewMonotonic()))
	if err != nil {
		panic(err)
	}
	if err := eng.LoadRules([]flow.Rule{{Resource: "r", Threshold: hugeLimit, SpanExact: spanExact}}); err != nil {
		panic(err)
	}
	r, err := eng.Resource("r")
	if err != nil {
		panic(err)
	}
	ns, _, _ := measure(func(int, int) {
		en, err := r.Entry()
		if err != nil {
			panic(err)
		}
		en.Exit(nil)
	}, g, d)
	return ns
}

// writePrecision writes the table in markdown.
func writePrecision(w io.Writer, md bool, threshold int64, window time.Duration, g int, rows []precisionRow) {
	if md {
		fmt.Fprintf(w, "\n## Precision against buckets\n\nThe seeds' table of precision against the number of slots, measured: "+
			"threshold %d per W = %v; *boundary* is the seeds' example (T at 0.9 W, T at 1.0 W); the hammer is %d goroutines on a shared clock "+
			"that each moves a random 0-40 µs before every request, through 4 W (every bucket edge crossed by callers racing on both sides of it); "+
			"*steady* is what greedy callers get per W under saturation; bytes are per resource with the rule, every bucket made (%d CPU stripes per bucket on this machine); "+
			"ns/op is Entry+Exit on a rule that never blocks, on the monotonic clock, at 1 goroutine and at GOMAXPROCS.\n\n", threshold, window, g, cpu.Stripes())
	} else {
		fmt.Fprintf(w, "\nPrecision against buckets: threshold %d per W = %v\n", threshold, window)
	}
	var cells [][]string
	for _, r := range rows {
		v := "plain"
		if r.spanExact {
			v = "span-exact"
		}
		short := "-"
		if r.buckets > 1 {
			short = strconv.FormatInt(r.hammerShort, 10)
		}
		cells = append(cells, []string{fmt.Sprint(r.buckets), v, fmt.Sprint(r.boundaryFull), fmt.Sprint(r.hammerFull), short,
			fmt.Sprintf("%.0f", r.steady), fmt.Sprintf("%.0f", r.bytes), fmt.Sprintf("%.1f", r.ns1), fmt.Sprintf("%.1f", r.nsMax)})
	}
	table(w, md, []string{"buckets", "variant", "boundary: most in W", "hammer: most in W", "hammer: most in W - W/n", "steady per W", "bytes", "ns/op g=1", "ns/op g=max"}, cells)
}

// rate is the steady rate column: admitted per W, or "-".
func (a accuracy) rate() string {
	if a.perW == 0 {
		return "-"
	}
	return strconv.FormatFloat(a.perW, 'f', 0, 64)
}
