package global

// Dials: what a Source needs of its client when Redis dies, and Dial, which
// builds a client that has it.

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
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

// checkClient refuses a client whose settings keep a dead Redis from
// failing a call at once: go-redis dials a refused connection
// DialerRetries times, 100 ms apart by default, before the call hears of
// it. Clients of other types (a Ring) are not checked.
func checkClient(client redis.UniversalClient) error {
	var retries int
	switch c := client.(type) {
	case *redis.Client:
		retries = c.Options().DialerRetries
	case *redis.ClusterClient:
		retries = c.Options().DialerRetries
	default:
		return nil
	}
	if retries > 1 {
		return fmt.Errorf("global: the client's DialerRetries is %d: each call to a Redis that refuses connections would spend that many dials, 100 ms apart, before it fails; "+
			"set DialerRetries: 1 in the client's options, or build the client with global.Dial", retries)
	}
	return nil
}

// bindDials adds dialHook to client (to each node's client in a Cluster).
func bindDials(client redis.UniversalClient, timeout time.Duration) {
	h := dialHook{timeout: timeout}
	if c, ok := client.(*redis.ClusterClient); ok {
		c.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
		return
	}
	client.AddHook(h)
}

// dialHook bounds every dial of the client by the Source's Timeout and
// makes a failed dial the failure of the command that needed it: go-redis
// retries a command whose dial failed (MaxRetries, with a backoff between
// tries), which would stretch a call to a dead Redis to its CallTimeout.
type dialHook struct{ timeout time.Duration }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
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
