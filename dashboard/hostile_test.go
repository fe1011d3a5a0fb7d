package dashboard

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// MaxHistoryPoints bounds "the points kept for all resources together",
// but keep never drops the newest delivery: one delivery with more
// resources than the bound is kept whole.
func TestHostileMaxHistoryPointsExceeded(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(1000))
	require.NoError(t, err)
	t.Cleanup(eng.Feed().Close)
	h, err := New(eng, Options{MaxHistoryPoints: 10})
	require.NoError(t, err)
	clock.Set(11*time.Second + time.Millisecond)
	for i := range 500 {
		en, err := eng.Entry(fmt.Sprintf("r%d", i))
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Set(13 * time.Second)
	eng.Feed().Poll()
	d := h.(*server)
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.LessOrEqual(t, d.points, 10)
}

// A metric log with a line the writer itself can leave behind (a line
// cut by a crash, then appended to) makes New fail: the dashboard does not
// start at all.
func TestHostileHistoryFileWithCrashRemnant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	now := time.Now().Truncate(time.Second)
	line := func(ts time.Time, res string) string {
		return strings.Join([]string{itoa(ts.UnixMilli()), ts.UTC().Format(time.DateTime), res, "1", "0", "1", "0", "5", "0", "0"}, "|")
	}
	cut := line(now.Add(-3*time.Second), "api")[:20]
	body := line(now.Add(-4*time.Second), "api") + "\n" + cut + line(now.Add(-2*time.Second), "api") + "\n" + line(now.Add(-time.Second), "api") + "\n"
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	eng := engine(t, stattest.NewClock(0))
	_, err := New(eng, Options{HistoryFile: path})
	require.NoError(t, err)
}
