package grpcflow

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/grpcflow/grpcflowtest"
	"github.com/leapflow/leapflow/stat/stattest"
)

const ms = time.Millisecond

func engine(t *testing.T, clock *stattest.Clock, rules ...flow.Rule) *flow.Engine {
	t.Helper()
	opts := []flow.Option{flow.WithMaxResources(8)}
	if clock != nil {
		opts = append(opts, flow.WithClock(clock))
	}
	e, err := flow.New(opts...)
	require.NoError(t, err)
	require.NoError(t, e.LoadRules(rules))
	return e
}

// serve starts the echo service on a loopback listener, with the server
// interceptors of l (none if nil), and returns a client connection to it
// with the client options given.
func serve(t *testing.T, l *Limiter, fail func(string) error, dial ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	var sopts []grpc.ServerOption
	if l != nil {
		sopts = append(sopts, grpc.UnaryInterceptor(l.UnaryServer), grpc.StreamInterceptor(l.StreamServer))
	}
	srv := grpc.NewServer(sopts...)
	grpcflowtest.Register(srv, &grpcflowtest.Server{Fail: fail})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func say(ctx context.Context, conn *grpc.ClientConn, msg string) error {
	return conn.Invoke(ctx, grpcflowtest.Say, wrapperspb.String(msg), new(wrapperspb.StringValue))
}

func detailInfo(t *testing.T, err error) *errdetails.ErrorInfo {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei
		}
	}
	t.Fatalf("no ErrorInfo in %v", err)
	return nil
}

// TestBlockedCallGetsRetryInfo: past its rule a unary call fails with
// ResourceExhausted; the client decodes the RetryInfo delay (exact on a
// fake clock) and the ErrorInfo naming the rule and quota.
func TestBlockedCallGetsRetryInfo(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{ID: "say", Resource: grpcflowtest.Say, Threshold: 2})
	conn := serve(t, New(eng), nil)
	ctx := context.Background()
	clock.Set(100 * ms)
	require.NoError(t, say(ctx, conn, "a"))
	clock.Set(600 * ms)
	require.NoError(t, say(ctx, conn, "b"))
	clock.Set(700 * ms)
	err := say(ctx, conn, "c")
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	d, ok := RetryDelay(err)
	require.True(t, ok)
	assert.Equal(t, 300*ms, d, "the pass at 100 ms leaves the window (4 buckets of 250 ms) at 1 s")
	ei := detailInfo(t, err)
	assert.Equal(t, Domain, ei.Domain)
	assert.Equal(t, ReasonRateLimited, ei.Reason)
	assert.Equal(t, map[string]string{"resource": grpcflowtest.Say, "rule": "say", "reason": "flow", "quota": "2", "window": "1s"}, ei.Metadata)

	snap, _ := eng.Snapshot(grpcflowtest.Say)
	assert.Equal(t, int64(2), snap.MinutePass)
	assert.Equal(t, int64(1), snap.MinuteBlock)

	_, ok = RetryDelay(status.Error(codes.Internal, "x"))
	assert.False(t, ok)
	_, ok = RetryDelay(errors.New("not a status"))
	assert.False(t, ok)
}

// TestResourceNaming: WithResource names calls; the default is the full
// method name.
func TestResourceNaming(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: "echo", Threshold: 1})
	conn := serve(t, New(eng, WithResource(func(context.Context, string) string { return "echo" })), nil)
	require.NoError(t, say(context.Background(), conn, "a"))
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(context.Background(), conn, "b")))
	_, ok := eng.Snapshot(grpcflowtest.Say)
	assert.False(t, ok, "no resource under the method's own name")
}

