package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/leapflow/leapflow/global/redistest"
)

// running is a leapflow serve started by a test.
type running struct {
	grpcAddr, adminAddr string
	client              rlsv3.RateLimitServiceClient
	health              healthpb.HealthClient
	stop                func() error // cancels and waits for serve to return
	log                 *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs serve with args until the test ends.
func start(t *testing.T, reload chan os.Signal, args ...string) *running {
	t.Helper()
	c, code := serveFlags(append([]string{"-addr", "127.0.0.1:0", "-admin", "127.0.0.1:0", "-debounce", "20ms"}, args...), io.Discard)
	require.Equal(t, -1, code)
	r := &running{log: &syncBuffer{}}
	c.logger = slog.New(slog.NewTextHandler(r.log, nil))
	ready := make(chan struct{})
	c.ready = func(g, a string) { r.grpcAddr, r.adminAddr = g, a; close(ready) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, c, reload) }()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("serve returned before serving: %v", err)
	}
	var once sync.Once
	var stopErr error
	r.stop = func() error {
		once.Do(func() { cancel(); stopErr = <-done })
		return stopErr
	}
	t.Cleanup(func() { r.stop() })
	cc, err := grpc.NewClient(r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	r.client = rlsv3.NewRateLimitServiceClient(cc)
	r.health = healthpb.NewHealthClient(cc)
	return r
}

func (r *running) ask(t *testing.T, hits uint32, kv ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}, HitsAddend: hits})
	require.NoError(t, err)
	return resp
}

func writeConfig(t *testing.T, path string, perMinute int) {
	t.Helper()
	y := "domain: edge\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: minute\n      requests_per_unit: " + strconv.Itoa(perMinute) + "\n"
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(y), 0o644))
	require.NoError(t, os.Rename(tmp, path)) // as an editor or a config map
}

// limitOf reads the current limit of user u without counting.
func (r *running) limitOf(t *testing.T, u string) uint32 {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: u}}}
	resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
	require.NoError(t, err)
	return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
}

func TestServeAnswersHealthMetricsAndReloadsKeepingTheLastGood(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "edge.yaml")
	writeConfig(t, path, 3)
	reload := make(chan os.Signal, 1)
	r := start(t, reload, "-config", dir)

	h, err := r.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	require.NoError(t, err)
	assert.Equal(t, healthpb.HealthCheckResponse_SERVING, h.Status)

	var codes []rlsv3.RateLimitResponse_Code
	for range 4 {
		codes = append(codes, r.ask(t, 0, "user", "ann").OverallCode)
	}
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}, codes)

	res, err := http.Get("http://" + r.adminAddr + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	res.Body.Close()
	assert.Contains(t, string(body), `resource="edge/user"`)
	res, err = http.Get("http://" + r.adminAddr + "/dashboard/")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)

	// A change on disk is read again.
	writeConfig(t, path, 7)
	require.Eventually(t, func() bool { return r.limitOf(t, "bob") == 7 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.ask(t, 5, "user", "ann").OverallCode, "ann's count (3 of 7) stays across the reload")

	// A bad one is logged, and the last good stays, also on SIGHUP.
	require.NoError(t, os.WriteFile(path, []byte("domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644))
	require.Eventually(t, func() bool { return strings.Contains(r.log.String(), "fortnight") }, 5*time.Second, 10*time.Millisecond)
	reload <- os.Interrupt
	assert.Equal(t, uint32(7), r.limitOf(t, "bob"))

	require.NoError(t, r.stop())
	_, err = r.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
	assert.Error(t, err, "stopped")
}

func TestServeDrainsCallsInFlight(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, filepath.Join(dir, "edge.yaml"), 100)
	r := start(t, nil, "-config", dir)
	// Calls running as the stop begins all get their answers.
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "x"}}}
			_, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
			errs <- err
		}()
	}
	wg.Wait()
	require.NoError(t, r.stop())
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
}

