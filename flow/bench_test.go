package flow

import (
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/leapflow/leapflow/internal/clocks"
	"github.com/leapflow/leapflow/internal/hammer"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

func benchEngine(b *testing.B, clock stat.Clock) *Engine {
	e, err := New(WithClock(clock))
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]Rule{
		{Resource: "pass", Threshold: 1e12},
		{Resource: "block", Threshold: 10},
	}); err != nil {
		b.Fatal(err)
	}
	return e
}

func benchClocks(b *testing.B) map[string]stat.Clock {
	coarse := clocks.NewCoarse(time.Millisecond)
	b.Cleanup(coarse.Stop)
	return map[string]stat.Clock{"monotonic": stat.NewMonotonic(), "coarse": coarse}
}

// BenchmarkEntryExit is the pass path: Entry, then Exit, under a QPS rule
// that never blocks.
func BenchmarkEntryExit(b *testing.B) {
	for name, clock := range benchClocks(b) {
		e := benchEngine(b, clock)
		b.Run("clock="+name, func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
				for range n {
					en, err := e.Entry("pass")
					if err != nil {
						panic(err)
					}
					en.Exit(nil)
				}
			})
		})
	}
}

// BenchmarkEntryBlocked is the block path: a full window.
func BenchmarkEntryBlocked(b *testing.B) {
	for name, clock := range benchClocks(b) {
		e := benchEngine(b, clock)
		for range 10 {
			_, _ = e.Entry("block")
		}
		b.Run("clock="+name, func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
				for range n {
					// The real clock frees 10 slots a second; take them.
					if en, err := e.Entry("block"); err == nil {
						en.Exit(nil)
					}
				}
			})
		})
	}
}

// BenchmarkEntryBlockedTwoRules is the blocked path of the usual
// production shape: a Global rule (on a token source that admits without
// a call out) and a PerKey rule, the per-key one refusing every request
// of its one key. Global rules are asked last, so the refusal never
// reaches the source; the key's lookup (two hashes of it) and its
// window's retry time are what it costs beyond EntryBlocked.
func BenchmarkEntryBlockedTwoRules(b *testing.B) {
	for name, clock := range benchClocks(b) {
		e, err := New(WithClock(clock), WithTokenSource(stubSource))
		if err != nil {
			b.Fatal(err)
		}
		if err := e.LoadRules([]Rule{
			{Resource: "two", Threshold: 1e9, Global: true},
			{Resource: "two", Threshold: 10, PerKey: true},
		}); err != nil {
			b.Fatal(err)
		}
		key := WithKey("caller-1")
		for range 10 {
			_, _ = e.Entry("two", key)
		}
		b.Run("clock="+name, func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
				for range n {
					// The real clock frees 10 slots a second; take them.
					if en, err := e.Entry("two", key); err == nil {
						en.Exit(nil)
					}
				}
			})
		})
	}
}

// BenchmarkClock is the cost of one clock read.
func BenchmarkClock(b *testing.B) {
	for name, clock := range benchClocks(b) {
		b.Run("clock="+name, func(b *testing.B) {
			var sink int64
			for b.Loop() {
				sink += clock.Now()
			}
			_ = sink
		})
	}
}

// BenchmarkResourceEntryExit is the pass path through a Resource handle.
func BenchmarkResourceEntryExit(b *testing.B) {
	for name, clock := range benchClocks(b) {
		e := benchEngine(b, clock)
		r, err := e.Resource("pass")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("clock="+name, func(b *testing.B) { sweepEntryExit(b, r) })
	}
}

// BenchmarkBreakerEntryExit is BenchmarkResourceEntryExit's pass path on
// a resource that also holds a slow-ratio circuit breaker, closed: the
// breaker's state read at Entry, its window counted at Exit.
func BenchmarkBreakerEntryExit(b *testing.B) {
	for name, clock := range benchClocks(b) {
		e, err := New(WithClock(clock))
		if err != nil {
			b.Fatal(err)
		}
		if err := e.LoadRules([]Rule{{Resource: "guarded", Threshold: 1e12},
			{Resource: "guarded", Breaker: SlowRatio, Threshold: 0.5, MaxRT: time.Hour, MinRequests: 5, RetryTimeout: time.Second}}); err != nil {
			b.Fatal(err)
		}
		r, err := e.Resource("guarded")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("clock="+name, func(b *testing.B) { sweepEntryExit(b, r) })
	}
}