// TestPerKeyFromMetadata: each caller named by a metadata field has its
// own quota; calls without one share the no-key entry.
func TestPerKeyFromMetadata(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: grpcflowtest.Say, Threshold: 2, PerKey: true})
	conn := serve(t, New(eng, WithKey(MetadataKey("X-API-Key"))), nil)
	as := func(key string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "x-api-key", key)
	}
	for _, key := range []string{"alice", "bob"} {
		require.NoError(t, say(as(key), conn, "1"), key)
		require.NoError(t, say(as(key), conn, "2"), key)
		assert.Equal(t, codes.ResourceExhausted, status.Code(say(as(key), conn, "3")), key)
	}
	require.NoError(t, say(context.Background(), conn, "no key"))
	require.NoError(t, say(context.Background(), conn, "no key"))
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(context.Background(), conn, "no key")),
		"calls with no key share one entry at the rule's threshold")
	snap, _ := eng.Snapshot(grpcflowtest.Say)
	assert.Equal(t, int64(3), snap.Keyless)
}

// TestKeysFromMetadataAreBounded: a metadata key longer than 256 bytes, or
// binary (a -bin field), becomes a bounded key of its own (its start and a
// hash): never the shared no-key entry, never around the rules; a longer
// key sharing its start is another key; of repeated values the first
// names the caller.
func TestKeysFromMetadataAreBounded(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: grpcflowtest.Say, Threshold: 2, PerKey: true})
	conn := serve(t, New(eng, WithKey(MetadataKey("X-Key-Bin"))), nil)
	as := func(vals ...string) context.Context {
		kv := []string{}
		for _, v := range vals {
			kv = append(kv, "x-key-bin", v)
		}
		return metadata.AppendToOutgoingContext(context.Background(), kv...)
	}
	long := strings.Repeat("k", 8<<10)
	bin := string([]byte{0, 0xff, '\n', 0}) + strings.Repeat("\x00", 4<<10)
	for _, key := range []string{long, long + "x", bin} {
		require.NoError(t, say(as(key), conn, "1"))
		require.NoError(t, say(as(key), conn, "2"))
		assert.Equal(t, codes.ResourceExhausted, status.Code(say(as(key), conn, "3")), "a key of its own at the threshold")
	}
	require.NoError(t, say(as("first", long+"y"), conn, "1"))
	require.NoError(t, say(as("first", long+"y"), conn, "2"))
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(as("first", long+"y"), conn, "3")),
		"repeated values: the first is the key")
	require.NoError(t, say(as(long+"y"), conn, "the value after it was not counted"))
	snap, _ := eng.Snapshot(grpcflowtest.Say)
	assert.Zero(t, snap.Keyless, "no call fell to the shared no-key entry")
}

// TestPeerKey: PeerKey names a loopback caller by its address; a caller
// with no IP peer has no key.
func TestPeerKey(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: grpcflowtest.Say, Threshold: 1, PerKey: true})
	seen := make(chan string, 2)
	key := PeerKey()
	l := New(eng, WithKey(func(ctx context.Context, m string) string {
		k := key(ctx, m)
		seen <- k
		return k
	}))
	conn := serve(t, l, nil)
	require.NoError(t, say(context.Background(), conn, "a"))
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(context.Background(), conn, "b")))
	assert.Equal(t, "127.0.0.1", <-seen)
	assert.Equal(t, "127.0.0.1", <-seen)
	assert.Equal(t, "", key(context.Background(), grpcflowtest.Say))
}

// TestExceptionsByCode: handler errors count as exceptions by the
// classifier (default: Unknown, Internal, Unavailable, DataLoss,
// DeadlineExceeded); a user's replaces it.
func TestExceptionsByCode(t *testing.T) {
	fail := func(msg string) error {
		if msg == "ok" {
			return nil
		}
		c, _ := strconv.Atoi(msg)
		return status.Error(codes.Code(c), "asked to fail")
	}
	eng := engine(t, nil)
	conn := serve(t, New(eng), fail)
	exceptions := 0
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		err := say(context.Background(), conn, strconv.Itoa(int(c)))
		if c == codes.OK {
			require.NoError(t, err)
			continue
		}
		require.Equal(t, c, status.Code(err))
		if IsException(err) {
			exceptions++
		}
	}
	assert.Equal(t, 5, exceptions, "Unknown, Internal, Unavailable, DataLoss, DeadlineExceeded")
	snap, _ := eng.Snapshot(grpcflowtest.Say)
	assert.Equal(t, int64(17), snap.MinutePass)
	assert.Equal(t, int64(5), snap.MinuteErrors)

	mine := engine(t, nil)
	conn = serve(t, New(mine, WithExceptions(func(err error) bool { return status.Code(err) == codes.NotFound })), fail)
	_ = say(context.Background(), conn, strconv.Itoa(int(codes.Internal)))
	_ = say(context.Background(), conn, strconv.Itoa(int(codes.NotFound)))
	snap, _ = mine.Snapshot(grpcflowtest.Say)
	assert.Equal(t, int64(1), snap.MinuteErrors, "only NotFound")
}

