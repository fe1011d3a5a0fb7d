package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestRegressSpanExactTurnedOnByReload: a plain 10/s rule admits 10 at
// 0.5 s; at 0.6 s a reload turns the same rule span-exact (only
// SpanExact changes). The span-exact window the reload starts counting in
// never saw the 10 passes the node already holds, so it admits 10 more
// at once: 20 stamps in a 100 ms span, under a rule that is now
// span-exact at 10 per second (a plain reload keeps the node's counts:
// the same rule reloaded plain admits nothing more).
func TestRegressSpanExactTurnedOnByReload(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10})
	st := greedy(t, e, clock, "api", 500*ms)
	assert.Len(t, st, 10)
	clock.Set(600 * ms)
	load(t, e, Rule{Resource: "api", Threshold: 10, SpanExact: true})
	st = append(st, greedy(t, e, clock, "api", 600*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(10),
		"a span-exact 10/s rule: at most 10 in any 1 s span of stamps")
}

// TestRegressSpanExactAddedBesidePlain: the same when the span-exact rule is
// added beside the plain one (a tighter span-exact limit of 10 added to a
// plain 100/s): the passes the plain rule admitted just before are not
// seen by the span-exact window.
func TestRegressSpanExactAddedBesidePlain(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 100})
	clock.Set(500 * ms)
	var st []stamp
	for range 10 {
		en, err := e.Entry("api")
		if err != nil {
			break
		}
		st = append(st, stamp{en.Start(), 1})
		en.Exit(nil)
	}
	load(t, e, Rule{Resource: "api", Threshold: 100}, Rule{Resource: "api", Threshold: 10, SpanExact: true})
	st = append(st, greedy(t, e, clock, "api", 600*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(10))
}

// TestRegressNewIntervalWindowIsSeeded: a reload that adds a rule of
// another StatInterval (a window the resource did not count in yet) gives
// that window what the resource just passed: a 2 s rule of 20 per window
// added after 30 passes admits none of its 20 until they have left it.
func TestRegressNewIntervalWindowIsSeeded(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 100})
	st := greedy(t, e, clock, "api", 500*ms)
	assert.Len(t, st, 100)
	clock.Set(600 * ms)
	load(t, e, Rule{Resource: "api", Threshold: 100}, Rule{Resource: "api", Threshold: 10, StatInterval: 2 * time.Second})
	assert.Empty(t, greedy(t, e, clock, "api", 1600*ms), "the 2 s window holds the 100 passes")
	assert.NotEmpty(t, greedy(t, e, clock, "api", 2700*ms), "once they have left it")
}
