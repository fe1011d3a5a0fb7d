package main

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/leapflow/leapflow/flow"
)

// The breaker section (-only=breaker) sets leapflow's circuit breaker
// (Rule.Breaker) beside sony/gobreaker/v2 on three questions: what a
// request costs while the breaker is closed, how many requests each lets
// through while half-open, and what a dead dependency costs before the
// breaker opens and after it heals. Both count in a rolling window where
// they can; both close after one good probe.

var errDead = errors.New("dependency down")

// tripOnFailure is gobreaker set as leapflow's ErrorCount 1 with a
// RetryTimeout of timeout: open on one failure, one probe after timeout.
func tripOnFailure(timeout time.Duration) gobreaker.Settings {
	return gobreaker.Settings{Timeout: timeout, MaxRequests: 1,
		ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 1 }}
}

// halfFailed is gobreaker's ReadyToTrip for leapflow's ErrorRatio 0.5
// with MinRequests 20.
func halfFailed(c gobreaker.Counts) bool {
	return c.Requests >= 20 && float64(c.TotalFailures) >= 0.5*float64(c.Requests)
}

// cbTarget is one breaker under test: enter asks to pass, and when it may,
// returns the function that reports the request's outcome.
type cbTarget struct {
	name   string
	enter  func() (exit func(error), ok bool)
	closed func() bool
}

// leapflowTarget is an engine of the default clock with one breaker rule
// on "dep", through a Resource handle.
func leapflowTarget(rule flow.Rule, opts ...flow.Option) cbTarget {
	eng, err := flow.New(opts...)
	if err != nil {
		panic(err)
	}
	rule.Resource = "dep"
	if err := eng.LoadRules([]flow.Rule{rule}); err != nil {
		panic(err)
	}
	r, err := eng.Resource("dep")
	if err != nil {
		panic(err)
	}
	return cbTarget{
		name: "leapflow",
		enter: func() (func(error), bool) {
			en, err := r.Entry()
			if err != nil {
				return nil, false
			}
			return en.Exit, true
		},
		closed: func() bool { return eng.Breakers()[0].State == flow.BreakerClosed },
	}
}

// gobreakerTarget is a two-step gobreaker (Allow, then done), the shape
// of an Entry and its Exit.
func gobreakerTarget(st gobreaker.Settings) cbTarget {
	cb := gobreaker.NewTwoStepCircuitBreaker[struct{}](st)
	return cbTarget{
		name: "gobreaker",
		enter: func() (func(error), bool) {
			done, err := cb.Allow()
			return done, err == nil
		},
		closed: func() bool { return cb.State() == gobreaker.StateClosed },
	}
}

func breakerSection(cfg config, w io.Writer) error {
	fmt.Fprintf(w, "Circuit breaking: leapflow (Rule.Breaker) against sony/gobreaker/v2 v2.4.0, GOMAXPROCS=%d\n\n", runtime.GOMAXPROCS(0))
	breakerPassPath(cfg, w)
	if err := breakerProbes(cfg, w); err != nil {
		return err
	}
	breakerHungProbe(w)
	breakerTripAndRecover(w)
	return nil
}

// breakerPassPath: a closed breaker's cost per request, nothing failing.
func breakerPassPath(cfg config, w io.Writer) {
	d := 2 * cfg.duration
	fmt.Fprintf(w, "1. The pass path: a closed breaker, every request a success (%v per cell)\n", d)
	fmt.Fprintln(w, "   leapflow: Entry+Exit through a Resource handle, one SlowRatio breaker rule (MaxRT 1 h, 10 s in 10 buckets), default clock")
	fmt.Fprintln(w, "   gobreaker Execute: Execute(func), failure-ratio ReadyToTrip, Interval 10 s in 1 s buckets; TwoStep: Allow, then done(nil)")
	eng, err := flow.New()
	if err != nil {
		panic(err)
	}
	if err := eng.LoadRules([]flow.Rule{{Resource: "dep", Breaker: flow.SlowRatio, Threshold: 0.5, MaxRT: time.Hour,
		MinRequests: 20, StatInterval: 10 * time.Second, Buckets: 10, RetryTimeout: time.Second}}); err != nil {
		panic(err)
	}
	r, err := eng.Resource("dep")
	if err != nil {
		panic(err)
	}
	st := gobreaker.Settings{Name: "dep", Interval: 10 * time.Second, BucketPeriod: time.Second, Timeout: time.Second,
		ReadyToTrip: halfFailed}
	cb := gobreaker.NewCircuitBreaker[struct{}](st)
	two := gobreaker.NewTwoStepCircuitBreaker[struct{}](st)
	ok := func() (struct{}, error) { return struct{}{}, nil }
	ops := []struct {
		name string
		o    op
	}{
		{"leapflow", func(int, int) {
			if en, err := r.Entry(); err == nil {
				en.Exit(nil)
			}
		}},
		{"gobreaker Execute", func(int, int) { _, _ = cb.Execute(ok) }},
		{"gobreaker TwoStep", func(int, int) {
			if done, err := two.Allow(); err == nil {
				done(nil)
			}
		}},
	}
	printed(w, []string{"breaker", "goroutines", "ns/op", "allocs/op"}, func(row func(...string)) {
		for _, o := range ops {
			measure(o.o, 1, d/4) // warm up
			for _, g := range []int{1, 2, 8, 256} {
				ns, allocs, _ := measure(o.o, g, d)
				row(o.name, strconv.Itoa(g), fmt.Sprintf("%.1f", ns), fmt.Sprintf("%.2f", allocs))
			}
		}
	})
	fmt.Fprintln(w)
}