// TestPanicCountsAndGoesOn: a handler that panics is counted as an
// exception and the panic goes on (gRPC servers do not recover them, so
// the interceptor is called directly).
func TestPanicCountsAndGoesOn(t *testing.T) {
	eng := engine(t, nil)
	l := New(eng)
	info := &grpc.UnaryServerInfo{FullMethod: grpcflowtest.Say}
	v := func() (v any) {
		defer func() { v = recover() }()
		_, _ = l.UnaryServer(context.Background(), nil, info, func(context.Context, any) (any, error) { panic("boom") })
		return nil
	}()
	assert.Equal(t, "boom", v)
	sinfo := &grpc.StreamServerInfo{FullMethod: grpcflowtest.Chat}
	v = func() (v any) {
		defer func() { v = recover() }()
		_ = l.StreamServer(nil, fakeStream{}, sinfo, func(any, grpc.ServerStream) error { panic("stream boom") })
		return nil
	}()
	assert.Equal(t, "stream boom", v)
	for _, res := range []string{grpcflowtest.Say, grpcflowtest.Chat} {
		snap, _ := eng.Snapshot(res)
		assert.Equal(t, int64(1), snap.MinuteErrors, res)
		assert.Zero(t, snap.Inflight, res)
	}
}

type fakeStream struct{ grpc.ServerStream }

func (fakeStream) Context() context.Context { return context.Background() }

// TestServerStreams: a server stream holds its admission while open, so a
// Concurrency rule counts open streams; the block reaches the client at
// its first read; a stream's handler error counts as an exception.
func TestServerStreams(t *testing.T) {
	eng := engine(t, nil, flow.Rule{Resource: grpcflowtest.Chat, Metric: flow.Concurrency, Threshold: 1})
	conn := serve(t, New(eng), nil)
	ctx := context.Background()
	first, err := conn.NewStream(ctx, &grpcflowtest.ChatDesc, grpcflowtest.Chat)
	require.NoError(t, err)
	require.NoError(t, first.SendMsg(wrapperspb.String("hi")))
	got := new(wrapperspb.StringValue)
	require.NoError(t, first.RecvMsg(got), "the first stream is open")

	second, err := conn.NewStream(ctx, &grpcflowtest.ChatDesc, grpcflowtest.Chat)
	require.NoError(t, err)
	err = second.RecvMsg(got)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	_, ok := RetryDelay(err)
	assert.False(t, ok, "a Concurrency rule cannot say when")
	assert.Equal(t, ReasonConcurrencyFull, detailInfo(t, err).Reason)

	require.NoError(t, first.SendMsg(wrapperspb.String("fail")))
	assert.Equal(t, codes.Internal, status.Code(first.RecvMsg(got)))
	require.Eventually(t, func() bool {
		snap, _ := eng.Snapshot(grpcflowtest.Chat)
		return snap.Inflight == 0
	}, 2*time.Second, 5*time.Millisecond)

	third, err := conn.NewStream(ctx, &grpcflowtest.ChatDesc, grpcflowtest.Chat)
	require.NoError(t, err)
	require.NoError(t, third.SendMsg(wrapperspb.String("again")))
	require.NoError(t, third.RecvMsg(got), "room again once the first ended")
	require.NoError(t, third.CloseSend())
	assert.ErrorIs(t, third.RecvMsg(got), io.EOF)
	require.Eventually(t, func() bool {
		snap, _ := eng.Snapshot(grpcflowtest.Chat)
		return snap.Inflight == 0 && snap.MinutePass == 2 && snap.MinuteErrors == 1 && snap.MinuteBlock == 1
	}, 2*time.Second, 5*time.Millisecond)
}

