package stat

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/leapflow/leapflow/stat/stattest"
)

func TestManualClock(t *testing.T) {
	c := stattest.NewClock(time.Second)
	assert.Equal(t, int64(time.Second), c.Now())
	assert.Equal(t, 1500*time.Millisecond, c.Advance(500*time.Millisecond))
	c.Set(0)
	assert.Zero(t, c.Now())
}
