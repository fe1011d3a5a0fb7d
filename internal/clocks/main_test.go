package clocks

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine outlives them, but
// for the process-wide default clock, started here first.
func TestMain(m *testing.M) {
	Default()
	goleak.VerifyTestMain(m, goleak.IgnoreCurrent())
}