// TestClientInterceptors: the client interceptors refuse calls past the
// client's rule before anything is sent; a client stream holds its
// admission until the call finishes (read to the end, or cancelled).
func TestClientInterceptors(t *testing.T) {
	clock := stattest.NewClock(0)
	server := engine(t, nil)
	client := engine(t, clock,
		flow.Rule{Resource: grpcflowtest.Say, Threshold: 1},
		flow.Rule{Resource: grpcflowtest.Count, Metric: flow.Concurrency, Threshold: 1},
	)
	l := New(client)
	conn := serve(t, New(server), func(msg string) error {
		if msg == "fail" {
			return status.Error(codes.Unavailable, "down")
		}
		return nil
	}, grpc.WithUnaryInterceptor(l.UnaryClient), grpc.WithStreamInterceptor(l.StreamClient))
	ctx := context.Background()

	require.NoError(t, say(ctx, conn, "a"))
	err := say(ctx, conn, "b")
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
	d, ok := RetryDelay(err)
	assert.True(t, ok)
	assert.Equal(t, time.Second, d)
	clock.Set(time.Second)
	assert.Equal(t, codes.Unavailable, status.Code(say(ctx, conn, "fail")))
	srv, _ := server.Snapshot(grpcflowtest.Say)
	assert.Equal(t, int64(2), srv.MinutePass, "the refused call never reached the server")
	cl, _ := client.Snapshot(grpcflowtest.Say)
	assert.Equal(t, int64(1), cl.MinuteErrors, "Unavailable counts on the client too")

	count := func(ctx context.Context, n int) (grpc.ClientStream, error) {
		s, err := conn.NewStream(ctx, &grpcflowtest.CountDesc, grpcflowtest.Count)
		if err != nil {
			return nil, err
		}
		if err := s.SendMsg(wrapperspb.String(strconv.Itoa(n))); err != nil {
			return nil, err
		}
		return s, s.CloseSend()
	}
	first, err := count(ctx, 3)
	require.NoError(t, err)
	_, err = count(ctx, 1)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "one stream at a time")
	got := new(wrapperspb.StringValue)
	for range 3 {
		require.NoError(t, first.RecvMsg(got))
	}
	require.ErrorIs(t, first.RecvMsg(got), io.EOF)
	inflight := func() int64 { s, _ := client.Snapshot(grpcflowtest.Count); return s.Inflight }
	require.Eventually(t, func() bool { return inflight() == 0 }, 2*time.Second, 5*time.Millisecond,
		"read to the end, the stream let go of its admission")

	cctx, cancel := context.WithCancel(ctx)
	_, err = count(cctx, 1000)
	require.NoError(t, err)
	assert.Equal(t, int64(1), inflight())
	cancel()
	require.Eventually(t, func() bool { return inflight() == 0 }, 2*time.Second, 5*time.Millisecond,
		"cancelled, the stream let go of its admission")
	_, err = count(ctx, 1)
	require.NoError(t, err, "room again")
}

// TestClientStreamMadeByNoOne: when an interceptor further down fails a
// stream before gRPC makes it, the admission is released all the same.
func TestClientStreamMadeByNoOne(t *testing.T) {
	eng := engine(t, nil, flow.Rule{Resource: grpcflowtest.Count, Metric: flow.Concurrency, Threshold: 1})
	l := New(eng)
	refuse := func(context.Context, *grpc.StreamDesc, *grpc.ClientConn, string, ...grpc.CallOption) (grpc.ClientStream, error) {
		return nil, status.Error(codes.Unavailable, "refused below")
	}
	for range 3 {
		_, err := l.StreamClient(context.Background(), &grpcflowtest.CountDesc, nil, grpcflowtest.Count, refuse)
		assert.Equal(t, codes.Unavailable, status.Code(err))
	}
	snap, _ := eng.Snapshot(grpcflowtest.Count)
	assert.Zero(t, snap.Inflight)
	assert.Equal(t, int64(3), snap.MinutePass)
	assert.Equal(t, int64(3), snap.MinuteErrors)
}