// BenchmarkSystemEntryExit is BenchmarkResourceEntryExit's pass path on an
// inbound resource that also holds a SystemBBR rule, its CPU reading over
// the threshold: the rule sheds, and its check admits (fewer in flight
// than the resource has shown it completes).
func BenchmarkSystemEntryExit(b *testing.B) {
	for name, clock := range benchClocks(b) {
		m := &fakeMeter{}
		m.set(0.95)
		e, err := New(WithClock(clock), WithCPU(m))
		if err != nil {
			b.Fatal(err)
		}
		if err := e.LoadRules([]Rule{{Resource: "inbound", Threshold: 1e12},
			{Resource: "inbound", System: SystemBBR, Threshold: 0.8}}); err != nil {
			b.Fatal(err)
		}
		r, err := e.Resource("inbound")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("clock="+name, func(b *testing.B) {
			sweepEntryExit(b, r)
			if s := e.Systems(); len(s) != 1 || !s[0].Shedding {
				b.Fatalf("the rule is not shedding: %+v", s)
			}
		})
	}
}

// BenchmarkResources is Entry+Exit round-robin through the handles of N
// resources, each with a QPS rule that never blocks: what a resource costs
// as their number grows past the caches (each goroutine starts at its own
// place in the round).
func BenchmarkResources(b *testing.B) {
	coarse := clocks.NewCoarse(time.Millisecond)
	b.Cleanup(coarse.Stop)
	for _, n := range []int{1, 100, 10_000} {
		e, err := New(WithClock(coarse), WithMaxResources(n))
		if err != nil {
			b.Fatal(err)
		}
		rules := make([]Rule, n)
		handles := make([]*Resource, n)
		for i := range rules {
			rules[i] = Rule{Resource: fmt.Sprintf("r%05d", i), Threshold: 1e12}
		}
		if err := e.LoadRules(rules); err != nil {
			b.Fatal(err)
		}
		for i := range handles {
			if handles[i], err = e.Resource(rules[i].Resource); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprintf("resources=%d", n), func(b *testing.B) {
			hammer.Sweep(b, []int{1, 2}, func(id, k int) {
				i := id * 7919
				for range k {
					en, err := handles[i%n].Entry()
					if err != nil {
						panic(err)
					}
					en.Exit(nil)
					i++
				}
			})
		})
	}
}

// BenchmarkNoRuleEntryExit is Entry+Exit through the handle of a resource
// without rules: its statistics alone, the least a counted request costs.
func BenchmarkNoRuleEntryExit(b *testing.B) {
	for name, clock := range benchClocks(b) {
		e := benchEngine(b, clock)
		r, err := e.Resource("unruled")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("clock="+name, func(b *testing.B) { sweepEntryExit(b, r) })
	}
}

// zipfKeys is a zipf-distributed stream of n keys of 16 bytes (s = 1.1),
// long enough to cycle through without the generator in the loop.
func zipfKeys(n int) []string {
	z := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, uint64(n-1))
	return hammer.InRequestOrder(1<<20, func() string { return fmt.Sprintf("user-%011d", z.Uint64()) })
}

// BenchmarkPerKeyEntryExit is Entry+Exit through a resource handle under a
// PerKey QPS rule that never blocks, keys drawn from a zipf stream over
// 100,000 keys (all tracked after the warm-up), beside the same handle
// with a plain rule: the per-key price.
func BenchmarkPerKeyEntryExit(b *testing.B) {
	coarse := clocks.NewCoarse(time.Millisecond)
	b.Cleanup(coarse.Stop)
	stream := zipfKeys(100_000)
	for _, perKey := range []bool{false, true} {
		e, err := New(WithClock(coarse))
		if err != nil {
			b.Fatal(err)
		}
		if err := e.LoadRules([]Rule{{Resource: "api", Threshold: 1e9, PerKey: perKey}}); err != nil {
			b.Fatal(err)
		}
		r, err := e.Resource("api")
		if err != nil {
			b.Fatal(err)
		}
		for _, k := range stream {
			en, _ := r.Entry(WithKey(k))
			en.Exit(nil)
		}
		b.Run(fmt.Sprintf("perKey=%v", perKey), func(b *testing.B) {
			hammer.Sweep(b, hammer.Goroutines, func(id, n int) {
				i := id * 7919
				for range n {
					en, err := r.Entry(WithKey(stream[i&(len(stream)-1)]))
					if err != nil {
						panic(err)
					}
					en.Exit(nil)
					i++
				}
			})
		})
	}
}

