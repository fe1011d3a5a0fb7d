package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/dashboard"
)

// TestRun: the demo serves its dashboard, whose table soon shows every
// simulated resource, export blocked; it stops when asked.
func TestRun(t *testing.T) {
	var rows []dashboard.Row
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- run(ctx, "127.0.0.1:0", "", pw) }()
	first, err := readLine(pr)
	require.NoError(t, err)
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	url := strings.TrimSpace(strings.TrimPrefix(first, "dashboard on "))
	require.Eventually(t, func() bool {
		resp, err := http.Get(url + "api/tick")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var tick dashboard.Tick
		if json.NewDecoder(resp.Body).Decode(&tick) != nil {
			return false
		}
		rows = tick.Rows
		for _, r := range rows {
			if r.Resource == "export" && r.Block > 0 {
				return true
			}
		}
		return false
	}, 15*time.Second, 200*time.Millisecond)
	assert.Len(t, rows, 6)
	cancel()
	require.NoError(t, <-done)
	pw.Close()
}

func readLine(r io.Reader) (string, error) {
	var b strings.Builder
	buf := make([]byte, 1)
	for {
		if _, err := r.Read(buf); err != nil {
			return b.String(), err
		}
		if buf[0] == '\n' {
			return b.String(), nil
		}
		b.WriteByte(buf[0])
	}
}
