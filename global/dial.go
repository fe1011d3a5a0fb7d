package global

// Dials: what a Source needs of its client when Redis dies, and Dial, which
// builds a client that has it.

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/atomic"
)

// Dial returns a Source on a client it builds from o, and closes that
// client when it closes. It builds the client as the Source needs it
// (see New): one dial attempt per connection (DialerRetries 1), context
// deadlines honoured (ContextTimeoutEnabled), and a DialTimeout no longer
// than the Source's Timeout. o is not modified.
func Dial(o *redis.UniversalOptions, option ...Option) (*Source, error) {
	if o == nil {
		return nil, fmt.Errorf("global: Dial's options must not be nil")
	}
	opts, err := newOptions(option)
	if err != nil {
		return nil, err
	}
	c := *o
	c.DialerRetries = 1
	c.ContextTimeoutEnabled = true
	if c.DialTimeout <= 0 || c.DialTimeout > opts.Timeout {
		c.DialTimeout = opts.Timeout
	}
	client := redis.NewUniversalClient(&c)
	s, err := New(client, option...)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	s.owned = client
	return s, nil
}

// checkClient refuses a client whose settings keep a dead or silent Redis
// from failing a call in its time: go-redis dials a refused connection
// DialerRetries times, 100 ms apart by default, before the call hears of
// it (a Cluster's nodes take 5 for anything but a positive value), and a
// client that ignores context deadlines waits out its own read and write
// timeouts (5 s by default) instead of the CallTimeout. Clients of other
// types (a Ring) are not checked.
func checkClient(client redis.UniversalClient, callTimeout time.Duration) error {
	var retries int
	var ctxTimeout bool
	var read, write time.Duration
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		retries, ctxTimeout, read, write = o.DialerRetries, o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	case *redis.ClusterClient:
		o := c.Options()
		retries, ctxTimeout, read, write = o.DialerRetries, o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout
	default:
		return nil
	}
	// 0 and negative: no deadline (go-redis' Options read -1 as 0, -2 as -1).
	long := func(d time.Duration) bool { return d <= 0 || d > callTimeout }
	switch {
	case retries != 1:
		return fmt.Errorf("global: the client's DialerRetries is %d: each call to a Redis that refuses connections would spend up to 5 dials, 100 ms apart, before it fails; "+
			"set DialerRetries: 1 in the client's options, or build the client with global.Dial", retries)
	case !ctxTimeout && (long(read) || long(write)):
		return fmt.Errorf("global: the client ignores context deadlines (ContextTimeoutEnabled false) and its ReadTimeout %v or WriteTimeout %v is longer than the CallTimeout (%v): "+
			"a silent Redis would hold every call that long; set ContextTimeoutEnabled: true, or build the client with global.Dial", read, write, callTimeout)
	}
	return nil
}

// bindDials adds dialHook to client (to each node's client in a Cluster:
// those made from now on, and those already made, as far as the cluster
// answers within the timeout).
func bindDials(client redis.UniversalClient, s *Source) {
	h := dialHook{timeout: s.opts.Timeout, closed: &s.closed}
	if c, ok := client.(*redis.ClusterClient); ok {
		c.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
		ctx, cancel := context.WithTimeout(context.Background(), s.opts.Timeout)
		defer cancel()
		_ = c.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error { node.AddHook(h); return nil })
		return
	}
	client.AddHook(h)
}

// dialHook bounds every dial of the client by the Source's Timeout and
// makes a failed dial the failure of the command that needed it: go-redis
// retries a command whose dial failed (MaxRetries, with a backoff between
// tries), which would stretch a call to a dead Redis to its CallTimeout.
// The TCP connect must therefore fit in the Timeout (a Redis up to a
// Timeout's round trip away; a TLS handshake is bounded by the client's
// DialTimeout, as go-redis dials it). go-redis has no way to take a hook
// off: once the Source is closed, its hook lets dials through untouched.
type dialHook struct {
	timeout time.Duration
	closed  *atomic.Bool
}

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if h.closed.Load() {
			return next(ctx, network, addr)
		}
		ctx, cancel := context.WithTimeout(ctx, h.timeout)
		defer cancel()
		c, err := next(ctx, network, addr)
		if err != nil {
			return deadConn{&DialError{msg: err.Error()}}, nil
		}
		return c, nil
	}
}

// deadConn stands for a connection whose dial failed: its first read or
// write fails the command with the dial's error. go-redis counts failed
// dials, and after as many as its PoolSize in a row it stops dialling and
// tries once a second in the background: instances cut off from Redis
// together would then come back up to a second apart, whatever their
// probes. A dead connection is dropped from the pool like any broken one.
type deadConn struct{ err error }

func (c deadConn) Read([]byte) (int, error)       { return 0, c.err }
func (c deadConn) Write([]byte) (int, error)      { return 0, c.err }
func (deadConn) Close() error                     { return nil }
func (deadConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (deadConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (deadConn) SetDeadline(time.Time) error      { return nil }
func (deadConn) SetReadDeadline(time.Time) error  { return nil }
func (deadConn) SetWriteDeadline(time.Time) error { return nil }

// SyscallConn fails, so that go-redis' health check drops a dead
// connection the pool made ahead of need (MinIdleConns) instead of handing
// it out once Redis is back.
func (c deadConn) SyscallConn() (syscall.RawConn, error) { return nil, c.err }

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// DialError is a failed dial of a Source's client. It carries the dial's
// message but does not wrap its error: go-redis retries a command whose
// error is a network or timeout error, and a Source's call must fail at
// its first failed dial.
type DialError struct{ msg string }

func (e *DialError) Error() string { return "global: dial: " + e.msg }
