package main

import (
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

// A named section runs alone, by -only: sections too long, or too
// specific, for the main run.
type namedSection struct {
	name, about string
	run         func(cfg config, w io.Writer) error
}

var namedSections = []namedSection{
	{"global-load", "instances sharing a Global rule on Redis: evenly below the limit, random arrivals against the oracle, Redis far away, a saturated CPU (about 60 s; needs redis-server)", globalLoadSection},
	{"perkey-attack", "per-key limits under a flood of keys: distinct keys, attacker keys at their limit, keys evicted and back, memory (about 30 s)", perKeyAttack},
	{"global-outage", "4 processes on one Global rule through a killed, restarted and paused Redis, a starved CPU and a paused process (about 90 s; needs redis-server)", globalOutage},
	{"breaker", "circuit breaking against sony/gobreaker/v2: the pass path at 1, 2, 8 and 256 goroutines, requests admitted per half-open period at 1 to 1024 goroutines, a probe that never returns, a dead dependency tripped and healed (about 35 s)", breakerSection},
	{"overload", "adaptive overload protection: a simulated service of fixed capacity, unloaded and at 3x overload with and without a SystemBBR rule, in simulated time: goodput, p50/p99 latency, shed requests, and two charts (about 1 s)", overloadSection},
	{"growth", "one request's cost as resources (1, 100, 10,000), windows (1, 4, 16) and keys (1k, 100k, 1M) grow, beside x/time/rate, go-limiter and a map of x/time/rate limiters, and a chart (about 40 s; -quick smaller)", growthSection},
	{"churn", "what bucket rotations allocate: 1,000 active resources on a simulated clock, Reject and span-exact rules, at GOMAXPROCS 2 and 64 (about 5 s)", churnSection},
	{"perkey-reload-soak", "per-key windows over their threshold while rules reload 10 times a second under traffic, real clock (-soak, default 60 s)", perKeyReloadSoak},
}

// sectionNames lists the named sections, for -h.
func sectionNames() string {
	var b strings.Builder
	for _, s := range namedSections {
		fmt.Fprintf(&b, "\n  %s: %s", s.name, s.about)
	}
	return b.String()
}

// runOnly runs the named section.
func runOnly(cfg config, stdout io.Writer) error {
	for _, s := range namedSections {
		if s.name == cfg.only {
			return s.run(cfg, stdout)
		}
	}
	return fmt.Errorf("bench: -only %q: no such section (one of:%s)", cfg.only, sectionNames())
}

// attackEngine is an engine on a frozen clock (one window) with one
// PerKey rule on "api".
func attackEngine(threshold float64, maxKeys int) *flow.Engine {
	e, err := flow.New(flow.WithClock(stattest.NewClock(time.Hour)), flow.WithMaxKeys(4_000_000))
	if err != nil {
		panic(err)
	}
	if err := e.LoadRules([]flow.Rule{{Resource: "api", Threshold: threshold, PerKey: true, MaxKeys: maxKeys}}); err != nil {
		panic(err)
	}
	return e
}

func allowed(e *flow.Engine, key string) bool {
	_, err := e.Allow("api", flow.WithKey(key))
	return err == nil
}

func perKeyAttack(cfg config, w io.Writer) error {
	distinct := 1_000_000
	if cfg.quick {
		distinct = 100_000
	}
	fmt.Fprintf(w, "Per-key under attack: one PerKey Reject rule, all in one window (a frozen clock)\n\n")
	var failed []string

	fmt.Fprintf(w, "1. %d distinct keys, one request each (threshold 10)\n", distinct)
	printed(w, []string{"MaxKeys", "refused", "evicted while active", "forgotten", "ns/request"}, func(row func(...string)) {
		for _, maxKeys := range []int{1024, 100_000} {
			e := attackEngine(10, maxKeys)
			refused := 0
			start := time.Now()
			for k := range distinct {
				if !allowed(e, "k"+strconv.Itoa(k)) {
					refused++
				}
			}
			ns := float64(time.Since(start).Nanoseconds()) / float64(distinct)
			if refused > 0 {
				failed = append(failed, fmt.Sprintf("MaxKeys %d: %d of %d distinct keys refused", maxKeys, refused, distinct))
			}
			snap, _ := e.Snapshot("api")
			row(fmt.Sprint(maxKeys), fmt.Sprint(refused), fmt.Sprint(snap.KeyEvictions), fmt.Sprint(snap.KeysForgotten), fmt.Sprintf("%.0f", ns))
		}
	})

	fmt.Fprintf(w, "\n2. Attacker keys, each admitted up to the threshold (5) and then evicted; a fresh key every 20 attackers sends 5\n")
	printed(w, []string{"MaxKeys", "attacker keys", "admitted to attackers", "fresh keys admitted in full"}, func(row func(...string)) {
		for _, c := range []struct{ maxKeys, attackers int }{{1024, 20_000}, {8, 2_000}} {
			e := attackEngine(5, c.maxKeys)
			attacked, full, fresh := 0, 0, 0
			for a := range c.attackers {
				for allowed(e, "attacker-"+strconv.Itoa(a)) {
					attacked++
				}
				if a%20 == 19 {
					fresh++
					n := 0
					for range 5 {
						if allowed(e, "fresh-"+strconv.Itoa(fresh)) {
							n++
						}
					}
					if n == 5 {
						full++
					}
				}
			}
			row(fmt.Sprint(c.maxKeys), fmt.Sprint(c.attackers), fmt.Sprint(attacked), fmt.Sprintf("%d of %d", full, fresh))
			if full < fresh*99/100 {
				failed = append(failed, fmt.Sprintf("MaxKeys %d: %d of %d fresh keys admitted in full", c.maxKeys, full, fresh))
			}
		}
	})

	fmt.Fprintf(w, "\n3. 100 keys at their threshold (10), then other keys evict them, then each sends once more (MaxKeys 1024)\n")
	printed(w, []string{"evicted in the window", "victims refused (held to 10)", "forgotten"}, func(row func(...string)) {
		for _, times := range []int{1, 2, 4, 8, 16} {
			e := attackEngine(10, 1024)
			for v := range 100 {
				for range 10 {
					allowed(e, "victim-"+strconv.Itoa(v))
				}
			}
			for f := range times*1024 + 1024 - 100 {
				allowed(e, "filler-"+strconv.Itoa(f))
			}
			snap, _ := e.Snapshot("api")
			held := 0
			for v := range 100 {
				if !allowed(e, "victim-"+strconv.Itoa(v)) {
					held++
				}
			}
			row(fmt.Sprintf("%d (%dx MaxKeys)", snap.KeyEvictions, times), fmt.Sprintf("%d of 100", held), fmt.Sprint(snap.KeysForgotten))
			if times <= 4 && held < 99 {
				failed = append(failed, fmt.Sprintf("%dx MaxKeys evicted: %d of 100 victims held", times, held))
			}
		}
	})

	n := 100_000
	if cfg.quick {
		n = 10_000
	}
	fmt.Fprintf(w, "\n4. Memory: heap bytes per key of MaxKeys %d, 16-byte keys, one request each in one window\n", n)
	names := keyNames(5 * n)
	printed(w, []string{"keys", "evicted while active", "bytes per tracked key"}, func(row func(...string)) {
		for _, k := range []int{n, 2 * n, 5 * n} {
			var evicted int64
			grown := heapGrowth(func() func() {
				e := attackEngine(100, n)
				for _, key := range names[:k] {
					allowed(e, key)
				}
				snap, _ := e.Snapshot("api")
				evicted = snap.KeyEvictions
				return func() { runtime.KeepAlive(e) }
			})
			per := float64(grown) / float64(n)
			row(fmt.Sprint(k), fmt.Sprint(evicted), fmt.Sprintf("%.0f", per))
			if per > 256 {
				failed = append(failed, fmt.Sprintf("%.0f bytes per tracked key after %d keys", per, k))
			}
		}
	})
	runtime.KeepAlive(names)
	if len(failed) > 0 {
		return fmt.Errorf("bench: per-key under attack: %s", strings.Join(failed, "; "))
	}
	return nil
}

// perKeyReloadSoak loads a PerKey rule of 20 a second and reloads it 10
// times a second, changing its MaxKeys and Threshold by turns, while
// goroutines hammer 3,000 keys (more than either MaxKeys: keys are evicted
// and come back) on the real clock, each key from every goroutine; it
// reports the windows (4 buckets of 250 ms, as the rule counts) in which a
// key was admitted more than the larger threshold.
func perKeyReloadSoak(cfg config, w io.Writer) error {
	d := cfg.soak
	e, err := flow.New(flow.WithClock(stat.DefaultClock()))
	if err != nil {
		return err
	}
	const keys, goroutines, limit = 3000, 4, 20
	rules := []flow.Rule{
		{ID: "u", Resource: "api", Threshold: limit, PerKey: true, MaxKeys: 1000},
		{ID: "u", Resource: "api", Threshold: limit, PerKey: true, MaxKeys: 2000},
		{ID: "u", Resource: "api", Threshold: limit - 5, PerKey: true, MaxKeys: 2000},
	}
	if err := e.LoadRules(rules[:1]); err != nil {
		return err
	}
	stop := time.Now().Add(d)
	type stamp struct {
		key int
		at  int64
	}
	out := make(chan []stamp, goroutines)
	for g := range goroutines {
		go func() {
			var mine []stamp
			for i := g * 7919; time.Now().Before(stop); i++ {
				k := i % keys
				if en, err := e.Entry("api", flow.WithKey("k"+strconv.Itoa(k))); err == nil {
					mine = append(mine, stamp{k, en.Start()})
					en.Exit(nil)
				}
			}
			out <- mine
		}()
	}
	reloads := 0
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for ; time.Now().Before(stop); <-tick.C {
		reloads++
		if err := e.LoadRules(rules[reloads%len(rules) : reloads%len(rules)+1]); err != nil {
			return err
		}
	}
	per := make([]map[int64]int, keys) // by key, by bucket of 250 ms
	for k := range per {
		per[k] = map[int64]int{}
	}
	admitted := 0
	for range goroutines {
		for _, s := range <-out {
			per[s.key][s.at/int64(250*time.Millisecond)]++
			admitted++
		}
	}
	over, worst := 0, 0
	for _, buckets := range per {
		for b := range buckets {
			n := buckets[b] + buckets[b-1] + buckets[b-2] + buckets[b-3]
			if n > limit {
				over++
			}
			worst = max(worst, n)
		}
	}
	snap, _ := e.Snapshot("api")
	fmt.Fprintf(w, "Per-key reload soak: %v, %d keys, %d goroutines, %d reloads (MaxKeys 1000/2000, threshold 20/15)\n", d, keys, goroutines, reloads)
	printed(w, []string{"admitted", "evicted while active", "forgotten", "key windows over 20", "most in a key's window"}, func(row func(...string)) {
		row(fmt.Sprint(admitted), fmt.Sprint(snap.KeyEvictions), fmt.Sprint(snap.KeysForgotten), fmt.Sprint(over), fmt.Sprint(worst))
	})
	if over > 0 {
		return fmt.Errorf("bench: %d per-key windows over the threshold", over)
	}
	return nil
}

// printed prints an aligned table of cols, its rows given by fill.
func printed(w io.Writer, cols []string, fill func(row func(...string))) {
	var rows [][]string
	fill(func(cells ...string) { rows = append(rows, cells) })
	table(w, false, cols, rows)
}
