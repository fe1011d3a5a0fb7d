// Package redistest starts real redis-server processes for tests: a single
// server on a free loopback port with persistence off, or a cluster of
// masters. A missing redis-server fails the test: tests that need Redis must
// not pass without it.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process.
type Server struct {
	t      testing.TB // nil outside tests
	Port   int
	dir    string
	ownDir bool
	args   []string
	cmd    *exec.Cmd
}

// Addr returns host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.Port) }

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: no free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Start starts a redis-server with persistence off and stops it when the
// test ends. extra are more config arguments ("--cluster-enabled", "yes").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := launch(t.TempDir(), extra)
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	t.Cleanup(s.Stop)
	return s
}

// Launch starts a redis-server outside a test (the bench uses it); the
// caller must Stop it.
func Launch(extra ...string) (*Server, error) {
	dir, err := os.MkdirTemp("", "leapflow-redis-")
	if err != nil {
		return nil, err
	}
	s, err := launch(dir, extra)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.ownDir = true
	return s, nil
}

func launch(dir string, extra []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{Port: port, dir: dir}
	s.args = append([]string{
		"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
		"--enable-debug-command", "local",
	}, extra...)
	return s, s.start()
}

func (s *Server) start() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("redistest: redis-server not found on PATH: install it (make test does, from Debian's packages)")
	}
	s.cmd = exec.Command(bin, s.args...)
	logf, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	defer logf.Close()
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redistest: redis-server on %s did not answer PING: %w", s.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (as a crash would) and waits for it to exit.
func (s *Server) Stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
	if s.ownDir {
		os.RemoveAll(s.dir)
		s.ownDir = false
	}
}

// Kill kills the server (kill -9) and waits for it to exit, keeping its
// port and directory for Restart.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Pause stops the server (SIGSTOP): it keeps its connections and answers
// nothing until Resume.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) error {
	if s.cmd == nil || s.cmd.Process == nil {
		return fmt.Errorf("redistest: the server is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// Restart starts the server again on the same port, empty.
func (s *Server) Restart() error {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
	return s.start()
}

// Client returns a client of the server that honours context deadlines,
// closed when the test ends (outside a test, the caller closes it).
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr: s.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	if s.t != nil {
		s.t.Cleanup(func() { c.Close() })
	}
	return c
}

// Cluster is a Redis Cluster of masters on loopback.
type Cluster struct {
	Servers []*Server
}

// StartCluster starts n masters (at least 3) and joins them with
// redis-cli --cluster create.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	var addrs []string
	for range n {
		s := Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000")
		c.Servers = append(c.Servers, s)
		addrs = append(addrs, s.Addr())
	}
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redistest: redis-cli not found on PATH: install it (make test does, from Debian's packages)")
	}
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	// Every node must see the cluster as ok, or the first calls fail with
	// CLUSTERDOWN.
	deadline := time.Now().Add(15 * time.Second)
	for _, s := range c.Servers {
		node := redis.NewClient(&redis.Options{Addr: s.Addr()})
		for {
			info, err := node.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				node.Close()
				t.Fatalf("redistest: cluster not ok on %s: %v %s", s.Addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		node.Close()
	}
	return c
}

// Addrs returns every master's address.
func (c *Cluster) Addrs() []string {
	var a []string
	for _, s := range c.Servers {
		a = append(a, s.Addr())
	}
	return a
}

// Client returns a cluster client, closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: c.Addrs(), ContextTimeoutEnabled: true, DialerRetries: 1,
		DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	t.Cleanup(func() { cc.Close() })
	return cc
}
