package main

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/leapflow/leapflow/internal/examplerun"
)

// TestRun: the example serves, shows its third read refused with the
// rate-limit headers and one of two reports refused, and stops when asked.
func TestRun(t *testing.T) {
	lines := examplerun.Lines(t, run, "serving until interrupted")
	assert.Contains(t, lines[0], "listening on http://127.0.0.1:")
	assert.Contains(t, lines[1], "GET /items/1 -> 200 OK")
	assert.Contains(t, lines[2], "GET /items/2 -> 200 OK")
	assert.Contains(t, lines[3], `GET /items/3 -> 429 Too Many Requests  Retry-After: 1  RateLimit-Policy: "items-per-client";q=2;w=1`)
	reports := lines[4] + lines[5]
	assert.Contains(t, reports, "GET /report -> 200 OK")
	assert.Contains(t, reports, "GET /report -> 429 Too Many Requests")
}
