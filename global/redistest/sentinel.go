package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Sentinel is a master, one replica of it and one redis-sentinel watching
// them under the name Name, all on loopback.
type Sentinel struct {
	Name     string
	Master   *Server
	Replica  *Server
	Sentinel *Server
}

// StartSentinel starts the three processes and waits until the replica is
// in sync and the sentinel knows it; they stop when the test ends.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	st := &Sentinel{Name: "leapflow", Master: Start(t)}
	st.Replica = Start(t, "--replicaof", "127.0.0.1", fmt.Sprint(st.Master.Port))
	waitFor(t, 10*time.Second, "the replica to sync", func() bool {
		return strings.Contains(info(st.Replica, "replication"), "master_link_status:up")
	})

	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	// The sentinel rewrites its config file, so it gets one of its own.
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
		"sentinel monitor %s 127.0.0.1 %d 1\n"+
		"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
		port, dir, st.Name, st.Master.Port, st.Name, st.Name)
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	st.Sentinel = &Server{t: t, Port: port, dir: dir, args: []string{conf, "--sentinel"}}
	if err := st.Sentinel.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Sentinel.Stop)
	return st
}

// Client returns a failover client that finds the master through the
// sentinel and honours context deadlines, closed when the test ends.
func (st *Sentinel) Client(t testing.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: st.Name, SentinelAddrs: []string{st.Sentinel.Addr()},
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// Failover makes the sentinel promote the replica (SENTINEL FAILOVER,
// retried while the sentinel has no replica it deems good yet) and waits
// until the sentinel names it master, it acts as one, and the old master
// has been turned into its replica (until then both take writes: clients
// that have not heard of the switch still write to the old one). The
// sentinel does that last step on its next look at the old master, about
// ten seconds after the switch.
func (st *Sentinel) Failover(t testing.TB) {
	t.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: st.Sentinel.Addr()})
	defer c.Close()
	ctx := context.Background()
	waitFor(t, 15*time.Second, "the sentinel to accept a failover", func() bool {
		return c.Failover(ctx, st.Name).Err() == nil
	})
	want := fmt.Sprint(st.Replica.Port)
	waitFor(t, 15*time.Second, "the replica to become master", func() bool {
		addr, err := c.GetMasterAddrByName(ctx, st.Name).Result()
		return err == nil && len(addr) == 2 && addr[1] == want &&
			strings.Contains(info(st.Replica, "replication"), "role:master")
	})
	waitFor(t, 30*time.Second, "the old master to become a replica", func() bool {
		return strings.Contains(info(st.Master, "replication"), "role:slave")
	})
}

// info returns a section of INFO from s ("" when it does not answer).
func info(s *Server, section string) string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	out, _ := c.Info(ctx, section).Result()
	return out
}

func waitFor(t testing.TB, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
