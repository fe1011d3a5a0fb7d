package global

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/global/redistest"
)

// countDials counts every dial the client makes (added before the
// Source's hook, it sees each attempt).
type countDials struct{ n *atomic.Int64 }

func (h countDials) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.n.Inc()
		return next(ctx, network, addr)
	}
}
func (countDials) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (countDials) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// refusingAddr is a loopback port nothing listens on: a dial is refused.
func refusingAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// TestRefusedConnectionFailsTheCallAtItsOneDial: against a port that
// refuses connections (a Redis killed), each call dials once and fails
// with the dial's error, which its request hears: go-redis' dial retries
// (5, 100 ms apart) and command retries (MaxRetries) would each dial again
// and stretch every call to its CallTimeout.
func TestRefusedConnectionFailsTheCallAtItsOneDial(t *testing.T) {
	var dials atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: refusingAddr(t), ContextTimeoutEnabled: true, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	c.AddHook(countDials{&dials})
	src, err := New(c, WithFailAfter(5), WithTimeout(time.Second), WithMaxBatch(1))
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	src.bg.Wait() // the scripts' load, which dials too
	for i := range 4 {
		from, calls := dials.Load(), src.Stats().Calls
		ok, err := src.Acquire(context.Background(), req("refused", 100, time.Second, 1))
		assert.False(t, ok)
		var de *DialError
		require.ErrorAs(t, err, &de, "call %d: the request hears the dial's failure, not a late refusal", i)
		assert.Equal(t, int64(1), src.Stats().Calls-calls, "call %d", i)
		assert.Equal(t, int64(1), dials.Load()-from, "call %d: one dial", i)
	}
	assert.Zero(t, src.Stats().Late, "no request waited out its Timeout")
}

// TestDialIsBoundedByTimeout: a dial that would hang (a Redis whose host
// drops packets) is given the Source's Timeout, not go-redis'
// DialTimeout (5 s) or the call's CallTimeout.
func TestDialIsBoundedByTimeout(t *testing.T) {
	const timeout = 150 * time.Millisecond
	var left atomic.Duration
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true, DialerRetries: 1,
		Dialer: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if d, ok := ctx.Deadline(); ok {
				left.Store(time.Until(d))
			}
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}
		}})
	t.Cleanup(func() { c.Close() })
	src, err := New(c, WithTimeout(timeout), WithCallTimeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	src.bg.Wait()
	_, err = src.Acquire(context.Background(), req("hang", 100, time.Second, 1))
	require.Error(t, err)
	assert.Positive(t, left.Load(), "the dial has a deadline")
	assert.LessOrEqual(t, left.Load(), timeout, "no later than the Timeout")
}

// TestNewRefusesAClientThatRetriesDials: a client with go-redis' default
// of 5 dial attempts is refused with what to set; Dial builds one that
// works and closes it with the Source.
func TestNewRefusesAClientThatRetriesDials(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { c.Close() })
	_, err := New(c)
	assert.ErrorContains(t, err, "the client's DialerRetries is 5")
	assert.ErrorContains(t, err, "set DialerRetries: 1")

	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}})
	t.Cleanup(func() { cc.Close() })
	_, err = New(cc)
	assert.ErrorContains(t, err, "the client's DialerRetries is 5")
	cc = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr()}, DialerRetries: -1})
	t.Cleanup(func() { cc.Close() })
	_, err = New(cc)
	assert.ErrorContains(t, err, "the client's DialerRetries is -1", "its nodes would take 5")

	slow := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialerRetries: 1})
	t.Cleanup(func() { slow.Close() })
	_, err = New(slow)
	assert.ErrorContains(t, err, "ignores context deadlines (ContextTimeoutEnabled false) and its ReadTimeout 5s",
		"a silent Redis would hold each call 5 s (go-redis' default), past the CallTimeout")
	never := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialerRetries: 1, ReadTimeout: -1, WriteTimeout: -1})
	t.Cleanup(func() { never.Close() })
	_, err = New(never)
	assert.ErrorContains(t, err, "ignores context deadlines", "no read or write timeout at all")
	quick := redis.NewClient(&redis.Options{Addr: srv.Addr(), DialerRetries: 1, ReadTimeout: time.Second, WriteTimeout: time.Second})
	t.Cleanup(func() { quick.Close() })
	src, err := New(quick)
	require.NoError(t, err, "read and write timeouts within the CallTimeout will do")
	require.NoError(t, src.Close())
	require.NoError(t, quick.Ping(context.Background()).Err(), "the client works on after the Source closed")

	_, err = Dial(nil)
	assert.ErrorContains(t, err, "must not be nil")
	_, err = Dial(&redis.UniversalOptions{Addrs: []string{srv.Addr()}}, WithBuckets(0))
	assert.ErrorContains(t, err, "WithBuckets")

	o := &redis.UniversalOptions{Addrs: []string{srv.Addr()}}
	src, err = Dial(o)
	require.NoError(t, err)
	assert.Zero(t, o.DialerRetries, "the caller's options are left as they were")
	ok, err := src.Acquire(context.Background(), req("dialled", 100, time.Second, 1))
	require.NoError(t, err)
	assert.True(t, ok)
	owned := src.owned.(*redis.Client)
	assert.Equal(t, 1, owned.Options().DialerRetries)
	assert.True(t, owned.Options().ContextTimeoutEnabled)
	assert.Equal(t, 100*time.Millisecond, owned.Options().DialTimeout, "no longer than the Timeout")
	require.NoError(t, src.Close())
	assert.ErrorIs(t, owned.Ping(context.Background()).Err(), redis.ErrClosed, "closed with the Source")
}

// TestDeadConnectionsAreNotKeptForLater: a pool that keeps idle
// connections ready (MinIdleConns) makes them while Redis is down too; none
// is handed out once Redis is back, so the first call after the restart
// finds it.
func TestDeadConnectionsAreNotKeptForLater(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, DialerRetries: 1, MinIdleConns: 10, PoolFIFO: true})
	t.Cleanup(func() { c.Close() })
	src, err := New(c, WithFailAfter(1000), WithMaxBatch(1))
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	r := req("idle", 1000, time.Second, 1)
	ok, err := src.Acquire(context.Background(), r)
	require.NoError(t, err)
	require.True(t, ok)
	srv.Kill()
	for range 20 {
		_, err := src.Acquire(context.Background(), r)
		require.Error(t, err)
	}
	require.Eventually(t, func() bool { return c.PoolStats().IdleConns >= 5 }, 5*time.Second, time.Millisecond,
		"the pool makes its idle connections while Redis is down")
	require.NoError(t, srv.Restart())
	errs := src.Stats().Errors
	ok, err = src.Acquire(context.Background(), r)
	require.NoError(t, err, "the first call after the restart")
	assert.True(t, ok)
	assert.Equal(t, errs, src.Stats().Errors)
}