// TestQueuedCallEndsWithItsContext: a throttled call whose deadline passes
// while it waits fails with DeadlineExceeded, counted as failed closed.
func TestQueuedCallEndsWithItsContext(t *testing.T) {
	eng := engine(t, nil, flow.Rule{Resource: grpcflowtest.Say, Threshold: 1, Behavior: flow.Throttle, MaxQueueing: 10 * time.Second})
	l := New(eng)
	conn := serve(t, l, nil)
	require.NoError(t, say(context.Background(), conn, "first"))
	ctx, cancel := context.WithTimeout(context.Background(), 100*ms)
	defer cancel()
	assert.Equal(t, codes.DeadlineExceeded, status.Code(say(ctx, conn, "second")))
	require.Eventually(t, func() bool { return l.Stats().FailedClosed == 1 }, 2*time.Second, 5*time.Millisecond)
}

// TestFailOpenWhenTheRegistryIsFull: a call whose resource cannot be made
// goes through, counted; WithFailClosed fails it with Unavailable.
func TestFailOpenWhenTheRegistryIsFull(t *testing.T) {
	e, err := flow.New(flow.WithMaxResources(1))
	require.NoError(t, err)
	byMsg := func(ctx context.Context, _ string) string {
		md, _ := metadata.FromIncomingContext(ctx)
		return md["res"][0]
	}
	l := New(e, WithResource(byMsg))
	conn := serve(t, l, nil)
	call := func(conn *grpc.ClientConn, res string) error {
		return say(metadata.AppendToOutgoingContext(context.Background(), "res", res), conn, "x")
	}
	require.NoError(t, call(conn, "one"))
	require.NoError(t, call(conn, "two"), "no room: let through")
	assert.Equal(t, Stats{FailedOpen: 1}, l.Stats())

	closed := New(e, WithResource(byMsg), WithFailClosed())
	assert.Equal(t, codes.Unavailable, status.Code(call(serve(t, closed, nil), "three")))
	assert.Equal(t, Stats{FailedClosed: 1}, closed.Stats())
}

// TestBlockStatusReplaced: WithBlockStatus replaces the status; a nil one
// falls back to BlockStatus.
func TestBlockStatusReplaced(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: grpcflowtest.Say, Threshold: 0})
	var told Blocked
	conn := serve(t, New(eng, WithBlockStatus(func(_ context.Context, b Blocked) *status.Status {
		told = b
		return status.New(codes.Unavailable, "later")
	})), nil)
	assert.Equal(t, codes.Unavailable, status.Code(say(context.Background(), conn, "x")))
	assert.Equal(t, grpcflowtest.Say, told.Resource)
	q, _ := told.Err.Quota()
	assert.Equal(t, int64(0), q)

	conn = serve(t, New(eng, WithBlockStatus(func(context.Context, Blocked) *status.Status { return nil })), nil)
	assert.Equal(t, codes.ResourceExhausted, status.Code(say(context.Background(), conn, "x")))
}

// TestBlockStatusDetails: the RetryInfo written by hand decodes to the
// delay for any duration, and each rule's ErrorInfo, kept in a table,
// stays its own when rules alternate.
func TestBlockStatusDetails(t *testing.T) {
	e := engine(t, stattest.NewClock(0),
		flow.Rule{ID: "a", Resource: "ra", Threshold: 0},
		flow.Rule{ID: "b", Resource: "rb", Metric: flow.Concurrency, Threshold: 0},
	)
	var be [2]*flow.BlockError
	for i, res := range []string{"ra", "rb"} {
		_, err := e.Entry(res)
		require.ErrorAs(t, err, &be[i])
	}
	for i, d := range []time.Duration{0, 1, 999_999_999, time.Second, 90*time.Second + 5, 1<<62 + 7} {
		which := be[i%2]
		res := which.Rule.Resource
		st := BlockStatus(Blocked{Resource: res, Err: which, RetryAfter: d})
		assert.Equal(t, codes.ResourceExhausted, st.Code())
		assert.Equal(t, which.Error(), st.Message())
		got, ok := RetryDelay(st.Err())
		require.True(t, ok, d)
		assert.Equal(t, d, got)
		ei := detailInfo(t, st.Err())
		assert.Equal(t, which.Rule.ID, ei.Metadata["rule"])
		assert.Equal(t, res, ei.Metadata["resource"])
		assert.Equal(t, "0", ei.Metadata["quota"], "the rule's own quota")
	}
	st := BlockStatus(Blocked{Resource: "ra", Err: be[0], RetryAfter: -1})
	_, ok := RetryDelay(st.Err())
	assert.False(t, ok, "no RetryInfo when the rule cannot say")
	assert.Len(t, st.Details(), 1)
}

