package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/leapflow/leapflow/cmd/leapflow/rls"
	"github.com/leapflow/leapflow/dashboard"
	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global"
	"github.com/leapflow/leapflow/promflow"
	"github.com/leapflow/leapflow/rulefile"
)

const serveUsage = `usage: leapflow serve [flags]

A rate limit service speaking Envoy's RLS v3 (ShouldRateLimit) on -addr,
with the gRPC health service; /metrics, /dashboard/ and /healthz on -admin.
Limits come from -config (envoyproxy/ratelimit's configuration: a file or a
directory of them, one domain each) and -rules (leapflow rule files: a
descriptor of domain d and entries k1=v1,k2=v2 is resource d/k1/k2, key
v1/v2). Both are read again when they change or on SIGHUP; a bad change is
logged and the last good configuration stays. SIGTERM or SIGINT drains the
calls in flight (up to -drain), then exits.

`

// serveConfig is leapflow serve's flags.
type serveConfig struct {
	addr, admin         string
	config, rules       string
	redisAddr, prefix   string
	localShare          float64
	spanExact, headers  bool
	maxKeys             int
	drain, redisTimeout time.Duration
	maxRecvBytes        int
	dashboard           bool
	debounce            time.Duration
	ready               func(grpcAddr, adminAddr string) // tests: the bound addresses
	logger              *slog.Logger
}

func serveFlags(args []string, stderr io.Writer) (*serveConfig, int) {
	c := &serveConfig{}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, serveUsage); fs.PrintDefaults() }
	fs.StringVar(&c.addr, "addr", ":8081", "the gRPC address (RateLimitService and health)")
	fs.StringVar(&c.admin, "admin", ":6070", "the admin HTTP address: /metrics, /dashboard/, /healthz (empty: none)")
	fs.StringVar(&c.config, "config", "", "envoyproxy/ratelimit configuration: a YAML file or a directory of them")
	fs.StringVar(&c.rules, "rules", "", "leapflow rule files: a file or a directory")
	fs.StringVar(&c.redisAddr, "redis", "", "a Redis address: replicas pointing at it share every limit")
	fs.StringVar(&c.prefix, "redis-prefix", "leapflow-rls", "the prefix of the Redis keys")
	fs.DurationVar(&c.redisTimeout, "redis-timeout", 100*time.Millisecond, "the longest a decision waits for Redis: one it has not answered by then is over the limit (a late answer is no sign Redis is down; see global.WithTimeout)")
	fs.Float64Var(&c.localShare, "local-share", 1, "the part of each limit a replica enforces alone while Redis fails (in (0, 1])")
	fs.BoolVar(&c.spanExact, "span-exact", false, "hold second, minute and hour limits (not per value) in every continuous span")
	fs.BoolVar(&c.headers, "headers", false, "add RateLimit-Policy, RateLimit and Retry-After to the response headers")
	fs.IntVar(&c.maxKeys, "max-keys", 0, "the most distinct values a per-value limit tracks (0: flow's default, 100000)")
	fs.DurationVar(&c.drain, "drain", 10*time.Second, "the longest shutdown waits for calls in flight")
	fs.IntVar(&c.maxRecvBytes, "max-request-bytes", 64<<10, "the largest request accepted")
	fs.BoolVar(&c.dashboard, "dashboard", true, "serve the dashboard on the admin address")
	fs.DurationVar(&c.debounce, "debounce", 200*time.Millisecond, "how long after a file change the configuration is read again")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, 0
		}
		return nil, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "leapflow serve: unexpected argument %q\n", fs.Arg(0))
		return nil, 2
	}
	if c.config == "" && c.rules == "" {
		fmt.Fprintln(stderr, "leapflow serve: -config or -rules is required")
		return nil, 2
	}
	for _, bad := range []struct {
		flag string
		ok   bool
		want string
		v    any
	}{
		{"local-share", c.localShare > 0 && c.localShare <= 1, "in (0, 1]", c.localShare},
		{"max-request-bytes", c.maxRecvBytes >= 1024, "at least 1024", c.maxRecvBytes},
		{"max-keys", c.maxKeys >= 0, "0 (the default) or more", c.maxKeys},
		{"drain", c.drain >= 0, "0 or more", c.drain},
		{"redis-timeout", c.redisTimeout > 0, "more than 0", c.redisTimeout},
		{"debounce", c.debounce > 0, "more than 0", c.debounce},
	} {
		if !bad.ok {
			fmt.Fprintf(stderr, "leapflow serve: -%s %v: must be %s\n", bad.flag, bad.v, bad.want)
			return nil, 2
		}
	}
	return c, -1
}

