package flow

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// randomRule is one rule of a random kind on resource.
func randomRule(rng *rand.Rand, resource string) Rule {
	th := float64(rng.IntN(12))
	if rng.IntN(4) == 0 {
		th += 0.5
	}
	r := Rule{Resource: resource, Threshold: th}
	switch rng.IntN(15) {
	case 0, 1: // plain Reject, on one of three windows
		r.StatInterval = []time.Duration{0, 500 * time.Millisecond, 2 * time.Second}[rng.IntN(3)]
	case 2:
		r.SpanExact = true
	case 3:
		r.PerKey = true
		if rng.IntN(3) == 0 {
			r.Keys = []KeyLimit{{Key: "a", Threshold: th + 3}}
		}
	case 4:
		r.PerKey, r.Metric = true, Concurrency
	case 5:
		r.Behavior, r.Burst = GCRA, 1+rng.IntN(3)
	case 6:
		r.Metric = Concurrency
	case 7:
		r.Behavior, r.MaxQueueing = Throttle, time.Duration(rng.IntN(2))*100*time.Millisecond
	case 8:
		r.Behavior, r.WarmUpPeriod = WarmUp, time.Second
	case 9:
		r.RelatedResource = "other"
	case 10:
		r.DryRun = true
	case 11:
		r.Global, r.Fallback = true, []Fallback{FallbackLocal, FallbackOpen, FallbackClosed}[rng.IntN(3)]
		r.PerKey = rng.IntN(3) == 0
	case 12:
		r.Breaker, r.Threshold, r.RetryTimeout = ErrorCount, float64(1+rng.IntN(3)), 200*time.Millisecond
	case 13:
		r.System, r.Threshold = []SystemCheck{SystemCPU, SystemBBR}[rng.IntN(2)], 0.5
	case 14:
		r.System, r.Threshold, r.MaxRT = SystemRT, 0, time.Duration(1+rng.IntN(100))*time.Millisecond
	}
	return r
}

// flipMeter reads hot and cool in turn, 300 ms each of its clock: the
// same readings on two engines whose clocks agree.
type flipMeter struct{ c *stattest.Clock }

func (m flipMeter) CPUUsage() float64 {
	if m.c.Now()/int64(300*time.Millisecond)%2 == 0 {
		return 0.9
	}
	return 0.1
}

