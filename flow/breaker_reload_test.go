package flow

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/stat/stattest"
)

// chain checks that each change a listener hears starts where the last
// one it heard for that breaker ended, and keeps the last state heard.
type chain struct {
	mu     sync.Mutex
	last   map[string]BreakerState
	broken []string
}

func (c *chain) add(ch BreakerChange) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]BreakerState{}
	}
	if was := c.last[ch.Rule]; was != ch.From {
		c.broken = append(c.broken, fmt.Sprintf("%s: heard %v>%v after it was %v", ch.Rule, ch.From, ch.To, was))
	}
	c.last[ch.Rule] = ch.To
}

// reloadedBreaker is the breaker rule the reload tests load, changed
// between thresholds 1 and 2.
func reloadedBreaker(threshold float64) Rule {
	return Rule{ID: "b", Resource: "dep", Breaker: ErrorCount, Threshold: threshold, RetryTimeout: time.Hour}
}

// untilStopped runs body in a loop on n goroutines until the returned
// stop is called, which waits for them.
func untilStopped(n int, body func()) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				body()
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
	}
}

// Reloads that change an open breaker's rule while traffic trips the new
// one: every change the listener hears starts where the last it heard
// ended, and it ends believing what Engine.Breakers says.
func TestAListenerHearsAChainOfChangesAcrossReloads(t *testing.T) {
	var c chain
	e, _ := newEngine(t, stattest.NewClock(time.Second), WithBreakerListener(c.add))
	load(t, e, reloadedBreaker(1))
	var fails atomic.Int64
	stop := untilStopped(4, func() {
		if fail(e, "dep") {
			fails.Inc()
		}
	})
	mismatch := 0
	for i := 0; i < 3000; i++ {
		load(t, e, reloadedBreaker(float64(1+i%2))) // changed every time
		if i%50 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	stop()
	c.mu.Lock()
	heard := c.last["b"]
	broken := c.broken
	c.mu.Unlock()
	actual := e.Breakers()[0].State
	if heard != actual {
		mismatch++
	}
	if len(broken) > 0 || mismatch > 0 {
		kinds := map[string]int{}
		for _, b := range broken {
			kinds[b[len("b: "):]]++
		}
		t.Logf("kinds: %v", kinds)
		n := min(len(broken), 5)
		t.Fatalf("%d failures admitted; listener chain broken %d times, e.g. %v; at the end listener says %v, Breakers says %v",
			fails.Load(), len(broken), broken[:n], heard, actual)
	}
}

// Two open breakers whose rules change together: a listener told the first
// one's reset sends a failure to the second resource; the second's reset
// reaches it before its new breaker's trip, never after.
func TestAResetReachesTheListenerBeforeTheNewBreakersChanges(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var c chain
	var e *Engine
	var arm atomic.Bool
	e, _ = newEngine(t, clock, WithBreakerListener(func(ch BreakerChange) {
		c.add(ch)
		if ch.Rule == "a" && ch.To == BreakerClosed && arm.CompareAndSwap(true, false) {
			fail(e, "B") // traffic on B while the reload reports
		}
	}))
	rules := func(th float64) []Rule {
		return []Rule{
			{ID: "a", Resource: "A", Breaker: ErrorCount, Threshold: th, RetryTimeout: time.Hour},
			{ID: "b", Resource: "B", Breaker: ErrorCount, Threshold: th, RetryTimeout: time.Hour},
		}
	}
	load(t, e, rules(1)...)
	fail(e, "A")
	fail(e, "B")
	load(t, e, rules(1)...)                           // unchanged: kept open
	if err := e.LoadRules(rules(1)[:0]); err != nil { // nothing: both removed
		t.Fatal(err)
	}
	load(t, e, rules(1)...)
	fail(e, "A")
	fail(e, "B")
	r2 := rules(1)
	r2[0].RetryTimeout, r2[1].RetryTimeout = time.Minute, time.Minute // both change
	arm.Store(true)
	load(t, e, r2...)
	c.mu.Lock()
	defer c.mu.Unlock()
	var actual BreakerState
	for _, b := range e.Breakers() {
		if b.Rule.ID == "b" {
			actual = b.State
		}
	}
	if c.last["b"] != actual || len(c.broken) > 0 {
		t.Fatalf("listener ends believing b is %v, Breakers says %v; chain: %v", c.last["b"], actual, c.broken)
	}
}

// Under traffic, after each reload that changes an open breaker's rule,
// traffic paused: what the listener last heard is the state in force.
func TestWhatTheListenerLastHeardIsTheStateInForce(t *testing.T) {
	var c chain
	e, _ := newEngine(t, stattest.NewClock(time.Second), WithBreakerListener(c.add))
	load(t, e, reloadedBreaker(1))
	var gate sync.RWMutex
	stop := untilStopped(3, func() {
		gate.RLock()
		fail(e, "dep")
		gate.RUnlock()
	})
	bad := 0
	for i := 0; i < 3000; i++ {
		load(t, e, reloadedBreaker(float64(1+i%2)))
		gate.Lock()
		c.mu.Lock()
		heard := c.last["b"]
		c.mu.Unlock()
		if actual := e.Breakers()[0].State; heard != actual {
			bad++
			if bad <= 3 {
				t.Errorf("reload %d: listener last heard %v, breaker in force is %v", i, heard, actual)
			}
		}
		gate.Unlock()
	}
	stop()
	if bad > 0 {
		t.Errorf("%d of 3000 reloads left the listener wrong", bad)
	}
}
