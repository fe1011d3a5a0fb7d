package flow

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestPerKeyReloadKeepsCounts for a Global PerKey rule's local fallback
// (its source down): a reload that changes MaxKeys keeps each key's count,
// as for a local PerKey rule, so a key that spent its LocalShare is not
// admitted it again.
func TestKeyedGlobalFallbackReloadKeepsCounts(t *testing.T) {
	src := &fakeSource{}
	src.err.Store(errors.New("down"))
	e, _ := newEngine(t, stattest.NewClock(0), WithTokenSource(src))
	load(t, e, Rule{ID: "g", Resource: "api", Threshold: 10, Global: true, PerKey: true, LocalShare: 0.5})
	assert.Equal(t, 5, admitted(e, "api", "a", 10))
	load(t, e, Rule{ID: "g", Resource: "api", Threshold: 10, Global: true, PerKey: true, LocalShare: 0.5, MaxKeys: 64})
	assert.Zero(t, admitted(e, "api", "a", 10), "the key spent its share in this window")
}
