package global

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
	"github.com/leapflow/leapflow/internal/trace"
)

// TestRandomArrivalsMatchTheOracle replays random traces (Poisson,
// bursty, one hot instance) on 1, 4 and 16 instances sharing one global
// rule, and compares what they admitted with the oracle: the same
// bucketed window run in one place on the same sending times. Leases used
// to strand most of the window below the limit, and first leases of 100
// on 16 instances with one hot kept 13% of it from the hot one. Bounds are
// loose (a loaded 2-core machine); the bench reports the ratios.
// Each trace replays in real time (3 s, seven of them), as an exception to
// the 5 s rule for the whole: the windows are on Redis's clock.
func TestRandomArrivalsMatchTheOracle(t *testing.T) {
	srv := redistest.Start(t)
	const d = 3 * time.Second
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		name      string
		threshold int64
		instances int
		trace     []trace.Arrival
		atLeast   float64 // of the oracle
	}{
		{"poisson", 1000, 4, trace.Poisson(rng, 1500, d, 4), 0.9},
		{"poisson-below", 1000, 4, trace.Poisson(rng, 700, d, 4), 0.97},
		{"bursty", 1000, 4, trace.Bursty(rng, 5000, 150*time.Millisecond, 500*time.Millisecond, d, 4), 0.9},
		{"one-hot", 1000, 4, trace.OneHot(rng, 1500, d, 4, 0.9), 0.9},
		{"poisson", 10, 16, trace.Poisson(rng, 20, d, 16), 0.8},
		{"one-hot", 1000, 16, trace.OneHot(rng, 1500, d, 16, 0.9), 0.9},
		{"poisson", 100_000, 1, trace.Poisson(rng, 150_000, d, 1), 0.9},
	} {
		t.Run(fmt.Sprintf("%s/T=%d/instances=%d", tc.name, tc.threshold, tc.instances), func(t *testing.T) {
			audit := NewAudit()
			key := fmt.Sprintf("oracle-%s-%d-%d", tc.name, tc.threshold, tc.instances)
			engs := make([]*flow.Engine, tc.instances)
			res := make([]*flow.Resource, tc.instances)
			for i := range engs {
				src := newSource(t, srv.Client(), WithOnAdmit(audit.Record))
				eng, err := flow.New(flow.WithTokenSource(src))
				require.NoError(t, err)
				require.NoError(t, eng.LoadRules([]flow.Rule{{ID: key, Resource: "api", Threshold: float64(tc.threshold), Global: true, Fallback: flow.FallbackClosed}}))
				engs[i] = eng
				res[i], err = eng.Resource("api")
				require.NoError(t, err)
			}
			outs := trace.Replay(tc.trace, tc.instances, func(i int) bool {
				en, err := res[i].Entry()
				if err != nil {
					return false
				}
				en.Exit(nil)
				return true
			})
			got, want := trace.Admitted(outs), trace.Oracle(outs, tc.threshold, time.Second, 10)
			var fallbacks int64
			for _, eng := range engs {
				snap, _ := eng.Snapshot("api")
				fallbacks += snap.Fallbacks
			}
			t.Logf("%d requests: admitted %d, oracle %d (%.3f), fullest server window %d, fallbacks %d",
				len(outs), got, want, trace.Ratio(got, want), audit.Fullest(time.Second), fallbacks)
			assert.Equal(t, got, audit.Total(), "every admission counted in a server bucket")
			assert.LessOrEqual(t, audit.Fullest(time.Second), tc.threshold, "no server window over the threshold")
			assert.GreaterOrEqual(t, trace.Ratio(got, want), tc.atLeast, "admitted against the oracle")
			assert.Zero(t, fallbacks)
		})
	}
}
