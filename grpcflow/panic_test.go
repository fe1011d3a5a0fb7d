package grpcflow

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/grpcflow/grpcflowtest"
)

// TestClientPanicReleasesTheAdmission: a panic further down a client call
// (another interceptor, a codec) that the application recovers leaves
// the admission held for ever: a Concurrency rule loses a slot per panic.
func TestClientPanicReleasesTheAdmission(t *testing.T) {
	eng := engine(t, nil,
		flow.Rule{Resource: grpcflowtest.Say, Metric: flow.Concurrency, Threshold: 1},
		flow.Rule{Resource: grpcflowtest.Count, Metric: flow.Concurrency, Threshold: 1})
	l := New(eng)
	boom := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { panic("boom") }
	sboom := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
		panic("boom")
	}
	func() {
		defer func() { _ = recover() }()
		_ = l.UnaryClient(context.Background(), grpcflowtest.Say, nil, nil, nil, boom)
	}()
	func() {
		defer func() { _ = recover() }()
		_, _ = l.StreamClient(context.Background(), &grpcflowtest.CountDesc, nil, grpcflowtest.Count, sboom)
	}()
	for _, res := range []string{grpcflowtest.Say, grpcflowtest.Count} {
		s, _ := eng.Snapshot(res)
		assert.Zero(t, s.Inflight, "%s: the panicked call still holds its admission", res)
	}
	ok := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	assert.NoError(t, l.UnaryClient(context.Background(), grpcflowtest.Say, nil, nil, nil, ok), "the only slot is gone for good")
}
