package grpcflow

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/grpcflow/grpcflowtest"
)

// BenchmarkUnaryServer is a trivial handler called in process, with and
// without the interceptor in front (a rule that never blocks), and a call
// the interceptor blocks (the status with its details is built per call).
func BenchmarkUnaryServer(b *testing.B) {
	e, err := flow.New()
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]flow.Rule{{Resource: grpcflowtest.Say, Threshold: 1e12}, {Resource: grpcflowtest.Chat, Threshold: 0.001, StatInterval: time.Hour}}); err != nil {
		b.Fatal(err)
	}
	l := New(e)
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctx := context.Background()
	say := &grpc.UnaryServerInfo{FullMethod: grpcflowtest.Say}
	blocked := &grpc.UnaryServerInfo{FullMethod: grpcflowtest.Chat}
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = handler(ctx, nil)
		}
	})
	b.Run("leapflow", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = l.UnaryServer(ctx, nil, say, handler)
		}
	})
	for range 3 { // the window's quota of 3: then blocked for the hour, told when to retry
		if _, err := l.UnaryServer(ctx, nil, blocked, handler); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := l.UnaryServer(ctx, nil, blocked, handler); err == nil {
		b.Fatal("admitted")
	} else if _, ok := RetryDelay(err); !ok {
		b.Fatal("no RetryInfo")
	}
	b.Run("blocked", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := l.UnaryServer(ctx, nil, blocked, handler); err == nil {
				b.Fatal("admitted")
			}
		}
	})
}

// TestUnaryServerAllocations: an admitted unary call allocates nothing in
// the interceptor.
func TestUnaryServerAllocations(t *testing.T) {
	e, err := flow.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.LoadRules([]flow.Rule{{Resource: grpcflowtest.Say, Threshold: 1e12}}); err != nil {
		t.Fatal(err)
	}
	l := New(e)
	handler := func(context.Context, any) (any, error) { return nil, nil }
	info := &grpc.UnaryServerInfo{FullMethod: grpcflowtest.Say}
	if n := testing.AllocsPerRun(200, func() { _, _ = l.UnaryServer(context.Background(), nil, info, handler) }); n != 0 {
		t.Fatalf("%v allocations per call", n)
	}
}