func TestServeFlagsAreChecked(t *testing.T) {
	var out bytes.Buffer
	_, code := serveFlags(nil, &out)
	assert.Equal(t, 2, code)
	assert.Contains(t, out.String(), "-config or -rules")
	out.Reset()
	_, code = serveFlags([]string{"-rules", "x", "-local-share", "2"}, &out)
	assert.Equal(t, 2, code)
	assert.Contains(t, out.String(), "-local-share 2")
	assert.Equal(t, 1, serveCmd([]string{"-config", filepath.Join(t.TempDir(), "missing.yaml"), "-addr", "127.0.0.1:0", "-admin", ""}, &out))
	for _, c := range []struct{ args, says string }{
		{"-local-share NaN", "-local-share NaN: must be in (0, 1]"},
		{"-max-request-bytes 0", "-max-request-bytes 0: must be at least 1024"},
		{"-max-keys -3", "-max-keys -3: must be 0 (the default) or more"},
		{"-drain -1s", "-drain -1s: must be 0 or more"},
		{"-redis-timeout 0s", "-redis-timeout 0s: must be more than 0"},
	} {
		out.Reset()
		_, code = serveFlags(append([]string{"-rules", "x"}, strings.Fields(c.args)...), &out)
		assert.Equal(t, 2, code, c.args)
		assert.Contains(t, out.String(), c.says)
	}
}

// Only configuration files are changes: a log written beside them
// reloads nothing; a configuration directory removed and made again is
// watched again, and read.
func TestServeWatchesConfigurationFilesOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "config")
	require.NoError(t, os.Mkdir(dir, 0o755))
	writeConfig(t, filepath.Join(dir, "edge.yaml"), 3)
	r := start(t, nil, "-config", dir)
	logFile := filepath.Join(dir, "serve.log")
	// Real time against a real server: a log appended to for 300 ms.
	require.Never(t, func() bool {
		f, err := os.OpenFile(logFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, "a line")
			f.Close()
		}
		return strings.Contains(r.log.String(), "reloaded")
	}, 300*time.Millisecond, 20*time.Millisecond, "a log file is no change")

	require.NoError(t, os.RemoveAll(dir))
	require.NoError(t, os.Mkdir(dir, 0o755))
	writeConfig(t, filepath.Join(dir, "edge.yaml"), 7)
	require.Eventually(t, func() bool { return r.limitOf(t, "bob") == 7 }, 10*time.Second, 20*time.Millisecond, "the directory made again is watched")
}

// Stopping, the server answers health checks NOT_SERVING for a while
// before it stops listening, so that a load balancer polling it sees it
// leave.
func TestServeSaysNotServingBeforeItStopsListening(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, filepath.Join(dir, "edge.yaml"), 3)
	r := start(t, nil, "-config", dir, "-drain", "2s")
	stopped := make(chan error, 1)
	go func() { stopped <- r.stop() }()
	seen := false
	require.Eventually(t, func() bool {
		h, err := r.health.Check(context.Background(), &healthpb.HealthCheckRequest{})
		seen = seen || err == nil && h.Status == healthpb.HealthCheckResponse_NOT_SERVING
		return seen
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, <-stopped)
}

// Two replicas on one Redis share a limit; with Redis killed, each goes on
// deciding alone at its local share.
func TestReplicasShareALimitOnRedisAndOutliveIt(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	writeConfig(t, filepath.Join(dir, "edge.yaml"), 20)
	a := start(t, nil, "-config", dir, "-redis", srv.Addr(), "-local-share", "0.5")
	b := start(t, nil, "-config", dir, "-redis", srv.Addr(), "-local-share", "0.5")
	admitted := 0
	for i := range 30 {
		r := a
		if i%2 == 1 {
			r = b
		}
		if r.ask(t, 0, "user", "shared").OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	assert.LessOrEqual(t, admitted, 20, "the two replicas together admit at most the limit")
	assert.GreaterOrEqual(t, admitted, 10, "and not less than one replica's share")

	srv.Kill()
	// Redis gone: each replica decides alone, at most half the limit for a
	// new caller, and answers every call.
	for _, r := range []*running{a, b} {
		ok := 0
		for range 15 {
			if r.ask(t, 0, "user", "after").OverallCode == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		assert.LessOrEqual(t, ok, 10)
		assert.Positive(t, ok)
	}
}