// probeGoroutines are the counts of the probe hammer.
var probeGoroutines = []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

// breakerProbes: each half-open period, every goroutine asks to pass for
// 3 ms while whatever was admitted holds on; then the admitted fail, which
// opens the breaker again for the next period.
func breakerProbes(cfg config, w io.Writer) error {
	const retry = 20 * time.Millisecond
	periods := 10
	if cfg.quick {
		periods = 3
	}
	fmt.Fprintf(w, "2. Requests admitted per half-open period: %d periods per count, all goroutines asking for 3 ms from the moment the retry timeout (%v) ends\n", periods, retry)
	fmt.Fprintln(w, "   leapflow: ErrorCount 1, RetryTimeout 20 ms; gobreaker: trips on 1 failure, Timeout 20 ms, MaxRequests 1 (one probe)")
	targets := []func() cbTarget{
		func() cbTarget {
			return leapflowTarget(flow.Rule{Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: retry, ProbeTimeout: time.Minute})
		},
		func() cbTarget {
			return gobreakerTarget(tripOnFailure(retry))
		},
	}
	var wrong []string
	printed(w, []string{"breaker", "goroutines", "periods", "fewest admitted", "most admitted", "refused"}, func(row func(...string)) {
		for _, mk := range targets {
			for _, g := range probeGoroutines {
				t := mk()
				if exit, ok := t.enter(); ok {
					exit(errDead) // trips it
				}
				fewest, most, refused := int64(1<<62), int64(0), int64(0)
				for range periods {
					time.Sleep(retry + 2*time.Millisecond)
					admitted, no := probePeriod(t, g, 3*time.Millisecond)
					fewest, most, refused = min(fewest, int64(len(admitted))), max(most, int64(len(admitted))), refused+no
					for _, exit := range admitted {
						exit(errDead)
					}
				}
				if t.name == "leapflow" && (fewest != 1 || most != 1) {
					wrong = append(wrong, fmt.Sprintf("%d goroutines: %d to %d probes", g, fewest, most))
				}
				row(t.name, strconv.Itoa(g), strconv.Itoa(periods), strconv.FormatInt(fewest, 10), strconv.FormatInt(most, 10), strconv.FormatInt(refused, 10))
			}
		}
	})
	fmt.Fprintln(w)
	if len(wrong) > 0 {
		return fmt.Errorf("bench: leapflow admitted other than one probe per half-open period: %v", wrong)
	}
	return nil
}

// probePeriod starts g goroutines together, each asking to pass for d, and
// returns the exits of those admitted (not called) and how many were
// refused.
func probePeriod(t cbTarget, g int, d time.Duration) ([]func(error), int64) {
	var mu sync.Mutex
	var admitted []func(error)
	var refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for end := time.Now().Add(d); time.Now().Before(end); {
				if exit, ok := t.enter(); ok {
					mu.Lock()
					admitted = append(admitted, exit)
					mu.Unlock()
				} else {
					refused.Add(1)
				}
				runtime.Gosched()
			}
		}()
	}
	close(start)
	wg.Wait()
	return admitted, refused.Load()
}

// breakerHungProbe: the first probe never returns (its caller hangs) while
// the dependency has healed; one caller asks every millisecond for a
// second, and what is admitted succeeds.
func breakerHungProbe(w io.Writer) {
	const retry, probeTimeout, span = 20 * time.Millisecond, 100 * time.Millisecond, time.Second
	fmt.Fprintf(w, "3. A probe that never returns, the dependency healed: one caller asking every 1 ms for %v after the probe went\n", span)
	fmt.Fprintf(w, "   leapflow: ProbeTimeout %v; gobreaker has no probe timeout\n", probeTimeout)
	targets := []cbTarget{
		leapflowTarget(flow.Rule{Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: retry, ProbeTimeout: probeTimeout}),
		gobreakerTarget(tripOnFailure(retry)),
	}
	printed(w, []string{"breaker", "admitted", "refused", "closed after"}, func(row func(...string)) {
		for _, t := range targets {
			if exit, ok := t.enter(); ok {
				exit(errDead)
			}
			time.Sleep(retry + 2*time.Millisecond)
			_, ok := t.enter() // the probe, never to return
			if !ok {
				row(t.name, "no probe", "", "")
				continue
			}
			start := time.Now()
			var admitted, refused int
			closedAfter := "never"
			for time.Since(start) < span {
				if exit, ok := t.enter(); ok {
					admitted++
					exit(nil)
				} else {
					refused++
				}
				if closedAfter == "never" && t.closed() {
					closedAfter = time.Since(start).Round(time.Millisecond).String()
				}
				time.Sleep(time.Millisecond)
			}
			row(t.name, strconv.Itoa(admitted), strconv.Itoa(refused), closedAfter)
		}
	})
	fmt.Fprintln(w)
}

