// Command rlsbench measures leapflow serve against envoyproxy/ratelimit,
// side by side: the same redis-server, the same descriptor configuration
// and the same load generator (gRPC clients calling ShouldRateLimit as
// fast as they can). For each server it reports decisions per second,
// Redis commands per decision (the change in INFO commandstats over the
// run, divided by the decisions) and the most requests admitted in any
// continuous second against the limit (admissions timed as their answers
// arrive at the client, so a burst of late answers can add to a second's
// count; -span-exact holds every span at the server).
//
//	cd cmd/leapflow && go run ./rlsbench -build-peer   # builds the peer first (minutes)
//	go run ./rlsbench -peer /path/to/service_cmd       # a peer built before
//
// The peer is built outside leapflow's modules, with GOBIN pointing at a
// temporary folder, so nothing of it enters a go.mod. Needs redis-server.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// peerVersion is the envoyproxy/ratelimit commit measured (its main
// branch on 2026-01-22; it tags no releases).
const peerVersion = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

func main() {
	peer := flag.String("peer", "", "the envoyproxy/ratelimit binary (service_cmd)")
	build := flag.Bool("build-peer", false, "build the peer first ("+peerVersion+")")
	dur := flag.Duration("d", 10*time.Second, "how long each server is loaded")
	conns := flag.Int("c", 4, "gRPC connections")
	workers := flag.Int("w", 64, "callers (spread over the connections)")
	limit := flag.Int("limit", 1000, "the hot descriptor's requests per second")
	flag.Parse()
	if err := run(*peer, *build, *dur, *conns, *workers, *limit); err != nil {
		fmt.Fprintln(os.Stderr, "rlsbench:", err)
		os.Exit(1)
	}
}

