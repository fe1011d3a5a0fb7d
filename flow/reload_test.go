package flow

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// A reload that adds a span-exact rule seeds its window with what the
// resource passed over its span, at the resource's newest bucket even when
// the clock stepped back a little (less than the engine absorbs): the seed
// holds for as long as those passes do, so no span of the interval admits
// more than the new rule allows.
func TestReloadSeedsAtTheNewestBucketAfterASmallStepBack(t *testing.T) {
	oneStripe(t)
	clock := stattest.NewClock(11*time.Second + 1)
	e, err := New(WithClock(clock))
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Threshold: 6})
	for range 4 {
		en, err := e.Entry("api")
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Advance(-50 * time.Millisecond)
	load(t, e, Rule{Resource: "api", Threshold: 6}, Rule{Resource: "api", Threshold: 4, SpanExact: true})
	clock.Set(12 * time.Second)
	assert.Zero(t, drain(e, "api"), "[11s, 12s] holds the 4 passed before the reload already")
	clock.Set(13*time.Second + 200*time.Millisecond)
	assert.Equal(t, 4, drain(e, "api"), "once they left every span")
}
