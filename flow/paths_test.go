package flow

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// TestShortAndGeneralPathsAgree runs the rule shapes that Entry's short
// path takes through it and through the general path (the same rules with
// the short path turned off) and compares every decision.
func TestShortAndGeneralPathsAgree(t *testing.T) {
	shapes := map[string][]Rule{
		"one reject":       {{Resource: "api", Threshold: 7}},
		"two rejects":      {{Resource: "api", Threshold: 9}, {ID: "tight", Resource: "api", Threshold: 4}},
		"fractional":       {{Resource: "api", Threshold: 2.5}},
		"zero":             {{Resource: "api", Threshold: 0}},
		"reject and other": {{Resource: "api", Threshold: 5}, {Resource: "other", Threshold: 1}},
	}
	for name, rules := range shapes {
		t.Run(name, func(t *testing.T) {
			short, general := stattest.NewClock(0), stattest.NewClock(0)
			a, _ := newEngine(t, short)
			b, _ := newEngine(t, general)
			load(t, a, rules...)
			load(t, b, rules...)
			require.NotNil(t, a.rules.Load().byResource["api"].single, "the shape takes the short path")
			for _, rr := range b.rules.Load().byResource {
				rr.single = nil
			}
			rng := rand.New(rand.NewPCG(7, uint64(len(name))))
			var open []Entry
			for step := range 2000 {
				d := time.Duration(rng.IntN(60)) * time.Millisecond
				short.Advance(d)
				general.Advance(d)
				opts := []EntryOption{WithCount(1 + rng.IntN(3))}
				ea, errA := a.Entry("api", opts...)
				eb, errB := b.Entry("api", opts...)
				require.Equal(t, errA == nil, errB == nil, "step %d", step)
				require.Equal(t, errA, errB, "step %d: the same rule blocks", step)
				require.Equal(t, ea.seen(), eb.seen(), "step %d", step)
				require.Equal(t, ea.Start(), eb.Start(), "step %d", step)
				open = append(open, ea, eb)
				if rng.IntN(3) == 0 {
					for i := range open {
						open[i].Exit(nil)
					}
					open = open[:0]
				}
			}
			sa, _ := a.Snapshot("api")
			sb, _ := b.Snapshot("api")
			assert.Equal(t, sa, sb)
		})
	}
}