// TestEveryRefusalCarriesRetryInfo: on a method with a rule for all
// callers and one per caller, the per-caller refusal carries RetryInfo
// (the key's wait) and names its own rule.
func TestEveryRefusalCarriesRetryInfo(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock,
		flow.Rule{ID: "all", Resource: grpcflowtest.Say, Threshold: 100},
		flow.Rule{ID: "each", Resource: grpcflowtest.Say, Threshold: 0.5, StatInterval: 2 * time.Second, PerKey: true})
	conn := serve(t, New(eng, WithKey(MetadataKey("X-API-Key"))), nil)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "alice")
	clock.Set(100 * ms)
	require.NoError(t, say(ctx, conn, "1"))
	clock.Set(600 * ms)
	err := say(ctx, conn, "2")
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	d, ok := RetryDelay(err)
	require.True(t, ok, "a resource with two rules still says when")
	assert.Equal(t, 1400*ms, d, "alice's pass at 100 ms leaves her 2 s window (of 500 ms buckets) at 2 s")
	assert.Equal(t, "each", detailInfo(t, err).Metadata["rule"])
}

// A circuit breaker counts the calls that fail with an exception's code
// (the default codes, or WithExceptions's) and, open, refuses calls with
// Unavailable, the wait until its next probe as RetryInfo and an
// ErrorInfo of reason CIRCUIT_OPEN; its probe's success closes it.
func TestBreakerCountsFailedCallsAndAnswersUnavailable(t *testing.T) {
	fail := func(msg string) error {
		if msg == "ok" {
			return nil
		}
		c, _ := strconv.Atoi(msg)
		return status.Error(codes.Code(c), "asked to fail")
	}
	breaker := flow.Rule{ID: "say-breaker", Resource: grpcflowtest.Say, Breaker: flow.ErrorCount, Threshold: 2, RetryTimeout: 10 * time.Second}
	ctx := context.Background()
	for _, tc := range []struct {
		name       string
		opts       []Option
		bad, clean codes.Code
	}{
		{"default codes", nil, codes.Internal, codes.NotFound},
		{"WithExceptions", []Option{WithExceptions(func(err error) bool { return status.Code(err) == codes.NotFound })}, codes.NotFound, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := stattest.NewClock(time.Second)
			eng := engine(t, clock, breaker)
			conn := serve(t, New(eng, tc.opts...), fail)
			for range 3 {
				require.Equal(t, tc.clean, status.Code(say(ctx, conn, strconv.Itoa(int(tc.clean))))) // not failures
			}
			require.Equal(t, tc.bad, status.Code(say(ctx, conn, strconv.Itoa(int(tc.bad)))))
			require.Equal(t, tc.bad, status.Code(say(ctx, conn, strconv.Itoa(int(tc.bad)))))
			clock.Advance(4 * time.Second)
			err := say(ctx, conn, "ok")
			require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
			d, ok := RetryDelay(err)
			require.True(t, ok)
			assert.Equal(t, 6*time.Second, d, "until the next probe")
			ei := detailInfo(t, err)
			assert.Equal(t, ReasonCircuitOpen, ei.Reason)
			assert.Equal(t, "breaker", ei.Metadata["reason"])
			clock.Advance(6 * time.Second)
			require.NoError(t, say(ctx, conn, "ok"), "the probe")
			require.NoError(t, say(ctx, conn, "ok"), "closed")
		})
	}
}
