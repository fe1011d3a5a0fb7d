package cpu

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestRoundStripes(t *testing.T) {
	for in, want := range map[int]int{-1: 1, 0: 1, 1: 1, 2: 2, 3: 4, 16: 16, 17: 32, 1000: MaxStripes} {
		assert.Equal(t, want, RoundStripes(in), "RoundStripes(%d)", in)
	}
}

func TestPinIsAStripeHint(t *testing.T) {
	p := Pin()
	assert.GreaterOrEqual(t, p, 0)
	assert.Less(t, p, 1<<20, "a P index")
}
