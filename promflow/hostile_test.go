package promflow

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

func advPassed(t *testing.T, reg *prometheus.Registry, res string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "leapflow_requests_passed_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "resource" && l.GetValue() == res {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

// A Throttle request queued behind a Reject rule holds a pass in the
// second window; cancelled after its second was delivered, the pass is
// taken back "late": the next delivered second carries Pass -1 and the
// Prometheus counter goes down.
func TestHostileCounterDecreasesOnLateCancel(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	sleeping := make(chan struct{}, 1)
	eng, err := flow.New(flow.WithClock(clock), flow.WithSleep(func(ctx context.Context, d time.Duration) error {
		sleeping <- struct{}{}
		<-ctx.Done()
		return ctx.Err()
	}))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{
		{ID: "qps", Resource: "api", Threshold: 100},
		{ID: "pace", Resource: "api", Behavior: flow.Throttle, Threshold: 1, MaxQueueing: 10 * time.Second},
	}))
	c := New(eng)
	defer eng.Feed().Close()
	defer c.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)

	clock.Set(11*time.Second + 100*time.Millisecond)
	en, err := eng.Entry("api") // no wait
	require.NoError(t, err)
	en.Exit(nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := eng.Entry("api", flow.WithContext(ctx)) // queued 1 s
		done <- err
	}()
	<-sleeping
	clock.Set(14 * time.Second)
	eng.Feed().Poll()
	before := advPassed(t, reg, "api")
	require.Equal(t, 2.0, before, "second 11: both passes")
	cancel()
	require.Error(t, <-done)
	clock.Set(16 * time.Second)
	eng.Feed().Poll()
	after := advPassed(t, reg, "api")
	require.GreaterOrEqual(t, after, before, "a counter must never decrease across scrapes")
}

// Resource names are arbitrary bytes (stat only checks the length; an
// httpflow.WithResource may use request paths): one that is not valid
// UTF-8 makes MustNewConstMetric panic inside Collect. client_golang
// recovers it, but Gather fails (promhttp answers 500 by default) and every
// resource sorted after it is missing from the scrape.
func TestHostileInvalidUTF8ResourceName(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock, flow.Rule{Resource: "ok", Threshold: 100})
	c := New(eng)
	defer c.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	clock.Set(11*time.Second + time.Millisecond)
	for _, res := range []string{"bad\xff", "ok"} {
		en, err := eng.Entry(res)
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Set(13 * time.Second)
	eng.Feed().Poll()
	_, err := reg.Gather()
	require.NoError(t, err, "one hostile name must not fail the whole scrape")
}
