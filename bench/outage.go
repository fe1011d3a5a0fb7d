package main

// global-outage: processes sharing one Global rule on a real redis-server
// while it is killed, restarted empty and paused, while the CPU starves,
// and while one of the processes is paused.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global"
	"github.com/leapflow/leapflow/global/redistest"
)

// outageChildEnv carries a child's settings (JSON): set, the bench runs as
// one process of the fleet instead.
const outageChildEnv = "LEAPFLOW_BENCH_OUTAGE_CHILD"

// outageChild is what one process of the fleet runs.
type outageChild struct {
	Addr      string
	Key       string
	Threshold float64
	Share     float64
	SpanExact bool
	// Load: "paced" (Rate requests a second, evenly), "tight" (Goroutines
	// calling Entry back to back) or "busy" (Goroutines each spinning
	// 1 µs of CPU between calls).
	Load       string
	Rate       float64
	Goroutines int
}

// childReport is what a child writes to its stdout when its stdin closes.
type childReport struct {
	Admits []int64 // Unix ns of every admission
	Redis  []int64 // of every admission Redis counted
	// Samples are taken every millisecond: Unix ns, the rule's fallbacks
	// so far.
	Samples  [][2]int64
	Calls    [][3]int64 // every 10 ms: Unix ns, calls, errors
	Stats    global.Stats
	Refused  int64
	Requests int64
	// SchedP50 and SchedP99 are how long goroutines waited to run once
	// runnable (runtime/metrics' /sched/latencies:seconds), ns.
	SchedP50, SchedP99 int64
}

// schedLatency reads the quantiles q of the scheduling latencies so far.
func schedLatency(q ...float64) []int64 {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	out := make([]int64, len(q))
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return out
	}
	h := s[0].Value.Float64Histogram()
	var total uint64
	for _, c := range h.Counts {
		total += c
	}
	for i, qq := range q {
		want := uint64(qq * float64(total))
		var seen uint64
		for j, c := range h.Counts {
			seen += c
			if seen >= want && c > 0 {
				out[i] = int64(h.Buckets[j+1] * 1e9)
				if math.IsInf(h.Buckets[j+1], 1) {
					out[i] = int64(h.Buckets[j] * 1e9)
				}
				break
			}
		}
	}
	return out
}

// runOutageChild runs one process of the fleet: its load until stdin
// closes, then its report on stdout.
func runOutageChild(cfgJSON string) error {
	var c outageChild
	if err := json.Unmarshal([]byte(cfgJSON), &c); err != nil {
		return err
	}
	var redisMu sync.Mutex
	var byRedis []int64
	src, err := global.Dial(&redis.UniversalOptions{Addrs: []string{c.Addr}}, global.WithOnAdmit(func(_ time.Time, n int64) {
		t := time.Now().UnixNano()
		redisMu.Lock()
		for range n {
			byRedis = append(byRedis, t)
		}
		redisMu.Unlock()
	}))
	if err != nil {
		return err
	}
	eng, err := flow.New(flow.WithTokenSource(src))
	if err != nil {
		return err
	}
	if err := eng.LoadRules([]flow.Rule{{ID: c.Key, Resource: "api", Threshold: c.Threshold, Global: true,
		Fallback: flow.FallbackLocal, LocalShare: c.Share, SpanExact: c.SpanExact}}); err != nil {
		return err
	}
	res, err := eng.Resource("api")
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var rep childReport
	worker := func(spin bool, every time.Duration) {
		defer wg.Done()
		admits := make([]int64, 0, 1<<14)
		var requests, refused int64
		next := time.Now()
		for {
			select {
			case <-stop:
				mu.Lock()
				rep.Admits = append(rep.Admits, admits...)
				rep.Requests += requests
				rep.Refused += refused
				mu.Unlock()
				return
			default:
			}
			if every > 0 {
				next = next.Add(every)
				if d := time.Until(next); d > 0 {
					time.Sleep(d)
				}
			}
			requests++
			if en, err := res.Entry(); err == nil {
				admits = append(admits, time.Now().UnixNano())
				en.Exit(nil)
			} else {
				refused++
			}
			if spin {
				for t := time.Now(); time.Since(t) < time.Microsecond; {
				}
			}
		}
	}
	switch c.Load {
	case "paced":
		wg.Add(1)
		go worker(false, time.Duration(float64(time.Second)/c.Rate))
	default:
		for range c.Goroutines {
			wg.Add(1)
			go worker(c.Load == "busy", 0)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-tick.C:
				snap, _ := eng.Snapshot("api")
				mu.Lock()
				rep.Samples = append(rep.Samples, [2]int64{now.UnixNano(), snap.Fallbacks})
				if len(rep.Samples)%10 == 0 {
					st := src.Stats()
					rep.Calls = append(rep.Calls, [3]int64{now.UnixNano(), st.Calls, st.Errors})
				}
				mu.Unlock()
			}
		}
	}()
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	close(stop)
	wg.Wait()
	rep.Stats = src.Stats()
	slices.Sort(rep.Admits)
	lat := schedLatency(0.5, 0.99)
	rep.SchedP50, rep.SchedP99 = lat[0], lat[1]
	rep.Redis = byRedis
	_ = src.Close()
	return json.NewEncoder(os.Stdout).Encode(&rep)
}

