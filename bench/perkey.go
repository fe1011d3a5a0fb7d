package main

import (
	"context"
	"fmt"
	"io"
	"math/rand"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/hammer"
	"github.com/leapflow/leapflow/stat"
)

// A per-key limiter decides one request of a key: admitted or not, and
// when admitted, the instant it counts at on the limiter's own clock (for
// its own windows), or -1 for limiters without windows of their own.
type keyLimiter struct {
	name  string
	note  string
	make  func(perSecond float64, maxKeys int) (take func(key string) (bool, int64), close func())
	bound bool // memory bounded by a key count
	// config says how the limiter is set up for a limit of perSecond.
	config func(perSecond float64) string
}

// svConfig is sethvargo/go-limiter's memorystore set up for perSecond.
// It refills only when a tick of Interval passes, and then to (ticks x
// Interval/Tokens) tokens, capped at Tokens: far less than Tokens when
// Tokens is above about sqrt(Interval in ns) (Tokens 1e9 per 1 s refills 1
// token a second). A limit no run reaches (hugeKeyRate and more) is
// therefore set up as Tokens more than any run's requests and an Interval
// longer than any run, so that the limiter stays on its pass path.
func svConfig(perSecond float64) *memorystore.Config {
	if perSecond >= hugeKeyRate {
		return &memorystore.Config{Tokens: 1 << 40, Interval: time.Hour}
	}
	return &memorystore.Config{Tokens: uint64(perSecond), Interval: time.Second}
}

func svDescribe(perSecond float64) string {
	c := svConfig(perSecond)
	return fmt.Sprintf("memorystore.Config{Tokens: %d, Interval: %v}", c.Tokens, c.Interval)
}

var keyLimiters = []keyLimiter{
	{"leapflow", "a PerKey Reject rule through a flow.Resource (MaxKeys bounds it)", func(perSecond float64, maxKeys int) (func(string) (bool, int64), func()) {
		eng, err := flow.New(flow.WithClock(stat.DefaultClock()), flow.WithMaxKeys(4_000_000))
		if err != nil {
			panic(err)
		}
		if err := eng.LoadRules([]flow.Rule{{Resource: "api", Threshold: perSecond, PerKey: true, MaxKeys: maxKeys}}); err != nil {
			panic(err)
		}
		r, err := eng.Resource("api")
		if err != nil {
			panic(err)
		}
		return func(key string) (bool, int64) {
			en, err := r.Entry(flow.WithKey(key))
			if err != nil {
				return false, 0
			}
			at := en.Start()
			en.Exit(nil)
			return true, at
		}, func() {}
	}, true, func(perSecond float64) string {
		return fmt.Sprintf("flow.Rule{Threshold: %g, PerKey: true, MaxKeys: the case's}", perSecond)
	}},
	{"sethvargo/go-limiter", "memorystore: a token bucket per key, swept every 6 h by default", func(perSecond float64, _ int) (func(string) (bool, int64), func()) {
		st, err := memorystore.New(svConfig(perSecond))
		if err != nil {
			panic(err)
		}
		ctx := context.Background()
		return func(key string) (bool, int64) {
			_, _, _, ok, err := st.Take(ctx, key)
			return ok && err == nil, -1
		}, func() { _ = st.Close(ctx) }
	}, false, svDescribe},
	{"ulule/limiter", "memory store: a fixed window per key, cleaned every 30 s by default", func(perSecond float64, _ int) (func(string) (bool, int64), func()) {
		l := ulule.New(ululemem.NewStore(), ulule.Rate{Period: time.Second, Limit: int64(perSecond)})
		ctx := context.Background()
		return func(key string) (bool, int64) {
			c, err := l.Get(ctx, key)
			return err == nil && !c.Reached, -1
		}, func() {}
	}, false, func(perSecond float64) string {
		return fmt.Sprintf("limiter.Rate{Period: 1s, Limit: %d}", int64(perSecond))
	}},
	{"sync.Map+x/time/rate", "a sync.Map of rate.Limiter, made on a key's first request, never evicted", func(perSecond float64, _ int) (func(string) (bool, int64), func()) {
		var m sync.Map
		return func(key string) (bool, int64) {
			l, ok := m.Load(key)
			if !ok {
				l, _ = m.LoadOrStore(key, rate.NewLimiter(rate.Limit(perSecond), int(perSecond)))
			}
			return l.(*rate.Limiter).Allow(), -1
		}, func() {}
	}, false, func(perSecond float64) string {
		return fmt.Sprintf("rate.NewLimiter(%g, %d) in a sync.Map", perSecond, int(perSecond))
	}},
	{"map+x/time/rate", "what people write by hand: a map of rate.Limiter behind a mutex, never evicted", func(perSecond float64, _ int) (func(string) (bool, int64), func()) {
		var mu sync.Mutex
		m := map[string]*rate.Limiter{}
		return func(key string) (bool, int64) {
			mu.Lock()
			l := m[key]
			if l == nil {
				l = rate.NewLimiter(rate.Limit(perSecond), int(perSecond))
				m[key] = l
			}
			mu.Unlock()
			return l.Allow(), -1
		}, func() {}
	}, false, func(perSecond float64) string {
		return fmt.Sprintf("rate.NewLimiter(%g, %d)", perSecond, int(perSecond))
	}},
}

