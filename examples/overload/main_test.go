package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The program prints a row per run: without a rule nothing is shed; with
// the SystemBBR rule some of the 3x overload is.
func TestOverloadShedsOnlyWithTheRule(t *testing.T) {
	var out strings.Builder
	require.NoError(t, run(&out, 300*time.Millisecond))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 3, out.String())
	shed := func(line string) int {
		f := strings.Fields(line)
		n, err := strconv.Atoi(f[len(f)-1])
		require.NoError(t, err, line)
		return n
	}
	assert.True(t, strings.HasPrefix(lines[1], "no rule"))
	assert.Zero(t, shed(lines[1]))
	assert.True(t, strings.HasPrefix(lines[2], "SystemBBR"))
	assert.Positive(t, shed(lines[2]))
}
