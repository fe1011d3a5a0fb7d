package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// tenWaiting fills a plain 10/s rule at 100 ms, then has 10 requests
// borrow its bucket at 1 s at 200 ms (returning their stamps), and sets the
// clock to 300 ms, for a reload.
func tenWaiting(t *testing.T) (*Engine, *stattest.Clock, []stamp) {
	t.Helper()
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 10})
	require.Len(t, greedy(t, e, clock, "api", 100*ms), 10)
	clock.Set(200 * ms)
	var st []stamp // the borrowed stamps and what the new rules admit
	for range 10 {
		en, err := e.Entry("api", WithWait(time.Second))
		require.NoError(t, err)
		st = append(st, stamp{en.Start(), 1})
		en.Exit(nil)
	}
	clock.Set(300 * ms)
	return e, clock, st
}

// TestRegressSeedMissesBorrowedSpanExact: requests that borrowed a future
// bucket under the old rules (WithWait) are counted in the node only when
// their bucket lands, so the seed (Node.PassedSince over made buckets) does
// not see them. A reload that turns the rule span-exact then admits its
// whole threshold again within 1 s of their stamps.
func TestRegressSeedMissesBorrowedSpanExact(t *testing.T) {
	e, clock, st := tenWaiting(t)
	load(t, e, Rule{Resource: "api", Threshold: 10, SpanExact: true})
	// The waiters arrive at 1 s (their bucket lands), then 1.45 s.
	st = append(st, greedy(t, e, clock, "api", 1000*ms, 1450*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(time.Second)), int64(10),
		"a span-exact 10/s rule: at most 10 in any 1 s span of stamps")
}

// TestRegressSeedMissesBorrowedNewInterval: the same for a rule of a new
// StatInterval (2 s, 4 buckets: any span under 1.5 s admits at most its 10).
func TestRegressSeedMissesBorrowedNewInterval(t *testing.T) {
	e, clock, st := tenWaiting(t)
	load(t, e, Rule{Resource: "api", Threshold: 10}, Rule{Resource: "api", Threshold: 5, StatInterval: 2 * time.Second})
	// The waiters arrive at 1 s (their bucket lands), then 2.1 s.
	st = append(st, greedy(t, e, clock, "api", 1000*ms, 2100*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(1400*ms)), int64(10),
		"a 2 s rule of 10 with 4 buckets: at most 10 in any span under 1.5 s")
}