// keyStream is a stream of keys of 16 bytes.
type keyStream struct {
	name     string
	keys     []string
	distinct []string // every key the stream draws from
}

// hotStream is one key, every request.
func hotStream() keyStream {
	names := keyNames(1)
	return keyStream{"one hot key", hammer.InRequestOrder(1<<20, func() string { return names[0] }), names}
}

// zipfStream draws from n keys with a zipf law (s = 1.1), uniformStream
// evenly; both long enough to cycle through without a generator in the
// loop.
func zipfStream(n int) keyStream {
	names := keyNames(n)
	z := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, uint64(n-1))
	s := hammer.InRequestOrder(1<<20, func() string { return names[z.Uint64()] })
	return keyStream{fmt.Sprintf("zipf over %d keys", n), s, names}
}

func uniformStream(n int) keyStream {
	names := keyNames(n)
	rng := rand.New(rand.NewSource(2))
	s := hammer.InRequestOrder(1<<20, func() string { return names[rng.Intn(n)] })
	return keyStream{fmt.Sprintf("uniform over %d keys", n), s, names}
}

func keyNames(n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("user-%011d", i)
	}
	return s
}

// perKeyResult is one cell of the per-key table.
type perKeyResult struct {
	impl, stream string
	goroutines   int
	nsPerOp      float64
	allocs       float64
}

// perKeyMem is a limiter's heap per tracked key, and its heap after a
// million distinct keys.
type perKeyMem struct {
	impl         string
	perKey       float64
	afterMillion float64 // MiB
	// evicted is the heap per key of the bound after 4 x bound keys were
	// evicted, one request each (-1: no bound).
	evicted         float64
	distinct, bound int
}

// perKeyAcc is the most one key got in any continuous second, and in any
// of the limiter's own windows (-1: it has none).
type perKeyAcc struct {
	impl      string
	threshold int
	most, own int
}

// perKeyGoroutines are the columns of the per-key table.
var perKeyGoroutines = []int{1, 2, 16, 256}