// TestShortPathsDecideAsTheGeneralChecker loads random rule sets of every
// kind into two engines, one with the short paths shortPaths chooses and
// one with none (generalOnly: every request goes through the general
// checker), drives both with the same random requests on fake clocks (by
// name and through handles, batches, keys, waits, exits, a resource
// without rules, global rules on a source that admits, refuses and fails
// in a fixed pattern), and requires every decision, everything a refusal says and the
// statistics to be the same. Every short path is taken on the way.
func TestShortPathsDecideAsTheGeneralChecker(t *testing.T) {
	// One P: both engines' windows have one stripe, so the two requests of
	// a step count on the same stripe (with more, the goroutine may move
	// between them, and a stripe's unused lease is counted as committed).
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	rng := rand.New(rand.NewPCG(11, 23))
	taken := map[string]int{}
	for set := range 300 {
		var rules []Rule
		for range 1 + rng.IntN(3)*rng.IntN(2) { // one rule half the time
			rules = append(rules, randomRule(rng, "api"))
		}
		if rng.IntN(2) == 0 {
			rules = append(rules, Rule{Resource: "other", Threshold: float64(1 + rng.IntN(5))})
		}
		engines := [2]*Engine{}
		clocks := [2]*stattest.Clock{}
		errs := [2]error{}
		for i := range engines {
			clocks[i] = stattest.NewClock(time.Hour)
			// A token source that admits two calls in three and fails every
			// seventh: the same answers to the same calls on both engines.
			calls := 0
			src := sourceFunc(func(context.Context, GlobalRequest) (bool, error) {
				calls++
				if calls%7 == 0 {
					return false, errors.New("down")
				}
				return calls%3 != 0, nil
			})
			e, err := New(WithClock(clocks[i]), WithTokenSource(src), WithCPU(flipMeter{clocks[i]}),
				WithSleep(func(ctx context.Context, _ time.Duration) error { return ctx.Err() }))
			require.NoError(t, err)
			e.generalOnly = i == 1
			errs[i] = e.LoadRules(rules)
			engines[i] = e
		}
		require.Equal(t, errs[0] == nil, errs[1] == nil, "set %d: %v", set, rules)
		if errs[0] != nil {
			continue
		}
		short, general := engines[0], engines[1]
		if rr := short.rules.Load().byResource["api"]; rr != nil {
			if rr.single != nil {
				taken["single"]++
			}
			if rr.singleKey != nil {
				taken["single key"]++
			}
			if rr.singleGCRA != nil {
				taken["single GCRA"]++
			}
			if rr.breakersOnly {
				taken["breakers only"]++
			}
		}
		for _, rr := range general.rules.Load().byResource {
			require.True(t, rr.single == nil && rr.singleKey == nil && rr.singleGCRA == nil && !rr.breakersOnly, "generalOnly takes no short path")
		}
		var handles [2]map[string]*Resource
		for i, e := range engines {
			handles[i] = map[string]*Resource{}
			for _, name := range []string{"api", "other", "free"} {
				h, err := e.Resource(name)
				require.NoError(t, err)
				handles[i][name] = h
			}
		}
		var open [2][]Entry
		for step := range 200 {
			d := time.Duration(rng.IntN(80)) * time.Millisecond
			clocks[0].Advance(d)
			clocks[1].Advance(d)
			res := []string{"api", "api", "api", "other", "free"}[rng.IntN(5)]
			n := 1
			if rng.IntN(4) == 0 {
				n += rng.IntN(3)
			}
			var opts [2][]EntryOption
			if n > 1 {
				opts[0] = append(opts[0], WithCount(n))
			}
			opts[1] = append(opts[1], WithCount(n)) // the option-free paths are short ones too
			if rng.IntN(3) == 0 {
				k := WithKey(string(rune('a' + rng.IntN(3))))
				opts[0], opts[1] = append(opts[0], k), append(opts[1], k)
			}
			if rng.IntN(5) == 0 {
				w := WithWait(time.Duration(rng.IntN(400)) * time.Millisecond)
				opts[0], opts[1] = append(opts[0], w), append(opts[1], w)
			}
			byHandle := rng.IntN(2) == 0
			var ens [2]Entry
			var errs [2]error
			for i, e := range engines {
				if byHandle {
					ens[i], errs[i] = handles[i][res].Entry(opts[i]...)
				} else {
					ens[i], errs[i] = e.Entry(res, opts[i]...)
				}
			}
			where := fmt.Sprintf("set %d step %d %s n=%d: %v", set, step, res, n, rules)
			require.Equal(t, errs[0] == nil, errs[1] == nil, "%s: %v / %v", where, errs[0], errs[1])
			if errs[0] != nil {
				require.Equal(t, errs[0].Error(), errs[1].Error(), where)
				var be *BlockError
				if errors.As(errs[0], &be) {
					ra, rb := ens[0].Refusal(), ens[1].Refusal()
					require.NotNil(t, ra.Err, where)
					require.Equal(t, ra.Err.Error(), rb.Err.Error(), where)
					ra.Err, rb.Err = nil, nil
					require.Equal(t, ra, rb, where)
				}
			}
			require.Equal(t, ens[0].seen(), ens[1].seen(), where)
			require.Equal(t, ens[0].Start(), ens[1].Start(), where)
			open[0], open[1] = append(open[0], ens[0]), append(open[1], ens[1])
			if rng.IntN(3) == 0 {
				for i := range open {
					for j := range open[i] {
						var err error
						if j%3 == 0 { // failures, for the breakers
							err = errors.New("failed")
						}
						open[i][j].Exit(err)
					}
					open[i] = open[i][:0]
				}
			}
		}
		for _, name := range []string{"api", "other", "free"} {
			sa, oka := short.Snapshot(name)
			sb, okb := general.Snapshot(name)
			require.Equal(t, oka, okb, name)
			require.Equal(t, sa, sb, "set %d %s: %v", set, name, rules)
		}
	}
	for _, path := range []string{"single", "single key", "single GCRA", "breakers only"} {
		require.Positive(t, taken[path], "the %s short path was taken", path)
	}
}