func serveCmd(args []string, stderr io.Writer) int {
	c, code := serveFlags(args, stderr)
	if c == nil {
		return code
	}
	c.logger = slog.New(slog.NewTextHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := serve(ctx, c, hup); err != nil {
		fmt.Fprintln(stderr, "leapflow serve:", err)
		return 1
	}
	return 0
}

// The server's bounds (see serve).
const (
	maxStreams = 256  // calls at once on one connection
	maxConns   = 1024 // connections at once
)

// serve runs the service until ctx ends, then drains it. A signal on
// reload reads the configuration again.
func serve(ctx context.Context, c *serveConfig, reload <-chan os.Signal) error {
	var opts []flow.Option
	if c.redisAddr != "" {
		src, err := global.Dial(&redis.UniversalOptions{Addrs: []string{c.redisAddr}}, global.WithTimeout(c.redisTimeout), global.WithPrefix(c.prefix))
		if err != nil {
			return err
		}
		defer func() {
			// Leaving Redis may wait on it: not past a second more.
			closed := make(chan struct{})
			go func() { src.Close(); close(closed) }()
			select {
			case <-closed:
			case <-time.After(time.Second):
				c.logger.Warn("leaving Redis timed out")
			}
		}()
		opts = append(opts, flow.WithTokenSource(src))
	}
	eng, err := flow.New(opts...)
	if err != nil {
		return err
	}
	srv := rls.New(eng, rls.Options{Global: c.redisAddr != "", LocalShare: c.localShare, SpanExact: c.spanExact, MaxKeys: c.maxKeys, Headers: c.headers})
	load := func() error {
		var cfg *rls.Config
		var own []flow.Rule
		var err error
		if c.config != "" {
			if cfg, err = rls.LoadConfig(c.config); err != nil {
				return err
			}
		}
		if c.rules != "" {
			if own, err = readRules(c.rules); err != nil {
				return err
			}
		}
		return srv.Load(cfg, own)
	}
	if err := load(); err != nil {
		return err
	}

	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	// Bounded: calls at once on a connection, and connections (beyond,
	// new ones wait to be accepted), so that neither a client's streams
	// nor many clients hold unbounded memory; pings no oftener than 10 s.
	ln = netutil.LimitListener(ln, maxConns)
	gs := grpc.NewServer(grpc.MaxRecvMsgSize(c.maxRecvBytes), grpc.MaxConcurrentStreams(maxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := gs.Serve(ln); err != nil {
			c.logger.Error("grpc server", "err", err)
		}
	}()

	var admin *http.Server
	adminAddr := ""
	if c.admin != "" {
		reg := prometheus.NewRegistry()
		col := promflow.New(eng)
		defer col.Close()
		if err := reg.Register(col); err != nil {
			gs.Stop()
			return err
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			st := srv.Stats()
			fmt.Fprintf(w, "ok decisions=%d over_limit=%d\n", st.Decisions, st.OverLimit)
		})
		if c.dashboard {
			dh, err := dashboard.New(eng)
			if err != nil {
				gs.Stop()
				return err
			}
			mux.Handle("/dashboard/", http.StripPrefix("/dashboard", dh))
		}
		aln, err := net.Listen("tcp", c.admin)
		if err != nil {
			gs.Stop()
			return err
		}
		adminAddr = aln.Addr().String()
		admin = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := admin.Serve(aln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				c.logger.Error("admin server", "err", err)
			}
		}()
	}

	changes := watch(ctx, c, c.logger)
	c.logger.Info("serving", "addr", ln.Addr().String(), "admin", adminAddr)
	if c.ready != nil {
		c.ready(ln.Addr().String(), adminAddr)
	}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-reload:
			reloadNow(load, c.logger, "signal")
		case <-changes:
			reloadNow(load, c.logger, "file change")
		}
	}

	// Drain: health says NOT_SERVING (load balancers stop sending) for a
	// while before the listener closes (up to a second, half of -drain),
	// the calls in flight finish up to -drain, then the rest are cut.
	hs.Shutdown()
	grace := min(c.drain/2, time.Second)
	time.Sleep(grace)
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	timer := time.NewTimer(c.drain - grace)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		c.logger.Warn("drain timed out; cutting the calls still in flight", "drain", c.drain)
		gs.Stop()
	}
	if admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		admin.Shutdown(sctx) //nolint:errcheck // best effort at exit
	}
	wg.Wait()
	return nil
}

func reloadNow(load func() error, log *slog.Logger, why string) {
	if err := load(); err != nil {
		log.Error("reload refused; the last good configuration stays", "why", why, "err", err)
		return
	}
	log.Info("reloaded", "why", why)
}

// readRules reads a leapflow rule file or a directory of them.
func readRules(path string) ([]flow.Rule, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return rulefile.ReadDir(path)
	}
	return rulefile.ReadFile(path)
}

// watch reports, debounced, changes to the configuration's files (their
// directories are watched: editors and config maps replace files by
// rename). Only configuration files count (.yaml, .yml, .json, and a
// config map's ..data swap): a log written beside them is no change. A
// watched directory removed and made again is watched again (tried every
// second), and that counts as a change. The channel is nil when nothing
// can be watched.
func watch(ctx context.Context, c *serveConfig, log *slog.Logger) <-chan struct{} {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		log.Warn("not watching the configuration; reload with SIGHUP", "err", err)
		return nil
	}
	dirs := map[string]bool{} // watched directories: watching now?
	for _, p := range []string{c.config, c.rules} {
		if p == "" {
			continue
		}
		dir := p
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			dir = filepath.Dir(p)
		}
		dir = filepath.Clean(dir)
		dirs[dir] = w.Add(dir) == nil
		if !dirs[dir] {
			log.Warn("not watching yet; trying every second", "path", dir)
		}
	}
	out := make(chan struct{}, 1)
	go func() {
		defer w.Close()
		var fire <-chan time.Time
		retry := time.NewTicker(time.Second)
		defer retry.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if name := filepath.Clean(ev.Name); dirs[name] && ev.Has(fsnotify.Remove|fsnotify.Rename) {
					dirs[name] = false // the watch went with the directory
					continue
				}
				if configFile(ev.Name) {
					fire = time.After(c.debounce)
				}
			case <-retry.C:
				for dir, watching := range dirs {
					if !watching && w.Add(dir) == nil {
						dirs[dir] = true
						log.Info("watching again", "path", dir)
						fire = time.After(c.debounce)
					}
				}
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Warn("watching the configuration", "err", err)
			case <-fire:
				fire = nil
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// configFile reports whether a change to path may change the
// configuration: a YAML or JSON file, or a config map's ..data swap.
func configFile(path string) bool {
	base := filepath.Base(path)
	if strings.HasPrefix(base, "..") {
		return true
	}
	switch filepath.Ext(base) {
	case ".yaml", ".yml", ".json":
		return !strings.HasPrefix(base, ".")
	}
	return false
}