// perKeySection runs the per-key benchmarks.
func perKeySection(cfg config, tick func(string)) (res []perKeyResult, mem []perKeyMem, acc []perKeyAcc) {
	streams := []keyStream{hotStream(), zipfStream(100_000), uniformStream(1_000_000)}
	distinct, bound := 1_000_000, 100_000
	if cfg.quick {
		streams = []keyStream{hotStream(), zipfStream(10_000), uniformStream(50_000)}
		distinct, bound = 50_000, 5_000
	}
	for _, s := range streams {
		for _, l := range keyLimiters {
			take, done := l.make(hugeKeyRate, 2_000_000)
			// Warm up: every key of the stream tracked.
			for _, k := range s.distinct {
				take(k)
			}
			for _, g := range perKeyGoroutines {
				tick(fmt.Sprintf("per-key %s %s g=%d", l.name, s.name, g))
				keys := s.keys
				ns, allocs, _ := measure(func(id, i int) {
					take(keys[(id*7919+i)&(len(keys)-1)])
				}, g, cfg.duration)
				res = append(res, perKeyResult{impl: l.name, stream: s.name, goroutines: g, nsPerOp: ns, allocs: allocs})
			}
			done()
		}
	}
	names := keyNames(max(distinct, 5*cfg.memN))
	for _, l := range keyLimiters {
		tick("per-key memory " + l.name)
		mem = append(mem, keyMemory(l, names, cfg.memN, distinct, bound))
		tick("per-key accuracy " + l.name)
		acc = append(acc, keyAccuracy(l, cfg.accG, cfg.accDuration))
	}
	return res, mem, acc
}

// hugeKeyRate never blocks a key within a run (and fits a key's window).
const hugeKeyRate = 1e9

// keyMemory measures heap bytes per key over n keys, the same per key of a
// bound of n after 4 x n were evicted (what the limiter remembers of them
// in), and the heap after distinct keys (a million) through a limiter
// bounded to bound (100,000), drawing keys from names (at least distinct
// and 5 x n of them).
func keyMemory(l keyLimiter, names []string, n, distinct, bound int) perKeyMem {
	per := float64(heapGrowth(func() func() {
		take, done := l.make(100, 2*n)
		for _, k := range names[:n] {
			take(k)
		}
		return func() { runtime.KeepAlive(take); done() }
	})) / float64(n)
	after := float64(heapGrowth(func() func() {
		take, done := l.make(100, bound)
		for _, k := range names[:distinct] {
			take(k)
		}
		return func() { runtime.KeepAlive(take); done() }
	})) / (1 << 20)
	evicted := -1.0
	if l.bound {
		// 5 x n distinct keys through a bound of n: 4 x n evicted, with
		// what the limiter remembers of them.
		evicted = float64(heapGrowth(func() func() {
			take, done := l.make(100, n)
			for i := range 5 * n {
				take(names[i])
			}
			return func() { runtime.KeepAlive(take); done() }
		})) / float64(n)
	}
	runtime.KeepAlive(names) // not freed while the heap is measured
	return perKeyMem{impl: l.name, perKey: per, afterMillion: after, evicted: evicted, distinct: distinct, bound: bound}
}

// heapGrowth is how much fill grows the heap by what it keeps until the
// function it returns is called.
func heapGrowth(fill func() func()) int64 {
	before := heap()
	done := fill()
	grown := int64(heap()) - int64(before)
	done()
	return max(grown, 0)
}

// keyAccuracy hammers a few hot keys at 100/s from g goroutines for d and
// returns the most any one key got in a continuous second.
func keyAccuracy(l keyLimiter, g int, d time.Duration) perKeyAcc {
	const threshold, hot = 100, 4
	take, done := l.make(threshold, 1000)
	defer done()
	var mu sync.Mutex
	times := make([][]time.Duration, hot)
	own := make([][]int64, hot)
	start := time.Now()
	var stop atomic.Bool
	var wg sync.WaitGroup
	for id := range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine [hot][]time.Duration
			var mineOwn [hot][]int64
			for i := 0; !stop.Load(); i++ {
				k := (id + i) % hot
				if ok, at := take(fmt.Sprint("hot-", k)); ok {
					mine[k] = append(mine[k], time.Since(start))
					mineOwn[k] = append(mineOwn[k], at)
				}
			}
			mu.Lock()
			for k := range mine {
				times[k] = append(times[k], mine[k]...)
				own[k] = append(own[k], mineOwn[k]...)
			}
			mu.Unlock()
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	most := 0
	for _, ts := range times {
		slices.Sort(ts)
		j := 0
		for i := range ts {
			for ts[i]-ts[j] >= time.Second {
				j++
			}
			most = max(most, i-j+1)
		}
	}
	// leapflow's own windows: 4 buckets of 250 ms from its clock's origin.
	mostOwn := -1
	for _, ats := range own {
		if len(ats) == 0 || ats[0] < 0 {
			continue
		}
		perBucket := map[int64]int{}
		for _, at := range ats {
			perBucket[at/int64(250*time.Millisecond)]++
		}
		for b := range perBucket {
			mostOwn = max(mostOwn, perBucket[b]+perBucket[b-1]+perBucket[b-2]+perBucket[b-3])
		}
	}
	return perKeyAcc{impl: l.name, threshold: threshold, most: most, own: mostOwn}
}

