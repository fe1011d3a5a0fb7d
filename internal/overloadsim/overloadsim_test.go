package overloadsim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// base is the service the tests and the bench simulate: 8 workers of
// 10 ms (±10%), 800 requests per second.
func base(load float64, rules ...flow.Rule) Config {
	return Config{Workers: 8, Service: 10 * time.Millisecond, Jitter: 0.1, Load: load, Warm: 2 * time.Second,
		Run: 20 * time.Second, Skip: 5 * time.Second, Seed: 7, Rules: rules}
}

// BBR is the adaptive rule the tests and the bench put in front.
var BBR = []flow.Rule{{Resource: "inbound", System: flow.SystemBBR, Threshold: 0.8}}

// Under 3x overload, a service without admission queues without bound;
// with a SystemBBR rule it completes within 10% of its capacity, sheds
// the rest, and its p99 stays within twice the unloaded one, whatever the
// arrivals (seeds). Simulated time: the figures are the model's, exact
// and repeatable, not timings of this machine.
func TestBBRKeepsGoodputAndLatencyUnderOverload(t *testing.T) {
	unloaded, err := Simulate(base(0.5))
	require.NoError(t, err)
	without, err := Simulate(base(3))
	require.NoError(t, err)
	with, err := Simulate(base(3, BBR...))
	require.NoError(t, err)
	for seed := range uint64(6) {
		c := base(3, BBR...)
		c.Seed = 100 + seed
		r, err := Simulate(c)
		require.NoError(t, err)
		t.Logf("seed %d: goodput %.0f/s p99 %v", c.Seed, r.Goodput, r.P99)
		assert.GreaterOrEqual(t, r.Goodput, 0.9*r.Capacity, "seed %d", c.Seed)
		assert.LessOrEqual(t, r.P99, 2*unloaded.P99, "seed %d", c.Seed)
	}
	for name, r := range map[string]Result{"unloaded": unloaded, "without": without, "with": with} {
		t.Logf("%-8s goodput %.0f/s of %.0f, p50 %v p99 %v, shed %d of %d, max queue %d", name, r.Goodput, r.Capacity, r.P50, r.P99, r.Shed, r.Arrived, r.MaxQueue)
	}
	assert.Greater(t, without.P99, 100*unloaded.P99, "without admission the queue grows")
	assert.Zero(t, without.Shed)
	assert.GreaterOrEqual(t, with.Goodput, 0.9*with.Capacity)
	assert.LessOrEqual(t, with.P99, 2*unloaded.P99)
	assert.Greater(t, with.Shed, with.Arrived/2, "about two in three shed")
}
