package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/leapflow/leapflow/internal/examplerun"
)

// TestRun: the example serves, shows alice's fourth call refused with a
// retry delay, bob's let through, and the third stream refused; it stops
// when asked.
func TestRun(t *testing.T) {
	lines := examplerun.Lines(t, run, "serving until interrupted")
	assert.Contains(t, lines[0], "listening on 127.0.0.1:")
	for i, want := range []string{
		"Say #1 as alice -> OK", "Say #2 as alice -> OK", "Say #3 as alice -> OK",
		"Say #4 as alice -> ResourceExhausted (retry in ",
		"Say #1 as bob -> OK",
		"Chat stream #1 -> OK", "Chat stream #2 -> OK", "Chat stream #3 -> ResourceExhausted",
	} {
		assert.Contains(t, lines[i+1], want)
	}
}
