package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global"
	"github.com/leapflow/leapflow/global/redistest"
)

// The Global GCRA section: leapflow's Global GCRA rule against
// redis_rate (go-redis' own GCRA on Redis), on one local redis-server.

// gcraImpls are the two limiters, by name.
var gcraImpls = []string{"leapflow global GCRA", "redis_rate v10"}

// gcraCell is one throughput cell: every decision admits.
type gcraCell struct {
	impl        string
	goroutines  int
	nsPerOp     float64
	cmdsPerDecn float64 // EVALSHA + EVAL per decision, from INFO commandstats
}

// gcraHammer is what four instances admitted together on one limit.
type gcraHammer struct {
	impl              string
	goroutines        int
	rate, burst       int64
	admitted          int64
	errors            int64
	mostLocal         int64 // most in any 1 s span, local admission times
	mostServer        int64 // the same on the server clock (-1: unknown)
	cmds              int64
	instances         int
	duration, elapsed time.Duration
}

type gcraResult struct {
	cells   []gcraCell
	hammers []gcraHammer
	note    string
}

// gcraSteps is how many progress ticks gcraSection makes.
func gcraSteps() int { return 2*len(gcraGoroutines()) + len(gcraImpls) }

func gcraGoroutines() []int {
	if p := runtime.GOMAXPROCS(0); p > 1 {
		return []int{1, p}
	}
	return []int{1}
}

// gcraSection runs the comparison on a redis-server it starts itself.
func gcraSection(cfg config, tick func(string)) gcraResult {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return gcraResult{note: "skipped: redis-server not found (make test installs it from Debian's packages)"}
	}
	srv, err := redistest.Launch()
	if err != nil {
		return gcraResult{note: "skipped: " + err.Error()}
	}
	defer srv.Stop()
	admin := srv.Client()
	defer admin.Close()
	var res gcraResult
	for _, impl := range gcraImpls {
		for _, g := range gcraGoroutines() {
			tick(fmt.Sprintf("%s g=%d", impl, g))
			// Four times a throughput cell: a round trip's cost varies
			// more than a local limiter's.
			res.cells = append(res.cells, gcraThroughput(srv, admin, impl, g, 4*cfg.duration))
		}
	}
	rate := cfg.threshold
	burst := max(1, rate/10)
	for _, impl := range gcraImpls {
		tick("hammer " + impl)
		res.hammers = append(res.hammers, gcraHammerRun(srv, admin, impl, rate, burst, cfg.accG, cfg.accDuration))
	}
	return res
}

var evalCalls = regexp.MustCompile(`(?m)^cmdstat_(?:evalsha|eval):calls=(\d+)`)

// scriptCalls is how many EVALSHA and EVAL the server has run.
func scriptCalls(admin *redis.Client) int64 {
	info, err := admin.Info(context.Background(), "commandstats").Result()
	if err != nil {
		panic(err)
	}
	var n int64
	for _, m := range evalCalls.FindAllStringSubmatch(info, -1) {
		c, _ := strconv.ParseInt(m[1], 10, 64)
		n += c
	}
	return n
}

// gcraDecider is one instance of a limiter: decide asks for one token.
type gcraDecider struct {
	decide func() (bool, error)
	close  func()
}

// newGCRADecider makes an instance of impl with its own client, on the
// limit named key; onAdmit (leapflow only) gets server times.
func newGCRADecider(srv *redistest.Server, impl, key string, rate, burst int64, onAdmit func(time.Time, int64)) gcraDecider {
	client := srv.Client()
	if impl == gcraImpls[1] {
		lim := redis_rate.NewLimiter(client)
		limit := redis_rate.Limit{Rate: int(rate), Burst: int(burst), Period: time.Second}
		ctx := context.Background()
		return gcraDecider{
			decide: func() (bool, error) {
				r, err := lim.AllowN(ctx, key, limit, 1)
				return err == nil && r.Allowed > 0, err
			},
			close: func() { client.Close() },
		}
	}
	src, err := global.New(client, global.WithOnAdmit(onAdmit))
	if err != nil {
		panic(err)
	}
	eng, err := flow.New(flow.WithTokenSource(src))
	if err != nil {
		panic(err)
	}
	if err := eng.LoadRules([]flow.Rule{{ID: key, Resource: "api", Threshold: float64(rate), Behavior: flow.GCRA, Burst: int(burst),
		Global: true, Fallback: flow.FallbackClosed}}); err != nil {
		panic(err)
	}
	h, err := eng.Resource("api")
	if err != nil {
		panic(err)
	}
	return gcraDecider{
		decide: func() (bool, error) {
			en, err := h.Entry()
			if err != nil {
				return false, nil // blocked: a fallback would show in Fallbacks
			}
			en.Exit(nil)
			return true, nil
		},
		close: func() {
			snap, _ := eng.Snapshot("api")
			if snap.Fallbacks > 0 {
				panic(fmt.Sprintf("bench: Redis failed during the GCRA section (%d fallbacks)", snap.Fallbacks))
			}
			_ = src.Close()
			client.Close()
		},
	}
}

