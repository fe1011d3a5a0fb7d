package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestRegressSpanExactStampAheadOfItsBucket: a resource with a span-exact rule
// (12 per 500 ms, buckets of 50 ms) and a plain rule (1 s window, buckets
// of 250 ms). An Exit at 1.26 s makes the plain window's bucket of 1.25 s;
// the clock then steps back 90 ms (under the 100 ms the engine absorbs, so
// readings pass through and are clamped to each window's newest bucket).
// A request at 1.17 s is counted in the span window's bucket of 1.15 s but
// stamped 1.25 s (check moves now to the plain window's bucket start), two
// span buckets after the one it is counted in: that bucket leaves the span
// window at 1.70 s, and the span [1.25 s, 1.75 s) of the engine's own
// stamps holds about twice the threshold. (A single span-exact rule
// stamps at its own bucket's start; the proof in the package doc assumes
// every pass is stamped in the bucket it is counted in.)
func TestRegressSpanExactStampAheadOfItsBucket(t *testing.T) {
	clock := stattest.NewClock(0)
	e, _ := newEngine(t, clock)
	load(t, e,
		Rule{Resource: "api", Threshold: 24, StatInterval: 500 * ms, SpanExact: true},
		Rule{Resource: "api", Threshold: 1000})
	var st []stamp
	clock.Set(time.Second)
	en, err := e.Entry("api")
	require.NoError(t, err)
	st = append(st, stamp{en.Start(), 1})
	clock.Set(1260 * ms)
	en.Exit(nil) // makes the 1 s window's bucket of 1.25 s
	clock.Set(1170 * ms)
	st = append(st, greedy(t, e, clock, "api", 1170*ms, 1700*ms)...)
	t.Logf("stamps: %v", st)
	assert.LessOrEqual(t, mostInSpan(st, int64(500*ms)), int64(12))
}