// BenchmarkPerKeyEvicting is Entry+Exit under a PerKey QPS rule that
// never blocks, keys drawn uniformly from 1,000,000 through a table of
// 100,000: nine requests in ten bring a key the table lacks, which evicts
// another (active: the window is a second) and takes its state. It
// allocates nothing.
func BenchmarkPerKeyEvicting(b *testing.B) {
	coarse := clocks.NewCoarse(time.Millisecond)
	b.Cleanup(coarse.Stop)
	e, err := New(WithClock(coarse))
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]Rule{{Resource: "api", Threshold: 1e9, PerKey: true, MaxKeys: 100_000}}); err != nil {
		b.Fatal(err)
	}
	r, err := e.Resource("api")
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewSource(2))
	stream := hammer.InRequestOrder(1<<20, func() string { return fmt.Sprintf("user-%011d", rng.Intn(1_000_000)) })
	for _, k := range stream[:300_000] { // full, and evicting
		en, _ := r.Entry(WithKey(k))
		en.Exit(nil)
	}
	hammer.Sweep(b, []int{1, 2}, func(id, n int) {
		i := id * 7919
		for range n {
			en, err := r.Entry(WithKey(stream[i&(len(stream)-1)]))
			if err != nil {
				panic(err)
			}
			en.Exit(nil)
			i++
		}
	})
}

// BenchmarkPerKeyHotKeys is Entry+Exit on a PerKey rule that never blocks
// with every goroutine on 4 hot keys: each key's state is one counter that
// all cores write.
func BenchmarkPerKeyHotKeys(b *testing.B) {
	coarse := clocks.NewCoarse(time.Millisecond)
	b.Cleanup(coarse.Stop)
	e, err := New(WithClock(coarse))
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]Rule{{Resource: "api", Threshold: 1e9, PerKey: true}}); err != nil {
		b.Fatal(err)
	}
	r, err := e.Resource("api")
	if err != nil {
		b.Fatal(err)
	}
	keys := []string{"hot-0", "hot-1", "hot-2", "hot-3"}
	hammer.Sweep(b, hammer.Goroutines, func(id, n int) {
		for i := range n {
			en, err := r.Entry(WithKey(keys[(id+i)&3]))
			if err != nil {
				panic(err)
			}
			en.Exit(nil)
		}
	})
}

// BenchmarkGCRAEntryExit is the pass path of a GCRA rule and of a
// span-exact Reject rule that never block, through a Resource handle,
// beside a plain Reject rule's (the bound: within 1.5x at 1 and 2
// goroutines).
func BenchmarkGCRAEntryExit(b *testing.B) {
	e, err := New()
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]Rule{
		{Resource: "reject", Threshold: 1e12},
		{Resource: "gcra", Threshold: 1e12, Behavior: GCRA, Burst: maxBurst},
		{Resource: "span-exact", Threshold: 1e12, SpanExact: true},
	}); err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"reject", "gcra", "span-exact"} {
		r, err := e.Resource(name)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					en, err := r.Entry()
					if err != nil {
						panic(err)
					}
					en.Exit(nil)
				}
			})
		})
	}
}

// BenchmarkMultiRuleEntryExit is the general path: a resource with a
// Reject and a Concurrency rule (two kinds, so no short path), admitted
// and refused, on a clock that does not move.
func BenchmarkMultiRuleEntryExit(b *testing.B) {
	e, err := New(WithClock(stattest.NewClock(time.Second)))
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]Rule{
		{Resource: "pass", Threshold: 1e12},
		{Resource: "pass", Metric: Concurrency, Threshold: 1e12},
		{Resource: "block", Threshold: 1e12, Metric: Concurrency},
		{Resource: "block", Threshold: 10},
	}); err != nil {
		b.Fatal(err)
	}
	for range 20 {
		if en, err := e.Entry("block"); err == nil {
			en.Exit(nil)
		}
	}
	for _, name := range []string{"pass", "block"} {
		b.Run("path="+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if en, err := e.Entry(name); err == nil {
					en.Exit(nil)
				}
			}
		})
	}
}

// BenchmarkResourceEntryExitBusy is ResourceEntryExit's plain rule on an
// engine that also holds, on other resources, one rule of every kind (a
// Global one on a token source that admits without a call out) and a
// started feed: a rule pays only for what it uses, so it runs as fast as
// ResourceEntryExit.
func BenchmarkResourceEntryExitBusy(b *testing.B) {
	for name, clock := range benchClocks(b) {
		e, err := New(WithClock(clock), WithTokenSource(stubSource))
		if err != nil {
			b.Fatal(err)
		}
		if err := e.LoadRules(everyKind()); err != nil {
			b.Fatal(err)
		}
		feed := e.Feed()
		feed.Start()
		b.Cleanup(feed.Close)
		r, err := e.Resource("plain")
		if err != nil {
			b.Fatal(err)
		}
		b.Run("clock="+name, func(b *testing.B) { sweepEntryExit(b, r) })
	}
}

// sweepEntryExit is Entry+Exit through handle r at every goroutine count
// of the sweep; every request must be admitted.
func sweepEntryExit(b *testing.B, r *Resource) {
	hammer.Sweep(b, hammer.Goroutines, func(_, n int) {
		for range n {
			en, err := r.Entry()
			if err != nil {
				panic(err)
			}
			en.Exit(nil)
		}
	})
}
