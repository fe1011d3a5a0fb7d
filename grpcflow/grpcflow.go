// Package grpcflow puts leapflow in front of gRPC methods: server
// interceptors admit each call (unary) or stream before its handler runs,
// client interceptors limit the calls a process makes. The resource is the
// full method name ("/pkg.Service/Method") unless WithResource names it;
// WithKey names the caller for PerKey rules (MetadataKey, PeerKey).
//
//	l := grpcflow.New(eng, grpcflow.WithKey(grpcflow.MetadataKey("x-api-key")))
//	srv := grpc.NewServer(grpc.UnaryInterceptor(l.UnaryServer), grpc.StreamInterceptor(l.StreamServer))
//
// # Blocked
//
// A blocked call fails with codes.ResourceExhausted (BlockStatus), or
// codes.Unavailable when a circuit breaker refused it, whose details are a
// google.rpc.RetryInfo with the delay after which the rule would admit the
// call, when the rule can say (see flow.Refusal.RetryAfter; a breaker:
// until its next probe), and a google.rpc.ErrorInfo (domain "leapflow",
// reason RATE_LIMITED, CONCURRENCY_LIMITED or CIRCUIT_OPEN) whose
// metadata name the resource, the rule, the quota and its window. A client reads the delay with RetryDelay.
// WithBlockStatus replaces the status. On the client side the call is
// refused before anything is sent.
//
// A call whose wait in a throttling queue ends with its context fails with
// the context's status (Canceled or DeadlineExceeded). A call whose
// resource cannot be made (the registry is full) goes through, counted in
// Stats.FailedOpen, unless WithFailClosed (codes.Unavailable).
//
// # Exceptions
//
// A handler's (or, on the client, the call's) error counts as an
// exception, the failure circuit breakers count, when WithExceptions's
// function says so; by default IsException: codes Unknown, Internal,
// Unavailable, DataLoss and DeadlineExceeded, which say the service failed
// rather than the caller.
// A server handler that panics, or on a client whatever the interceptor
// calls, is counted as an exception and the panic goes on.
//
// # Streams
//
// A server stream holds its admission until its handler returns (so a
// Concurrency rule counts open streams, and RT is the stream's life). A
// client stream holds it until gRPC finishes the call (grpc.OnFinish):
// when the stream ends, fails, or its context is cancelled. A client
// stream its caller abandons without cancelling its context never ends,
// for gRPC as for the limiter.
package grpcflow

import (
	"context"
	"errors"
	"hash/maphash"
	"strconv"
	"sync/atomic"
	"time"

	uatomic "go.uber.org/atomic"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/callerkey"
)

// Blocked is what a block status is made from.
type Blocked = flow.Refusal

// KeyFunc names the caller of a call to fullMethod, for PerKey rules (""
// for none).
type KeyFunc func(ctx context.Context, fullMethod string) string

type config struct {
	resource    func(ctx context.Context, fullMethod string) string
	key         KeyFunc
	isException func(error) bool
	block       func(context.Context, Blocked) *status.Status
	failClosed  bool
}

// Option configures a Limiter.
type Option func(*config)

// WithResource names each call's resource (default: its full method name).
// Every distinct name is a resource, and the registry refuses new ones
// past its cap.
func WithResource(fn func(ctx context.Context, fullMethod string) string) Option {
	return func(c *config) { c.resource = fn }
}

// WithKey names each call's caller for PerKey rules.
func WithKey(fn KeyFunc) Option { return func(c *config) { c.key = fn } }

// WithExceptions decides which errors count as exceptions (default:
// IsException).
func WithExceptions(fn func(error) bool) Option { return func(c *config) { c.isException = fn } }

// WithBlockStatus replaces the status a blocked call fails with (default:
// BlockStatus). A nil or OK status from fn is replaced by BlockStatus's.
func WithBlockStatus(fn func(context.Context, Blocked) *status.Status) Option {
	return func(c *config) { c.block = fn }
}

// WithFailClosed fails a call whose resource cannot be made with
// codes.Unavailable instead of letting it through.
func WithFailClosed() Option { return func(c *config) { c.failClosed = true } }

// IsException reports whether err's code says the service failed:
// Unknown, Internal, Unavailable, DataLoss or DeadlineExceeded.
func IsException(err error) bool {
	switch status.Code(err) {
	case codes.Unknown, codes.Internal, codes.Unavailable, codes.DataLoss, codes.DeadlineExceeded:
		return true
	}
	return false
}

// Stats counts what a Limiter did besides admitting and blocking.
type Stats struct {
	// FailedOpen counts calls let through because their resource could
	// not be made; FailedClosed those failed for it.
	FailedOpen, FailedClosed int64
}