// fleetProc is a running child.
type fleetProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startChildren(n int, c outageChild) ([]*fleetProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cfg, _ := json.Marshal(c)
	var ps []*fleetProc
	for range n {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), outageChildEnv+"="+string(cfg))
		cmd.Stderr = io.Discard
		in, err := cmd.StdinPipe()
		if err != nil {
			killChildren(ps)
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			killChildren(ps)
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			killChildren(ps)
			return nil, err
		}
		p := &fleetProc{cmd: cmd, stdin: in, out: bufio.NewReaderSize(out, 1<<20)}
		ps = append(ps, p)
		if line, err := p.out.ReadString('\n'); err != nil || line != "ready\n" {
			killChildren(ps)
			return nil, fmt.Errorf("bench: a child did not start: %q %v", line, err)
		}
	}
	return ps, nil
}

// killChildren ends children that will not be asked for a report.
func killChildren(ps []*fleetProc) {
	for _, p := range ps {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

func stopChildren(ps []*fleetProc) ([]childReport, error) {
	for _, p := range ps {
		_ = p.stdin.Close()
	}
	reps := make([]childReport, len(ps))
	for i, p := range ps {
		if err := json.NewDecoder(p.out).Decode(&reps[i]); err != nil {
			killChildren(ps[i:])
			return nil, fmt.Errorf("bench: a child's report: %w", err)
		}
		_ = p.cmd.Wait()
	}
	return reps, nil
}

// countIn counts ts in [from, to).
func countIn(ts []int64, from, to int64) int {
	lo, _ := slices.BinarySearch(ts, from)
	hi, _ := slices.BinarySearch(ts, to)
	return hi - lo
}

// firstFallback is when a child's fallbacks first rose at or after from
// (0: never).
func firstFallback(r childReport, from int64) int64 {
	var base int64 = -1
	for _, s := range r.Samples {
		if s[0] < from {
			continue
		}
		if base < 0 {
			base = s[1]
			continue
		}
		if s[1] > base {
			return s[0]
		}
	}
	return 0
}

// firstError is the first sample at or after from at which a child's
// failed calls had risen (0: never).
func firstError(r childReport, from int64) int64 {
	var base int64
	for _, c := range r.Calls {
		if c[0] < from {
			base = c[2]
			continue
		}
		if c[2] > base {
			return c[0]
		}
	}
	return 0
}

// lastFallback is when a child's fallbacks last rose before to.
func lastFallback(r childReport, to int64) int64 {
	var last, prev int64
	for i, s := range r.Samples {
		if s[0] >= to {
			break
		}
		if i > 0 && s[1] > prev {
			last = s[0]
		}
		prev = s[1]
	}
	return last
}

func merged(reps []childReport) []int64 {
	var ts []int64
	for _, r := range reps {
		ts = append(ts, r.Admits...)
	}
	slices.Sort(ts)
	return ts
}

func globalOutage(cfg config, w io.Writer) error {
	const (
		procs     = 4
		threshold = 1000
		share     = 1.0 / procs
		phase     = 3 * time.Second
	)
	srv, err := redistest.Launch()
	if err != nil {
		return err
	}
	defer srv.Stop()
	fmt.Fprintf(w, "Global rules through a dead, restarted and paused Redis: %d processes, one Global rule of T=%d/s (span-exact, FallbackLocal, LocalShare %.2f: the fallback allows %d/s in all), global.Dial's client with the defaults (Timeout 100 ms, CallTimeout 1 s, FailAfter 2); GOMAXPROCS %d\n\n",
		procs, threshold, share, int(procs*share*threshold), runtime.GOMAXPROCS(0))
	var failed []string
	loads := []outageChild{
		{Load: "paced", Rate: 0.5 * threshold},
		{Load: "tight", Goroutines: 8},
	}

	fmt.Fprintf(w, "1-2. kill -9 of Redis %v in, restart (empty) %v later, %v more\n", phase, phase, phase)
	fmt.Fprintf(w, "(a process whose window Redis had said was full until some instant refuses until then without a call: its first failed call, and its fallback, come after; the first second after the kill shares every 1 s span with the second before it)\n")
	printed(w, []string{"load", "kill to fallback (worst process)", "first failed call to fallback (worst)", "bound FailAfter x Timeout + 50 ms", "admitted in the seconds after the kill", "least after the first, of what the fallback allows", "most in any 1 s span", "most in a 1 s span at the restart", "late refusals"}, func(row func(...string)) {
		for _, l := range loads {
			c := l
			c.Addr, c.Threshold, c.Share, c.SpanExact = srv.Addr(), threshold, share, true
			c.Key = fmt.Sprintf("outage-%s-%d", c.Load, time.Now().UnixNano())
			ps, err := startChildren(procs, c)
			if err != nil {
				failed = append(failed, err.Error())
				return
			}
			time.Sleep(phase)
			killed := time.Now().UnixNano()
			srv.Kill()
			time.Sleep(phase)
			restarted := time.Now().UnixNano()
			if err := srv.Restart(); err != nil {
				failed = append(failed, err.Error())
			}
			time.Sleep(phase)
			reps, err := stopChildren(ps)
			if err != nil {
				failed = append(failed, err.Error())
				return
			}
			ts := merged(reps)
			var detect, fromCall int64
			var late int64
			for _, r := range reps {
				if f := firstFallback(r, killed); f == 0 {
					detect = -1
				} else if detect >= 0 {
					detect = max(detect, f-killed)
					if e := firstError(r, killed); e > 0 {
						fromCall = max(fromCall, f-e)
					}
				}
				late += r.Stats.Late
			}
			// The whole seconds after the kill, from the kill on.
			least := -1
			var secs []string
			for s := killed; s+int64(time.Second) <= restarted; s += int64(time.Second) {
				n := countIn(ts, s, s+int64(time.Second))
				secs = append(secs, fmt.Sprint(n))
				if s > killed && (least < 0 || n < least) {
					least = n
				}
			}
			allows := procs * share * threshold
			most := maxSpan(ts, int64(time.Second))
			var atRestart int
			for from := restarted - int64(time.Second); from < restarted+int64(2*time.Second); from += int64(time.Millisecond) {
				atRestart = max(atRestart, countIn(ts, from, from+int64(time.Second)))
			}
			bound := 2*100*time.Millisecond + 50*time.Millisecond
			detectS, fromCallS := "never", "-"
			if detect >= 0 {
				detectS = time.Duration(detect).Round(time.Millisecond).String()
				// The error samples are 10 ms apart: the call failed up to
				// 10 ms before the one that shows it.
				fromCallS = time.Duration(fromCall + int64(10*time.Millisecond)).Round(time.Millisecond).String()
				if time.Duration(fromCall)+10*time.Millisecond > bound {
					failed = append(failed, fmt.Sprintf("%s: a process fell back %v after its first failed call (bound %v)", c.Load, fromCallS, bound))
				}
			}
			if float64(least) < 0.9*allows {
				failed = append(failed, fmt.Sprintf("%s: a whole second of the outage admitted %d, under 90%% of %.0f", c.Load, least, allows))
			}
			if float64(most) > 1.1*threshold {
				failed = append(failed, fmt.Sprintf("%s: a 1 s span admitted %d, over 1.1 x T", c.Load, most))
			}
			if os.Getenv("LEAPFLOW_BENCH_OUTAGE_DEBUG") != "" {
				for from := restarted - int64(time.Second); from < restarted+int64(2*time.Second); from += int64(100 * time.Millisecond) {
					fmt.Fprintf(w, "%+5dms", (from-restarted)/1e6)
					for _, r := range reps {
						var cs [3]int64
						for _, x := range r.Calls {
							if x[0] <= from {
								cs = x
							}
						}
						fmt.Fprintf(w, " c%d e%d", cs[1], cs[2])
						fmt.Fprintf(w, " %4d/%4d", countIn(r.Admits, from, from+int64(100*time.Millisecond)), countIn(r.Redis, from, from+int64(100*time.Millisecond)))
					}
					fmt.Fprintln(w)
				}
			}
			row(c.Load, detectS, fromCallS, bound.String(), strings.Join(secs, ", "), fmt.Sprintf("%d (%.0f%%)", least, 100*float64(least)/allows),
				fmt.Sprint(most), fmt.Sprint(atRestart), fmt.Sprint(late))
		}
	})

	fmt.Fprintf(w, "\n1b. Redis stops answering (SIGSTOP) %v in, for %v: the fallback within FailAfter x CallTimeout of the first call that needed Redis (leases in hand are spent first)\n", phase, phase)
	printed(w, []string{"load", "to fallback (worst process)", "bound", "most in any 1 s span"}, func(row func(...string)) {
		c := loads[0]
		c.Addr, c.Threshold, c.Share, c.SpanExact = srv.Addr(), threshold, share, true
		c.Key = fmt.Sprintf("stall-%d", time.Now().UnixNano())
		ps, err := startChildren(procs, c)
		if err != nil {
			failed = append(failed, err.Error())
			return
		}
		time.Sleep(phase)
		stopped := time.Now().UnixNano()
		_ = srv.Pause()
		time.Sleep(phase)
		_ = srv.Resume()
		time.Sleep(phase)
		reps, err := stopChildren(ps)
		if err != nil {
			failed = append(failed, err.Error())
			return
		}
		var detect int64
		for _, r := range reps {
			if f := firstFallback(r, stopped); f == 0 {
				detect = -1
			} else if detect >= 0 {
				detect = max(detect, f-stopped)
			}
		}
		// FailAfter x CallTimeout from the first call after the stop; the
		// leases in hand are spent first (a bucket, 100 ms, at most).
		bound := 2*time.Second + 100*time.Millisecond + 50*time.Millisecond
		detectS := "never"
		if detect >= 0 {
			detectS = time.Duration(detect).Round(time.Millisecond).String()
			if time.Duration(detect) > bound {
				failed = append(failed, fmt.Sprintf("SIGSTOP: a process fell back %v after (bound %v)", detectS, bound))
			}
		}
		most := maxSpan(merged(reps), int64(time.Second))
		row(c.Load, detectS, bound.String(), fmt.Sprint(most))
	})

	fmt.Fprintf(w, "\n3. A starved CPU, Redis healthy: %v of each load\n", 4*phase)
	printed(w, []string{"goroutines per process", "admitted of T x seconds", "worst second", "seconds without admissions", "late refusals", "fallbacks", "scheduling latency p50 / p99 (worst process)"}, func(row func(...string)) {
		for _, g := range []int{64, 1024} {
			c := outageChild{Load: "busy", Goroutines: g, Addr: srv.Addr(), Threshold: threshold, Share: share, SpanExact: true}
			c.Key = fmt.Sprintf("busy-%d-%d", g, time.Now().UnixNano())
			ps, err := startChildren(procs, c)
			if err != nil {
				failed = append(failed, err.Error())
				return
			}
			from := time.Now().UnixNano() + int64(time.Second) // a second to settle
			time.Sleep(4*phase + time.Second)
			reps, err := stopChildren(ps)
			if err != nil {
				failed = append(failed, err.Error())
				return
			}
			ts := merged(reps)
			worst, zero, secs, total := -1, 0, 0, 0
			for s := from; s+int64(time.Second) <= from+int64(4*phase); s += int64(time.Second) {
				n := countIn(ts, s, s+int64(time.Second))
				total += n
				secs++
				if worst < 0 || n < worst {
					worst = n
				}
				if n == 0 {
					zero++
				}
			}
			var late, fb, p50, p99 int64
			for _, r := range reps {
				late += r.Stats.Late
				p50, p99 = max(p50, r.SchedP50), max(p99, r.SchedP99)
				if len(r.Samples) > 0 {
					fb += r.Samples[len(r.Samples)-1][1]
				}
			}
			share := float64(total) / float64(threshold*secs)
			if share < 0.9 || zero > 0 {
				failed = append(failed, fmt.Sprintf("busy %d: %.0f%% of T, %d seconds without admissions", g, 100*share, zero))
			}
			row(fmt.Sprint(g), fmt.Sprintf("%.0f%%", 100*share), fmt.Sprint(worst), fmt.Sprint(zero), fmt.Sprint(late), fmt.Sprint(fb),
				time.Duration(p50).Round(time.Microsecond).String()+" / "+time.Duration(p99).Round(time.Microsecond).String())
		}
	})

	fmt.Fprintf(w, "\n3b. One process paused (SIGSTOP) for %v, Redis healthy: back on Redis after SIGCONT\n", phase)
	printed(w, []string{"load", "last fallback after SIGCONT", "bound", "paused calls"}, func(row func(...string)) {
		c := loads[0]
		c.Addr, c.Threshold, c.Share, c.SpanExact = srv.Addr(), threshold, share, true
		c.Key = fmt.Sprintf("sigstop-%d", time.Now().UnixNano())
		ps, err := startChildren(procs, c)
		if err != nil {
			failed = append(failed, err.Error())
			return
		}
		time.Sleep(phase)
		_ = ps[0].cmd.Process.Signal(syscall.SIGSTOP)
		time.Sleep(phase)
		_ = ps[0].cmd.Process.Signal(syscall.SIGCONT)
		cont := time.Now().UnixNano()
		time.Sleep(phase)
		reps, err := stopChildren(ps)
		if err != nil {
			failed = append(failed, err.Error())
			return
		}
		back := time.Duration(0)
		if last := lastFallback(reps[0], cont+int64(phase)); last > cont {
			back = time.Duration(last - cont)
		}
		if back > time.Second {
			failed = append(failed, fmt.Sprintf("SIGCONT: still falling back %v after", back))
		}
		row(c.Load, back.Round(time.Millisecond).String(), "1s", fmt.Sprint(reps[0].Stats.Paused))
	})

	if len(failed) > 0 {
		fmt.Fprintf(w, "\nMISSED:\n")
		for _, f := range failed {
			fmt.Fprintf(w, "  %s\n", f)
		}
		return fmt.Errorf("bench: global-outage missed %d target(s)", len(failed))
	}
	return nil
}
