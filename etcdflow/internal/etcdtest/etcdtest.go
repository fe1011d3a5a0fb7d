// Package etcdtest starts a real etcd (Debian's etcd-server) for tests, on
// free loopback ports with its data in the test's temporary directory, and
// a proxy in front of it that can cut the clients off. A missing etcd fails
// the test: tests that need etcd must not pass without it.
package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Server is one etcd member, a cluster of one.
type Server struct {
	t                    testing.TB
	dir                  string
	clientPort, peerPort int
	cmd                  *exec.Cmd
	exited               chan struct{}
}

// Start starts etcd and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("etcd"); err != nil {
		t.Fatal("etcdtest: etcd is not installed (Debian's etcd-server; make test installs it)")
	}
	s := &Server{t: t, dir: filepath.Join(t.TempDir(), "etcd")}
	var err error
	if s.clientPort, err = freePort(); err == nil {
		s.peerPort, err = freePort()
	}
	if err != nil {
		t.Fatal(err)
	}
	s.launch()
	t.Cleanup(s.Stop)
	return s
}

// Endpoint is the member's client URL.
func (s *Server) Endpoint() string { return "http://127.0.0.1:" + strconv.Itoa(s.clientPort) }

// Addr is the member's client host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.clientPort) }

func (s *Server) launch() {
	s.t.Helper()
	peer := "http://127.0.0.1:" + strconv.Itoa(s.peerPort)
	s.cmd = exec.Command("etcd",
		"--name", "test", "--data-dir", s.dir,
		"--listen-client-urls", s.Endpoint(), "--advertise-client-urls", s.Endpoint(),
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "test="+peer, "--initial-cluster-state", "new",
		"--log-level", "error")
	s.cmd.Stdout, s.cmd.Stderr = os.Stderr, os.Stderr
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("etcdtest: starting etcd: %v", err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func(cmd *exec.Cmd) {
		_ = cmd.Wait()
		close(exited)
	}(s.cmd)
	// Ready once /health answers true (a member that elected itself).
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.Endpoint()+"/health", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-exited:
			s.t.Fatalf("etcdtest: etcd exited while starting")
		case <-ctx.Done():
			s.t.Fatalf("etcdtest: etcd not ready in 20 s")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Stop kills the member (its data stays, for Restart).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Wipe replaces the member by a new one on its ports, with no data: a
// store restored from nothing, its revisions starting again.
func (s *Server) Wipe() {
	s.t.Helper()
	s.Stop()
	if err := os.RemoveAll(s.dir); err != nil {
		s.t.Fatal(err)
	}
	s.launch()
}

// Restart starts the member again on its ports, with its data.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.launch()
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("etcdtest: no free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Proxy forwards loopback connections to a server until Cut, which closes
// them all and refuses new ones until Restore: the server unreachable.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  map[net.Conn]bool
	cut    bool
	wg     sync.WaitGroup
}

// StartProxy starts a proxy to target, closed when the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// Endpoint is the proxy's URL.
func (p *Proxy) Endpoint() string { return "http://" + p.ln.Addr().String() }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// keep records c as open, or closes it while cut.
func (p *Proxy) keep(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *Proxy) drop(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		c.Close()
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.keep(in) {
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil || !p.keep(out) {
			p.drop(in)
			if out != nil {
				out.Close()
			}
			continue
		}
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			p.drop(in, out)
		}
		go pipe(out, in)
		go pipe(in, out)
	}
}