// Limiter holds the interceptors over one engine. Its methods are the
// interceptors: pass l.UnaryServer to grpc.UnaryInterceptor, and so on.
type Limiter struct {
	eng *flow.Engine
	cfg config
	// failedOpen and failedClosed back Stats.
	failedOpen, failedClosed uatomic.Int64
}

// New returns a Limiter admitting calls through eng.
func New(eng *flow.Engine, opts ...Option) *Limiter {
	l := &Limiter{eng: eng}
	for _, o := range opts {
		if o != nil {
			o(&l.cfg)
		}
	}
	if l.cfg.isException == nil {
		l.cfg.isException = IsException
	}
	return l
}

// Stats reads the Limiter's counts.
func (l *Limiter) Stats() Stats {
	return Stats{FailedOpen: l.failedOpen.Load(), FailedClosed: l.failedClosed.Load()}
}

// UnaryServerInterceptor is New(eng, opts...).UnaryServer.
func UnaryServerInterceptor(eng *flow.Engine, opts ...Option) grpc.UnaryServerInterceptor {
	return New(eng, opts...).UnaryServer
}

// StreamServerInterceptor is New(eng, opts...).StreamServer.
func StreamServerInterceptor(eng *flow.Engine, opts ...Option) grpc.StreamServerInterceptor {
	return New(eng, opts...).StreamServer
}

// UnaryClientInterceptor is New(eng, opts...).UnaryClient.
func UnaryClientInterceptor(eng *flow.Engine, opts ...Option) grpc.UnaryClientInterceptor {
	return New(eng, opts...).UnaryClient
}

// StreamClientInterceptor is New(eng, opts...).StreamClient.
func StreamClientInterceptor(eng *flow.Engine, opts ...Option) grpc.StreamClientInterceptor {
	return New(eng, opts...).StreamClient
}

// errPanic is the exception of a handler (or, on a client, of what it
// called) that panicked.
var errPanic = errors.New("grpcflow: handler panicked")