func run(peer string, build bool, dur time.Duration, conns, workers, limit int) error {
	tmp, err := os.MkdirTemp("", "rlsbench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if build {
		fmt.Println("building the peer:", peerVersion)
		bin := filepath.Join(tmp, "bin")
		cmd := exec.Command("go", "install", peerVersion)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOBIN="+bin, "GOWORK=off", "GOFLAGS=")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building the peer: %w", err)
		}
		peer = filepath.Join(bin, "service_cmd")
	}
	fmt.Println("building leapflow")
	leapflow := filepath.Join(tmp, "leapflow")
	cmd := exec.Command("go", "build", "-o", leapflow, "github.com/leapflow/leapflow/cmd/leapflow")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return err
	}

	// The shared configuration, where the peer looks for it.
	confDir := filepath.Join(tmp, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf("domain: bench\ndescriptors:\n  - key: api\n    value: hot\n    rate_limit:\n      unit: second\n      requests_per_unit: %d\n", limit)
	if err := os.WriteFile(filepath.Join(confDir, "bench.yaml"), []byte(conf), 0o644); err != nil {
		return err
	}

	rport, err := freePort()
	if err != nil {
		return err
	}
	redisCmd := exec.Command("redis-server", "--port", strconv.Itoa(rport), "--save", "", "--appendonly", "no", "--bind", "127.0.0.1")
	if err := redisCmd.Start(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	defer func() { redisCmd.Process.Kill(); redisCmd.Wait() }()
	raddr := "127.0.0.1:" + strconv.Itoa(rport)
	rc := redis.NewClient(&redis.Options{Addr: raddr})
	defer rc.Close()
	if err := waitFor(func() error { return rc.Ping(context.Background()).Err() }); err != nil {
		return fmt.Errorf("redis: %w", err)
	}

	type server struct {
		name  string
		start func(port int) *exec.Cmd
	}
	lf := func(extra ...string) func(port int) *exec.Cmd {
		return func(port int) *exec.Cmd {
			return exec.Command(leapflow, append([]string{"serve", "-config", confDir, "-addr", "127.0.0.1:" + strconv.Itoa(port), "-admin", ""}, extra...)...)
		}
	}
	servers := []server{
		{"leapflow serve (one replica, sliding window)", lf()},
		{"leapflow serve -span-exact", lf("-span-exact")},
		{"leapflow serve -redis", lf("-redis", raddr)},
		{"leapflow serve -redis -span-exact", lf("-redis", raddr, "-span-exact")},
	}
	if peer != "" {
		servers = append(servers, server{"envoyproxy/ratelimit", func(port int) *exec.Cmd {
			hp, _ := freePort()
			dp, _ := freePort()
			pp, _ := freePort()
			c := exec.Command(peer)
			c.Env = append(os.Environ(),
				"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+raddr, "USE_STATSD=false",
				// Its statistics to Prometheus, as leapflow's (without a sink it
				// logs every timer sample).
				"USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:"+strconv.Itoa(pp),
				"RUNTIME_ROOT="+filepath.Join(tmp, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
				"RUNTIME_WATCH_ROOT=false", "LOG_LEVEL=warn",
				"GRPC_HOST=127.0.0.1", "GRPC_PORT="+strconv.Itoa(port),
				"HOST=127.0.0.1", "PORT="+strconv.Itoa(hp), "DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+strconv.Itoa(dp))
			return c
		}})
	} else {
		fmt.Println("no peer (-peer or -build-peer): leapflow only")
	}

	fmt.Printf("\nload: %d callers on %d connections, %v per server; descriptor api=hot at %d/s; GOMAXPROCS of this machine: %d cores\n\n", workers, conns, dur, limit, runtime.NumCPU())
	fmt.Println("| server | decisions/s | admitted/s | Redis commands per decision | most admitted in any 1 s | limit |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, s := range servers {
		port, err := freePort()
		if err != nil {
			return err
		}
		rc.FlushAll(context.Background())
		c := s.start(port)
		logf, err := os.Create(filepath.Join(tmp, fmt.Sprintf("server%d.log", port)))
		if err != nil {
			return err
		}
		c.Stdout, c.Stderr = logf, logf
		if err := c.Start(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		res, err := load(rc, "127.0.0.1:"+strconv.Itoa(port), dur, conns, workers)
		c.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			c.Process.Kill()
			<-done
		}
		logf.Close()
		if err != nil {
			out, _ := os.ReadFile(logf.Name())
			return fmt.Errorf("%s: %w\n%s", s.name, err, out[max(0, len(out)-4096):])
		}
		fmt.Printf("| %s | %.0f | %.0f | %.4f | %d | %d |\n", s.name, res.perSec, res.admittedPerSec, res.redisPerDecision, res.maxSecond, limit)
	}
	return nil
}

type result struct {
	perSec, admittedPerSec, redisPerDecision float64
	maxSecond                                int
}

// load runs the callers against addr for dur after a warm-up second.
func load(rc *redis.Client, addr string, dur time.Duration, conns, workers int) (result, error) {
	clients := make([]rlsv3.RateLimitServiceClient, conns)
	for i := range clients {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return result{}, err
		}
		defer cc.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api", Value: "hot"}}}}}
	if err := waitFor(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := clients[0].ShouldRateLimit(ctx, req)
		return err
	}); err != nil {
		return result{}, fmt.Errorf("not answering: %w", err)
	}
	// Warm-up.
	drive(clients, req, workers, time.Now().Add(time.Second), nil)
	before, err := commandCalls(rc)
	if err != nil {
		return result{}, err
	}
	var mu sync.Mutex
	var admitted []int64
	start := time.Now()
	n, errs := drive(clients, req, workers, start.Add(dur), func(at []int64) {
		mu.Lock()
		admitted = append(admitted, at...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	after, err := commandCalls(rc)
	if err != nil {
		return result{}, err
	}
	if errs > 0 {
		fmt.Fprintf(os.Stderr, "%d calls failed\n", errs)
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i] < admitted[j] })
	most, j := 0, 0
	for i := range admitted {
		for admitted[i]-admitted[j] >= int64(time.Second) {
			j++
		}
		most = max(most, i-j+1)
	}
	return result{
		perSec:           float64(n) / elapsed.Seconds(),
		admittedPerSec:   float64(len(admitted)) / elapsed.Seconds(),
		redisPerDecision: float64(after-before) / float64(max(n, 1)),
		maxSecond:        most,
	}, nil
}

// drive calls until end; it returns the calls answered and failed, and
// gives each caller's admission times to keep.
func drive(clients []rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, workers int, end time.Time, keep func([]int64)) (int64, int64) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total, failed int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[w%len(clients)]
			var n, bad int64
			var at []int64
			for time.Now().Before(end) {
				resp, err := c.ShouldRateLimit(context.Background(), req)
				if err != nil {
					bad++
					continue
				}
				n++
				if keep != nil && resp.OverallCode == rlsv3.RateLimitResponse_OK {
					at = append(at, time.Now().UnixNano())
				}
			}
			if keep != nil {
				keep(at)
			}
			mu.Lock()
			total += n
			failed += bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	return total, failed
}

// commandCalls sums the calls of every command in INFO commandstats
// (less the INFO calls themselves).
func commandCalls(rc *redis.Client) (int64, error) {
	s, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var sum int64
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" || name == "cmdstat_flushall" {
			continue
		}
		for _, f := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				sum += n
			}
		}
	}
	return sum, nil
}

func waitFor(f func() error) error {
	var err error
	for range 100 {
		if err = f(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.Join(errors.New("gave up after 10 s"), err)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
