package global

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global/redistest"
)

// TestPartialLoadIsAdmitted: evenly spaced load under the threshold is
// admitted through the default leasing, and no server window holds more
// than the threshold. Leases used to strand most of the window (at 200/s
// and 900/s of 1000/s, 58% and 21% admitted on the dev machine): unspent
// tokens now go back to their bucket with the next call, and a lease is
// topped up within its bucket only when it would run out before the end.
func TestPartialLoadIsAdmitted(t *testing.T) {
	srv := redistest.Start(t)
	audit := NewAudit()
	src := newSource(t, srv.Client(), Options{OnAdmit: audit.Record})
	eng, err := flow.New(flow.WithTokenSource(src))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "partial", Resource: "api", Threshold: 1000, Global: true, Fallback: flow.FallbackClosed}}))
	sent, admitted := 0, 0
	tick := time.NewTicker(1111 * time.Microsecond) // 900/s, or fewer on a loaded machine
	defer tick.Stop()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		<-tick.C
		sent++
		if en, err := eng.Entry("api"); err == nil {
			admitted++
			en.Exit(nil)
		}
	}
	st := src.Stats()
	t.Logf("%d of %d admitted, %+v", admitted, sent, st)
	assert.GreaterOrEqual(t, float64(admitted), 0.9*float64(sent))
	assert.Positive(t, st.Returned, "unspent tokens went back")
	assert.LessOrEqual(t, audit.Fullest(time.Second), int64(1000), "no server window over the threshold")
}
