package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reservation cancelled after its instant has passed (never entered)
// stays counted as a pass in the resource's statistics.
func TestRegressLateCancelCountsAsPass(t *testing.T) {
	for _, cancelAt := range []time.Duration{1200 * ms, 1700 * ms, 2600 * ms, 5 * time.Second} {
		t.Run(cancelAt.String(), func(t *testing.T) {
			e, clock, _ := waitEngine(t)
			load(t, e, Rule{Resource: "api", Threshold: 4})
			clock.Set(100 * ms)
			for range 4 {
				en, err := e.Entry("api")
				require.NoError(t, err)
				en.Exit(nil)
			}
			r, err := e.Reserve("api")
			require.NoError(t, err)
			require.Equal(t, 900*ms, r.Delay())
			// Traffic goes on; the reservation is never entered.
			for now := 1100 * ms; now <= cancelAt; now += 100 * ms {
				clock.Set(now)
				if en, err := e.Entry("api"); err == nil {
					en.Exit(nil)
				}
			}
			clock.Set(cancelAt)
			r.Cancel()
			clock.Set(10 * time.Second)
			snap, _ := e.Snapshot("api")
			assert.Equal(t, int64(0), snap.Inflight, "a cancelled reservation is not in flight")
			assert.Equal(t, snap.MinuteSuccess, snap.MinutePass, "every pass counted was entered and exited")
		})
	}
}
