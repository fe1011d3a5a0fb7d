package stats

import (
	"testing"

	"github.com/leapflow/leapflow/stat"
	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them, but
// for the process-wide default clock, started here first.
func TestMain(m *testing.M) {
	stat.DefaultClock()
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent())
}