// UnaryServer is a grpc.UnaryServerInterceptor.
func (l *Limiter) UnaryServer(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	en, err := l.enter(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	defer l.exit(&en, &err)
	return handler(ctx, req)
}

// StreamServer is a grpc.StreamServerInterceptor.
func (l *Limiter) StreamServer(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	en, err := l.enter(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	defer l.exit(&en, &err)
	return handler(srv, ss)
}

// exit ends a call: an exception if it panicked (the panic goes on) or its
// error says so.
func (l *Limiter) exit(en *flow.Entry, err *error) {
	if v := recover(); v != nil {
		en.Exit(errPanic)
		panic(v)
	}
	l.done(en, *err)
}

// done exits en with err if err is an exception.
func (l *Limiter) done(en *flow.Entry, err error) {
	if err != nil && l.cfg.isException(err) {
		en.Exit(err)
		return
	}
	en.Exit(nil)
}

// UnaryClient is a grpc.UnaryClientInterceptor.
func (l *Limiter) UnaryClient(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) (err error) {
	en, err := l.enter(ctx, method)
	if err != nil {
		return err
	}
	defer l.exit(&en, &err)
	return invoker(ctx, method, req, reply, cc, opts...)
}

// StreamClient is a grpc.StreamClientInterceptor.
func (l *Limiter) StreamClient(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	en, err := l.enter(ctx, method)
	if err != nil {
		return nil, err
	}
	// A fresh slice: the caller's may have room that appending would
	// write into.
	opts = append(opts[:len(opts):len(opts)], grpc.OnFinish(func(err error) { l.done(&en, err) }))
	defer func() {
		if v := recover(); v != nil {
			en.Exit(errPanic) // a panic below: the stream was never made
			panic(v)
		}
	}()
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		// gRPC calls OnFinish for a stream it failed to make, but an
		// interceptor further down may fail before it: only the first
		// Exit of an admission counts.
		l.done(&en, err)
	}
	return cs, err
}

// enter admits a call to method, returning the error to fail it with if
// it is not to run.
func (l *Limiter) enter(ctx context.Context, method string) (flow.Entry, error) {
	resource := method
	if l.cfg.resource != nil {
		resource = l.cfg.resource(ctx, method)
	}
	opts := [2]flow.EntryOption{flow.WithContext(ctx)}
	n := 1
	if l.cfg.key != nil {
		if key := l.cfg.key(ctx, method); key != "" {
			// A key from the call is bounded: longer than 256 bytes, it
			// is its start and a hash (callerkey.Bound).
			opts[1] = flow.WithKey(callerkey.Bound(key))
			n = 2
		}
	}
	en, err := l.eng.Entry(resource, opts[:n]...)
	if err == nil {
		return en, nil
	}
	var be *flow.BlockError
	switch {
	case errors.As(err, &be):
		b := en.Refusal()
		var st *status.Status
		if l.cfg.block != nil {
			st = l.cfg.block(ctx, b)
		}
		if st == nil || st.Code() == codes.OK {
			st = BlockStatus(b)
		}
		return flow.Entry{}, st.Err()
	case ctx.Err() != nil:
		// The wait ended with the call's context.
		l.failedClosed.Inc()
		return flow.Entry{}, status.FromContextError(ctx.Err()).Err()
	case l.cfg.failClosed:
		l.failedClosed.Inc()
		return flow.Entry{}, status.Error(codes.Unavailable, "grpcflow: rate limiter unavailable: "+err.Error())
	}
	// The resource could not be made (a full registry): let the call
	// through, counted.
	l.failedOpen.Inc()
	return flow.Entry{}, nil
}

// ErrorInfo domain and reasons of a block status.
const (
	Domain                = "leapflow"
	ReasonRateLimited     = "RATE_LIMITED"
	ReasonConcurrencyFull = "CONCURRENCY_LIMITED"
	ReasonCircuitOpen     = "CIRCUIT_OPEN"
)

// BlockStatus is the status a blocked call fails with by default:
// codes.ResourceExhausted (codes.Unavailable for a circuit breaker's
// refusal) with the block error's message, a RetryInfo
// detail when the rule says when it would admit the call, and an
// ErrorInfo naming the resource ("resource"), the rule ("rule", its ID or
// resource), why ("reason": flow, concurrency, queue, global or breaker), and the
// quota ("quota", and "window" as a Go duration; in flight when it is 0s).
//
// The ErrorInfo of a rule is marshalled once and kept in a small table,
// so a blocked call costs one small RetryInfo and the status.
func BlockStatus(b Blocked) *status.Status {
	code := codes.ResourceExhausted
	if b.Err.Reason == flow.ReasonBreaker {
		code = codes.Unavailable // the service is failing, not the caller too fast
	}
	p := &spb.Status{Code: int32(code), Message: b.Err.Error()}
	if b.RetryAfter >= 0 {
		// RetryInfo{retry_delay (1): Duration{seconds (1), nanos (2)}}.
		d := durationpb.New(b.RetryAfter)
		var dur []byte
		if d.Seconds != 0 {
			dur = protowire.AppendTag(dur, 1, protowire.VarintType)
			dur = protowire.AppendVarint(dur, uint64(d.Seconds))
		}
		if d.Nanos != 0 {
			dur = protowire.AppendTag(dur, 2, protowire.VarintType)
			dur = protowire.AppendVarint(dur, uint64(d.Nanos))
		}
		v := make([]byte, 0, len(dur)+2)
		v = protowire.AppendTag(v, 1, protowire.BytesType)
		v = protowire.AppendBytes(v, dur)
		p.Details = append(p.Details, &anypb.Any{TypeUrl: retryInfoURL, Value: v})
	}
	if info := errorInfo(b); info != nil {
		p.Details = append(p.Details, info)
	}
	return status.FromProto(p)
}

var retryInfoURL = "type.googleapis.com/" + string((&errdetails.RetryInfo{}).ProtoReflect().Descriptor().FullName())

// infoEntry is a marshalled ErrorInfo and what it was made from.
type infoEntry struct {
	be       *flow.BlockError
	resource string
	any      *anypb.Any
}

// infos keeps the ErrorInfo of recent rules, one per slot: a rule whose
// slot another took is marshalled again.
var (
	infos    [256]atomic.Pointer[infoEntry]
	infoSeed = maphash.MakeSeed()
)

// errorInfo returns b's ErrorInfo, marshalled (nil if it cannot be).
func errorInfo(b Blocked) *anypb.Any {
	slot := &infos[maphash.Comparable(infoSeed, b.Err)%uint64(len(infos))]
	if e := slot.Load(); e != nil && e.be == b.Err && e.resource == b.Resource {
		return e.any
	}
	quota, window := b.Err.Quota()
	info := &errdetails.ErrorInfo{
		Reason: ReasonRateLimited,
		Domain: Domain,
		Metadata: map[string]string{
			"resource": b.Resource,
			"rule":     b.Err.Rule.Name(),
			"reason":   b.Err.Reason.String(),
			"quota":    strconv.FormatInt(quota, 10),
			"window":   window.String(),
		},
	}
	switch b.Err.Reason {
	case flow.ReasonConcurrency:
		info.Reason = ReasonConcurrencyFull
	case flow.ReasonBreaker:
		info.Reason = ReasonCircuitOpen
	}
	a, err := anypb.New(info)
	if err != nil {
		return nil
	}
	slot.Store(&infoEntry{be: b.Err, resource: b.Resource, any: a})
	return a
}

// RetryDelay returns the delay a status error's RetryInfo detail asks
// for, and whether it has one: what a client waits before it retries a
// call that failed with ResourceExhausted.
func RetryDelay(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}
