package redistest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/atomic"
)

// Proxy forwards connections on a loopback port to a server and delays
// every byte by half the round trip it is set to, each way, as a server
// that far away would: a command's reply comes a round trip after it was
// sent, pipelined commands keep their order, and a new connection pays a
// round trip per command of its handshake. It listens on 127.0.0.1 only
// and holds nothing once closed.
type Proxy struct {
	t      testing.TB // nil outside tests
	ln     net.Listener
	target string
	half   atomic.Int64 // ns each way

	quit   chan struct{} // closed by Close
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	cut    bool
	wg     sync.WaitGroup
}

// StartProxy starts a Proxy to target with round trip rtt, closed when
// the test ends.
func StartProxy(t testing.TB, target string, rtt time.Duration) *Proxy {
	t.Helper()
	p, err := NewProxy(target, rtt)
	if err != nil {
		t.Fatal(err)
	}
	p.t = t
	t.Cleanup(p.Close)
	return p
}

// NewProxy starts a Proxy outside a test (the bench uses it); the caller
// must Close it.
func NewProxy(target string, rtt time.Duration) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, quit: make(chan struct{})}
	p.SetRTT(rtt)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetRTT changes the round trip of every byte sent from now on.
func (p *Proxy) SetRTT(rtt time.Duration) { p.half.Store(int64(rtt / 2)) }

// Client returns a client of the server through the proxy with go-redis'
// defaults, as the README configures one (context deadlines honoured, one
// dial attempt per connection, as global.New requires), closed when the
// test ends (outside a test, the caller closes it).
func (p *Proxy) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: p.Addr(), ContextTimeoutEnabled: true, DialerRetries: 1})
	if p.t != nil {
		p.t.Cleanup(func() { c.Close() })
	}
	return c
}

// Drop closes every connection open through the proxy (a network fault);
// new ones are accepted.
func (p *Proxy) Drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

// Cut closes every connection through the proxy and every new one at
// once, until Restore: the server is unreachable.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	p.mu.Unlock()
	p.Drop()
}

// Restore ends a Cut.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	if !p.closed {
		close(p.quit)
	}
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.Drop()
	p.wg.Wait()
}

// track adds c to the open connections, or closes it if the proxy is
// closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.cut {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer p.untrack(c)
			up, err := net.DialTimeout("tcp", p.target, time.Second)
			if err != nil {
				return
			}
			if !p.track(up) {
				return
			}
			defer p.untrack(up)
			done := make(chan struct{}, 2)
			go func() { p.pump(up, c); done <- struct{}{} }()
			go func() { p.pump(c, up); done <- struct{}{} }()
			<-done // one side ended: close both, then wait for the other
			c.Close()
			up.Close()
			<-done
		}()
	}
}

// chunk is bytes read at one moment, due at another.
type chunk struct {
	b   []byte
	due time.Time
}

// pump copies from src to dst, each chunk half a round trip after it was
// read. Chunks still held when the connection fails, or the proxy closes,
// are dropped.
func (p *Proxy) pump(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	writer := make(chan struct{})
	gone := make(chan struct{}) // closed when src fails
	go func() {
		defer close(writer)
		for ch := range q {
			if wait := time.Until(ch.due); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-t.C:
				case <-gone:
				case <-p.quit:
				}
				t.Stop()
			}
			select {
			case <-gone:
				for range q {
				}
				return
			case <-p.quit:
				for range q {
				}
				return
			default:
			}
			if _, err := dst.Write(ch.b); err != nil {
				dst.Close()
				src.Close()
				for range q { // drain until the reader stops
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			q <- chunk{b: append([]byte(nil), buf[:n]...), due: time.Now().Add(time.Duration(p.half.Load()))}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				close(gone)
				dst.Close()
			}
			break
		}
	}
	close(q)
	<-writer
	if tc, ok := dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
