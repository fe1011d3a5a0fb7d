package flow

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// gatedSleeper hands every wait to the test, which decides when it ends
// and how (nil: the wait ran its course; an error: the context ended).
// It never moves the clock: a waiter's Entry.Start is now + its wait.
type gatedSleeper struct{ calls chan gatedWait }

type gatedWait struct {
	d   time.Duration
	end chan error
}

func (s *gatedSleeper) sleep(ctx context.Context, d time.Duration) error {
	w := gatedWait{d: d, end: make(chan error)}
	s.calls <- w
	return <-w.end
}

type enterResult struct {
	en  Entry
	err error
}

// startWaiter runs one Entry with a long wait in a goroutine and returns
// its sleep call (so the request holds what it took) and its result.
func startWaiter(e *Engine, s *gatedSleeper, res string) (gatedWait, chan enterResult) {
	out := make(chan enterResult, 1)
	go func() {
		en, err := e.Entry(res, WithWait(time.Hour))
		out <- enterResult{en, err}
	}()
	return <-s.calls, out
}

// giveBackScenario: k waiters take slots 1..k ahead, m more take k+1..k+m
// and go, then the first k cancel; m new waiters follow. Returns the
// stamps of every admitted request.
func giveBackScenario(t *testing.T, rule Rule, k, m int) []stamp {
	clock := stattest.NewClock(0)
	s := &gatedSleeper{calls: make(chan gatedWait)}
	e, err := New(WithClock(clock), WithSleep(s.sleep))
	require.NoError(t, err)
	load(t, e, rule)
	var st []stamp
	// A: the burst, at once.
	en, err := e.Entry("api")
	require.NoError(t, err)
	st = append(st, stamp{en.Start(), 1})
	en.Exit(nil)
	// B1..Bk wait (and will cancel).
	var bw []gatedWait
	var bo []chan enterResult
	for range k {
		w, o := startWaiter(e, s, "api")
		bw, bo = append(bw, w), append(bo, o)
	}
	// C1..Cm wait and go.
	for range m {
		w, o := startWaiter(e, s, "api")
		w.end <- nil
		r := <-o
		require.NoError(t, r.err)
		st = append(st, stamp{r.en.Start(), 1})
		r.en.Exit(nil)
	}
	// B1..Bk's contexts end: they give back what they took.
	for i := range k {
		bw[i].end <- context.Canceled
		r := <-bo[i]
		require.ErrorIs(t, r.err, context.Canceled)
	}
	// D1..Dm wait and go.
	for range m {
		w, o := startWaiter(e, s, "api")
		w.end <- nil
		r := <-o
		require.NoError(t, r.err)
		st = append(st, stamp{r.en.Start(), 1})
		r.en.Exit(nil)
	}
	return st
}

// TestRegressGCRACancelOverAdmits: a GCRA waiter whose context ends gives back
// its whole cost (tat -= n x interval) even when later requests reserved
// tokens behind it, so new requests are scheduled on top of the survivors:
// the rule admits twice its rate. (x/time/rate's CancelAt restores only the
// tokens not reserved after the cancelled reservation.)
func TestRegressGCRACancelOverAdmits(t *testing.T) {
	const k, m = 10, 10
	st := giveBackScenario(t, Rule{Resource: "api", Threshold: 1, Behavior: GCRA, Burst: 1}, k, m)
	// At 1/s with Burst 1, a span of L seconds holds at most 1 + L (+1).
	l := int64(m) * int64(time.Second)
	assert.LessOrEqual(t, mostInSpan(st, l), int64(1+m+1), "GCRA 1/s burst 1: stamps %v", st)
}

// TestRegressThrottleCancelOverAdmits: the same for a Throttle rule: the
// cancelled slots are given back by moving the timeline's head back by
// their cost, under slots others hold, so two requests get the same slot.
func TestRegressThrottleCancelOverAdmits(t *testing.T) {
	const k, m = 10, 10
	st := giveBackScenario(t, Rule{Resource: "api", Threshold: 1, Behavior: Throttle, MaxQueueing: time.Millisecond}, k, m)
	// Throttle at 1/s: consecutive stamps at least 1 s apart.
	l := int64(m) * int64(time.Second)
	assert.LessOrEqual(t, mostInSpan(st, l), int64(m), "Throttle 1/s: stamps %v", st)
}
