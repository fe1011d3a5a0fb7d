// Package grpcflowtest has helpers for testing code that uses grpcflow (like
// stat/stattest for flow): an echo gRPC service for tests and examples,
// written without generated code. Say answers one message (unary), Chat
// answers each message of a stream (bidirectional), and Count sends n
// messages (server streaming). Messages are wrapperspb.StringValue.
package grpcflowtest

import (
	"context"
	"errors"
	"io"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Full method names.
const (
	Say   = "/leapflow.echo.Echo/Say"
	Chat  = "/leapflow.echo.Echo/Chat"
	Count = "/leapflow.echo.Echo/Count"
)

// Server answers the service's calls. Fail, when set, decides a unary
// call's error from its message (nil: answer it).
type Server struct {
	Fail func(msg string) error
}

// Register adds s to srv.
func Register(srv *grpc.Server, s *Server) { srv.RegisterService(&desc, s) }

// ChatDesc and CountDesc are the streams' descriptions, for NewStream.
var (
	ChatDesc  = grpc.StreamDesc{StreamName: "Chat", ServerStreams: true, ClientStreams: true}
	CountDesc = grpc.StreamDesc{StreamName: "Count", ServerStreams: true}
)

var desc = grpc.ServiceDesc{
	ServiceName: "leapflow.echo.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Say",
		Handler: func(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
			in := new(wrapperspb.StringValue)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(*Server).say(req.(*wrapperspb.StringValue))
			}
			if icpt == nil {
				return h(ctx, in)
			}
			return icpt(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: Say}, h)
		},
	}},
	Streams: []grpc.StreamDesc{
		{StreamName: "Chat", ServerStreams: true, ClientStreams: true, Handler: chat},
		{StreamName: "Count", ServerStreams: true, Handler: count},
	},
}

func (s *Server) say(in *wrapperspb.StringValue) (*wrapperspb.StringValue, error) {
	if s.Fail != nil {
		if err := s.Fail(in.Value); err != nil {
			return nil, err
		}
	}
	return wrapperspb.String(in.Value), nil
}

func chat(_ any, ss grpc.ServerStream) error {
	for {
		in := new(wrapperspb.StringValue)
		err := ss.RecvMsg(in)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if in.Value == "fail" {
			return status.Error(codes.Internal, "echo: asked to fail")
		}
		if err := ss.SendMsg(in); err != nil {
			return err
		}
	}
}

func count(_ any, ss grpc.ServerStream) error {
	in := new(wrapperspb.StringValue)
	if err := ss.RecvMsg(in); err != nil {
		return err
	}
	n, err := strconv.Atoi(in.Value)
	if err != nil {
		return status.Error(codes.InvalidArgument, "echo: not a count")
	}
	for i := range n {
		if err := ss.SendMsg(wrapperspb.String(strconv.Itoa(i))); err != nil {
			return err
		}
	}
	return nil
}