// gcraThroughput is one cell: a limit no load reaches, so every decision
// is a round trip that admits.
func gcraThroughput(srv *redistest.Server, admin *redis.Client, impl string, g int, d time.Duration) gcraCell {
	key := fmt.Sprintf("gcra-ns-%d", time.Now().UnixNano())
	const huge = 1_000_000_000
	dc := newGCRADecider(srv, impl, key, huge, huge, nil)
	defer dc.close()
	dc.decide() // the script loaded, a connection dialled
	before := scriptCalls(admin)
	ns, _, ops := measure(func(int, int) { _, _ = dc.decide() }, g, d)
	calls := scriptCalls(admin) - before
	return gcraCell{impl: impl, goroutines: g, nsPerOp: ns, cmdsPerDecn: float64(calls) / float64(max(ops, 1))}
}

// gcraHammerRun runs four instances of impl on one limit, goroutines in
// all, for d, and finds the most admitted in any 1 s span.
func gcraHammerRun(srv *redistest.Server, admin *redis.Client, impl string, rate, burst int64, goroutines int, d time.Duration) gcraHammer {
	const instances = 4
	h := gcraHammer{impl: impl, goroutines: goroutines, rate: rate, burst: burst, instances: instances, duration: d, mostServer: -1}
	key := fmt.Sprintf("gcra-hammer-%d", time.Now().UnixNano())
	var audit *global.Audit
	var onAdmit func(time.Time, int64)
	if impl == gcraImpls[0] {
		audit = global.NewAudit()
		onAdmit = audit.Record
	}
	var dcs []gcraDecider
	for range instances {
		dcs = append(dcs, newGCRADecider(srv, impl, key, rate, burst, onAdmit))
	}
	before := scriptCalls(admin)
	var mu sync.Mutex
	var times []int64 // local admission times, ns
	var errs int64
	var wg sync.WaitGroup
	t0 := time.Now()
	deadline := t0.Add(d)
	for i := range max(goroutines, instances) {
		dc := dcs[i%instances]
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []int64
			var bad int64
			for time.Now().Before(deadline) {
				ok, err := dc.decide()
				if err != nil {
					bad++
				}
				if ok {
					mine = append(mine, time.Now().UnixNano())
				}
			}
			mu.Lock()
			times = append(times, mine...)
			errs += bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	h.elapsed = time.Since(t0)
	h.cmds = scriptCalls(admin) - before
	for _, dc := range dcs {
		dc.close()
	}
	slices.Sort(times)
	h.admitted, h.errors = int64(len(times)), errs
	h.mostLocal = int64(mostIn(times, int64(time.Second)))
	if audit != nil {
		h.mostServer = audit.Fullest(time.Second)
	}
	return h
}

// mostIn is the most of sorted times in any half-open span of length
// span.
func mostIn(times []int64, span int64) int {
	most, lo := 0, 0
	for hi, t := range times {
		for t-times[lo] >= span {
			lo++
		}
		most = max(most, hi-lo+1)
	}
	return most
}

// gcraTables writes the section.
func (r *report) gcraTables(w io.Writer, md bool) {
	g := r.gcra
	if md {
		fmt.Fprintf(w, "\n## Global GCRA on Redis: leapflow and redis_rate\n\n")
	} else {
		fmt.Fprintf(w, "\nGlobal GCRA on Redis: leapflow (a Global GCRA rule through flow.Resource) and redis_rate v10 (AllowN), one local redis-server\n")
	}
	if g.note != "" {
		fmt.Fprintln(w, g.note)
		return
	}
	if md {
		fmt.Fprintf(w, "A Global GCRA rule through a flow.Resource (one EVALSHA per decision, no leasing) and redis_rate v10's AllowN "+
			"with the same rate and burst, each instance with its own go-redis client, on one local redis-server the bench starts. "+
			"Throughput (cells of %v): a limit no load reaches, so every decision admits; ns/op is for the whole machine; *scripts/decision* is "+
			"EVALSHA + EVAL per decision, from the server's INFO commandstats.\n\n", 4*r.cfg.duration)
	}
	var rows [][]string
	for _, c := range g.cells {
		rows = append(rows, []string{c.impl, fmt.Sprint(c.goroutines), fmt.Sprintf("%.0f", c.nsPerOp), fmt.Sprintf("%.3f", c.cmdsPerDecn)})
	}
	table(w, md, []string{"limiter", "goroutines", "ns/op", "scripts/decision"}, rows)
	if len(g.hammers) == 0 {
		return
	}
	x := g.hammers[0]
	text := fmt.Sprintf("%d instances (own clients), %d goroutines in all, rate %d/s, burst %d, for %v: the most admitted in any "+
		"continuous 1 s span, by the local time each admission returned (a reply's delay can move it by a round trip) and, "+
		"for leapflow, by the server time of its decision; the bound is burst + rate.",
		x.instances, x.goroutines, x.rate, x.burst, x.duration)
	if md {
		fmt.Fprintf(w, "\n%s\n\n", text)
	} else {
		fmt.Fprintf(w, "%s\n", text)
	}
	rows = nil
	for _, h := range g.hammers {
		server := "n/a"
		if h.mostServer >= 0 {
			server = fmt.Sprint(h.mostServer)
		}
		rows = append(rows, []string{h.impl, fmt.Sprint(h.admitted), fmt.Sprint(h.mostLocal), server, fmt.Sprint(h.burst + h.rate),
			fmt.Sprintf("%.3f", float64(h.cmds)/float64(max(h.admitted, 1))), fmt.Sprint(h.errors)})
	}
	table(w, md, []string{"limiter", "admitted", "most in 1 s (local)", "most in 1 s (server)", "bound", "scripts/admitted", "errors"}, rows)
}
