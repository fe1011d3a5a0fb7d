// Package examplerun runs the example programs' run functions in their
// tests (the programs themselves import nothing internal, so that they can
// be copied).
package examplerun

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"
)

// buffer is written by run's goroutines and read by the test.
type buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Lines starts run on a loopback port, waits until it prints a line
// holding ready, stops it, and returns what it printed, by line. It fails
// the test if run does not get there or returns an error.
func Lines(t *testing.T, run func(ctx context.Context, addr string, out io.Writer) error, ready string) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out buffer
	done := make(chan error, 1)
	go func() { done <- run(ctx, "127.0.0.1:0", &out) }()
	deadline := time.After(30 * time.Second)
	for !strings.Contains(out.String(), ready) {
		select {
		case err := <-done:
			t.Fatalf("run ended early (%v); it printed:\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("run printed no %q in 30 s:\n%s", ready, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run: %v", err)
	}
	return strings.Split(out.String(), "\n")
}