// perKeyTables prints the per-key section (markdown when md).
func (r *report) perKeyTables(w io.Writer, md bool) {
	if md {
		fmt.Fprintf(w, "\n## Per-key limits\n\nOne limit per caller key (16-byte keys), every key tracked after a warm-up; "+
			"ns/op for the whole machine (lower is better), goroutines drawing keys from the stream.\n\n")
		for _, l := range keyLimiters {
			fmt.Fprintf(w, "- **%s**: %s (%s)\n", l.name, l.note, l.config(hugeKeyRate))
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintf(w, "\nPer-key limits: ns/op for the whole machine, 16-byte keys\n")
		for _, l := range keyLimiters {
			fmt.Fprintf(w, "  %s: %s\n", l.name, l.config(hugeKeyRate))
		}
	}
	header := []string{"impl", "stream"}
	for _, g := range perKeyGoroutines {
		header = append(header, fmt.Sprintf("g=%d", g))
	}
	header = append(header, "allocs/op")
	var rows [][]string
	for i := 0; i+len(perKeyGoroutines) <= len(r.perKey); i += len(perKeyGoroutines) {
		cells := []string{r.perKey[i].impl, r.perKey[i].stream}
		var allocs float64
		for _, x := range r.perKey[i : i+len(perKeyGoroutines)] {
			cells = append(cells, fmt.Sprintf("%.1f", x.nsPerOp))
			allocs = max(allocs, x.allocs)
		}
		rows = append(rows, append(cells, fmt.Sprintf("%.2f", allocs)))
	}
	table(w, md, header, rows)
	if md {
		fmt.Fprintf(w, "\nMemory (runtime.MemStats): heap bytes per tracked key over %d keys; the same per key of "+
			"a bound of that many after 4 times as many were evicted in one window, one request each (with what the limiter remembers of "+
			"them); and the heap after %d distinct keys through a limiter of %d keys where it has a bound. Accuracy: %d goroutines on the real clock for %v over 4 hot keys "+
			"at 100/s each; the most one key got in any of its limiter's own windows (leapflow: 4 buckets of 250 ms) and in any "+
			"continuous second (a bucketed window allows up to twice its threshold in a span that straddles its buckets; "+
			"see the accuracy section).\n\n", r.cfg.memN, r.perKeyMem[0].distinct, r.perKeyMem[0].bound, r.cfg.accG, r.cfg.accDuration)
	} else {
		fmt.Fprintf(w, "\nPer-key memory and accuracy (4 hot keys at 100/s, most in any continuous second)\n")
	}
	rows = nil
	for i, m := range r.perKeyMem {
		most, own := "-", "-"
		if i < len(r.perKeyAcc) {
			most = fmt.Sprint(r.perKeyAcc[i].most)
			if r.perKeyAcc[i].own >= 0 {
				own = fmt.Sprint(r.perKeyAcc[i].own)
			}
		}
		evicted := "-"
		if m.evicted >= 0 {
			evicted = fmt.Sprintf("%.0f", m.evicted)
		}
		rows = append(rows, []string{m.impl, fmt.Sprintf("%.0f", m.perKey), evicted, fmt.Sprintf("%.1f", m.afterMillion), own, most})
	}
	table(w, md, []string{"impl", "bytes/key", "bytes/key after 4x evictions", "MiB after the distinct keys", "most in its own windows", "most in 1 s (threshold 100)"}, rows)
}
