// Command grpcservice is a gRPC service behind leapflow: each API key may
// call Say three times a second, and two Chat streams run at a time. It
// prints where it listens, shows calls of its own being refused with the
// delay the server asks for (google.rpc.RetryInfo), and serves until
// interrupted.
//
//	go run ./examples/grpcservice [-addr 127.0.0.1:50051]
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/grpcflow"
	"github.com/leapflow/leapflow/grpcflow/grpcflowtest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "address to listen on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, os.Stdout); err != nil {
		log.Print(err)
		stop()
		os.Exit(1)
	}
}

// rules are the service's limits, on the full method names.
var rules = []flow.Rule{
	{ID: "say-per-key", Resource: grpcflowtest.Say, Threshold: 3, PerKey: true},
	{ID: "chats", Resource: grpcflowtest.Chat, Metric: flow.Concurrency, Threshold: 2},
}

// run serves until ctx ends, after showing a few calls on out.
func run(ctx context.Context, addr string, out io.Writer) error {
	eng, err := flow.New()
	if err != nil {
		return err
	}
	if err := eng.LoadRules(rules); err != nil {
		return err
	}
	l := grpcflow.New(eng, grpcflow.WithKey(grpcflow.MetadataKey("x-api-key")))
	srv := grpc.NewServer(grpc.UnaryInterceptor(l.UnaryServer), grpc.StreamInterceptor(l.StreamServer))
	grpcflowtest.Register(srv, &grpcflowtest.Server{})

	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	fmt.Fprintf(out, "listening on %s (service leapflow.grpcflowtest.Echo)\n", lis.Addr())

	if err := demo(ctx, lis.Addr().String(), out); err != nil {
		srv.Stop()
		return err
	}
	fmt.Fprintln(out, "serving until interrupted")
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		return nil
	case err := <-done:
		return err
	}
}

// demo calls Say four times under one API key (the fourth is over its 3
// a second), once under another, and opens three Chat streams (two run at
// a time).
func demo(ctx context.Context, addr string, out io.Writer) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	say := func(key string, i int) {
		kctx := metadata.AppendToOutgoingContext(ctx, "x-api-key", key)
		err := conn.Invoke(kctx, grpcflowtest.Say, wrapperspb.String("hi"), new(wrapperspb.StringValue))
		line := fmt.Sprintf("Say #%d as %s -> %s", i, key, status.Code(err))
		if d, ok := grpcflow.RetryDelay(err); ok {
			line += fmt.Sprintf(" (retry in %v)", d.Round(time.Millisecond))
		}
		fmt.Fprintln(out, line)
	}
	for i := 1; i <= 4; i++ {
		say("alice", i)
	}
	say("bob", 1)

	sctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the streams
	for i := 1; i <= 3; i++ {
		s, err := conn.NewStream(sctx, &grpcflowtest.ChatDesc, grpcflowtest.Chat)
		if err == nil {
			err = s.SendMsg(wrapperspb.String("hello"))
		}
		if err == nil {
			err = s.RecvMsg(new(wrapperspb.StringValue)) // the server's answer, or its refusal
		}
		fmt.Fprintf(out, "Chat stream #%d -> %s\n", i, status.Code(err))
	}
	return nil
}
