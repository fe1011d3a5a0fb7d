// Command httpservice is an HTTP service behind leapflow: each client IP
// may read items twice a second, the report runs one at a time, and the
// whole service takes 100 requests a second. It prints where it listens,
// shows a few requests of its own being limited, and serves until
// interrupted.
//
//	go run ./examples/httpservice [-addr 127.0.0.1:8080]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, os.Stdout); err != nil {
		log.Print(err)
		stop()
		os.Exit(1)
	}
}

// rules are the service's limits.
var rules = []flow.Rule{
	{ID: "items-per-client", Resource: "GET /items/{id}", Threshold: 2, PerKey: true},
	{ID: "report", Resource: "GET /report", Metric: flow.Concurrency, Threshold: 1},
	{ID: "home", Resource: "GET /{$}", Threshold: 100},
}

// run serves until ctx ends, after showing a few requests on out.
func run(ctx context.Context, addr string, out io.Writer) error {
	eng, err := flow.New()
	if err != nil {
		return err
	}
	if err := eng.LoadRules(rules); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /items/{id}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "item %s\n", r.PathValue("id"))
	})
	mux.HandleFunc("GET /report", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(300 * time.Millisecond): // a slow report
			fmt.Fprintln(w, "report")
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "home") })

	// One middleware around the mux: it names each request by the route
	// pattern the mux will match, and each caller by its IP address (no
	// proxy in front here, so no forwarded header is trusted).
	handler := httpflow.New(eng,
		httpflow.WithMux(mux),
		httpflow.WithKey(httpflow.ClientIP()),
		httpflow.WithHeadersOnAdmit(),
	).Middleware(mux)

	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	base := "http://" + lis.Addr().String()
	fmt.Fprintf(out, "listening on %s\n", base)

	demo(ctx, base, out)
	fmt.Fprintf(out, "serving until interrupted; try: curl -i %s/items/1\n", base)

	select {
	case <-ctx.Done():
	case err := <-done:
		return err
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shut); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// demo sends three reads of an item in a row (the third is over this
// client's 2 a second) and two reports at once (one runs at a time).
func demo(ctx context.Context, base string, out io.Writer) {
	c := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) string {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return err.Error()
		}
		resp, err := c.Do(req)
		if err != nil {
			return err.Error()
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		s := resp.Status
		for _, h := range []string{"Retry-After", "RateLimit-Policy", "RateLimit"} {
			if v := resp.Header.Get(h); v != "" {
				s += fmt.Sprintf("  %s: %s", h, v)
			}
		}
		return s
	}
	for i := 1; i <= 3; i++ {
		fmt.Fprintf(out, "GET /items/%d -> %s\n", i, get(fmt.Sprintf("/items/%d", i)))
	}
	results := make(chan string, 2)
	for range 2 {
		go func() { results <- get("/report") }()
	}
	for range 2 {
		fmt.Fprintf(out, "GET /report -> %s\n", <-results)
	}
}