// breakerTripAndRecover: 8 callers, each sending a request every 1 ms to a
// dependency that answers at once for 300 ms, then fails after 5 ms for
// 1 s (dead), then answers at once again (healed) for 500 ms; trials
// apart, since where the healing falls in the breaker's cycle decides how
// soon its next probe goes.
func breakerTripAndRecover(w io.Writer) {
	const healthy, dead, healed, callers, trials = 300 * time.Millisecond, time.Second, 500 * time.Millisecond, 8, 5
	fmt.Fprintf(w, "4. Trip and recover: %d callers, a request each per ms; the dependency healthy %v, dead %v (fails after 5 ms), healed %v; %d trials each, their mean\n", callers, healthy, dead, healed, trials)
	fmt.Fprintln(w, "   both: error ratio 0.5 over at least 20 requests in 1 s (10 buckets), 200 ms open before a probe, one good probe closes")
	mk := []func() cbTarget{
		func() cbTarget {
			return leapflowTarget(flow.Rule{Breaker: flow.ErrorRatio, Threshold: 0.5, MinRequests: 20, StatInterval: time.Second,
				Buckets: 10, RetryTimeout: 200 * time.Millisecond})
		},
		func() cbTarget {
			return gobreakerTarget(gobreaker.Settings{Interval: time.Second, BucketPeriod: 100 * time.Millisecond, Timeout: 200 * time.Millisecond,
				MaxRequests: 1, ReadyToTrip: halfFailed})
		},
	}
	printed(w, []string{"breaker", "sent while dead", "refused while dead", "refused after healing", "closed after healing", "closed after (each trial)"}, func(row func(...string)) {
		for _, m := range mk {
			var sent, refusedDead, refusedHealed int64
			var closedSum time.Duration
			var each []string
			name := ""
			for range trials {
				t := m()
				name = t.name
				r := tripAndRecover(t, healthy, dead, healed, callers)
				sent += r.sentDead
				refusedDead += r.refusedDead
				refusedHealed += r.refusedHealed
				closedSum += r.closed
				if r.closed < 0 {
					each = append(each, "never")
				} else {
					each = append(each, r.closed.Round(time.Millisecond).String())
				}
			}
			row(name, strconv.FormatInt(sent/trials, 10), strconv.FormatInt(refusedDead/trials, 10),
				strconv.FormatInt(refusedHealed/trials, 10), (closedSum / trials).Round(time.Millisecond).String(), strings.Join(each, " "))
		}
	})
	fmt.Fprintln(w)
}

type recovery struct {
	sentDead, refusedDead, refusedHealed int64
	closed                               time.Duration // after healing; -1 never
}

func tripAndRecover(t cbTarget, healthy, dead, healed time.Duration, callers int) recovery {
	var phase atomic.Int32 // 0 healthy, 1 dead, 2 healed
	var sentDead, refusedDead, refusedHealed atomic.Int64
	var healedAt, closedAt atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(start) < healthy+dead+healed {
				p := phase.Load()
				if exit, ok := t.enter(); ok {
					if p == 1 {
						sentDead.Add(1)
						time.Sleep(5 * time.Millisecond)
						exit(errDead)
					} else {
						exit(nil)
					}
				} else if p == 1 {
					refusedDead.Add(1)
				} else if p == 2 {
					refusedHealed.Add(1)
				}
				if p == 2 && closedAt.Load() == 0 && t.closed() {
					closedAt.CompareAndSwap(0, int64(time.Since(start)))
				}
				time.Sleep(time.Millisecond)
			}
		}()
	}
	time.Sleep(healthy)
	phase.Store(1)
	time.Sleep(dead)
	healedAt.Store(int64(time.Since(start)))
	phase.Store(2)
	wg.Wait()
	r := recovery{sentDead: sentDead.Load(), refusedDead: refusedDead.Load(), refusedHealed: refusedHealed.Load(), closed: -1}
	if c := closedAt.Load(); c != 0 {
		r.closed = time.Duration(c - healedAt.Load())
	}
	return r
}
