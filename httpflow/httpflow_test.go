package httpflow

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func engine(t *testing.T, clock *stattest.Clock, rules ...flow.Rule) *flow.Engine {
	t.Helper()
	opts := []flow.Option{flow.WithMaxResources(8)}
	if clock != nil {
		opts = append(opts, flow.WithClock(clock))
	}
	e, err := flow.New(opts...)
	require.NoError(t, err)
	require.NoError(t, e.LoadRules(rules))
	return e
}

func get(t *testing.T, c *http.Client, url string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })

// TestBlockedGets429WithHeaders: a route wrapped on its own is named by its
// pattern; past its rule it answers 429 with Retry-After and the RateLimit
// fields, exact on a fake clock.
func TestBlockedGets429WithHeaders(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{ID: "items", Resource: "GET /items/{id}", Threshold: 2})
	mux := http.NewServeMux()
	mux.Handle("GET /items/{id}", New(eng).Middleware(ok))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := srv.Client()
	for i := range 2 {
		resp := get(t, c, srv.URL+fmt.Sprint("/items/", i))
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	clock.Set(300 * time.Millisecond)
	resp := get(t, c, srv.URL+"/items/9")
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("Retry-After"), "700 ms until the first bucket leaves, rounded up")
	assert.Equal(t, `"items";q=2;w=1`, resp.Header.Get("RateLimit-Policy"))
	assert.Equal(t, `"items";r=0;t=1`, resp.Header.Get("RateLimit"))
	snap, _ := eng.Snapshot("GET /items/{id}")
	assert.Equal(t, 2.0, snap.PassQPS)
	assert.Equal(t, 1.0, snap.BlockQPS)
}

// TestMuxLevelNaming: a middleware around the whole mux, given the mux,
// names requests by the pattern they will be routed to; unmatched ones
// share one resource.
func TestMuxLevelNaming(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: "GET /a/{x}", Threshold: 1})
	mux := http.NewServeMux()
	mux.Handle("GET /a/{x}", ok)
	mux.Handle("GET /b", ok)
	srv := httptest.NewServer(New(eng, WithMux(mux)).Middleware(mux))
	defer srv.Close()
	c := srv.Client()
	assert.Equal(t, http.StatusOK, get(t, c, srv.URL+"/a/1").StatusCode)
	assert.Equal(t, http.StatusTooManyRequests, get(t, c, srv.URL+"/a/2").StatusCode, "one rule for every /a/{x}")
	assert.Equal(t, http.StatusOK, get(t, c, srv.URL+"/b").StatusCode)
	assert.Equal(t, http.StatusNotFound, get(t, c, srv.URL+"/nowhere").StatusCode)
	for _, res := range []string{"GET /a/{x}", "GET /b", Unmatched} {
		_, found := eng.Snapshot(res)
		assert.True(t, found, res)
	}
}

// TestPerClientKeys: per-key rules through ClientIP; a spoofed
// X-Forwarded-For from an untrusted peer does not change the key.
func TestPerClientKeys(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: "api", Threshold: 2, PerKey: true})
	srv := httptest.NewServer(New(eng, WithKey(ClientIP())).Handler("api", ok))
	defer srv.Close()
	c := srv.Client()
	codes := []int{}
	for i := range 4 {
		codes = append(codes, get(t, c, srv.URL, "X-Forwarded-For", fmt.Sprint("203.0.113.", i)).StatusCode)
	}
	assert.Equal(t, []int{200, 200, 429, 429}, codes, "the loopback peer is untrusted: its header is not read")
}

func TestClientIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("fe80::/10")}
	xff, fwd := ClientIP(proxies...), ClientIPForwarded(proxies...)
	for _, tc := range []struct {
		peer, xff, fwd, want string
		forwarded            bool
	}{
		{"198.51.100.7:4000", "203.0.113.1", "", "198.51.100.7", false},               // untrusted peer: header ignored
		{"10.0.0.2:4000", "203.0.113.1", "", "203.0.113.1", false},                    // through our proxy
		{"10.0.0.2:4000", "6.6.6.6, 203.0.113.1, 10.0.0.9", "", "203.0.113.1", false}, // nearest untrusted, not the spoofed first
		{"10.0.0.2:4000", "10.0.0.7, 10.0.0.9", "", "10.0.0.7", false},                // all ours: the farthest
		{"10.0.0.2:4000", "203.0.113.7", "for=198.51.100.99", "203.0.113.7", false},   // a forged Forwarded is not read
		{"10.0.0.2:4000", "", `for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711"`, "2001:db8:cafe::/64", true},
		{"10.0.0.2:4000", "6.6.6.6", `for=192.0.2.60`, "192.0.2.60", true}, // and the other way round
		{"[2001:db8:1:2::9]:80", "", "", "2001:db8:1:2::/64", false},       // IPv6 by /64
		{"[fd00::1]:80", "2001:db8:aa:bb::1", "", "2001:db8:aa:bb::/64", false},
		{"[fe80::1%eth0]:80", "203.0.113.5", "", "203.0.113.5", false}, // a zoned proxy is trusted
		// IPv4-mapped addresses are the IPv4 address they map: a mapped
		// trusted peer is trusted, a mapped untrusted one is not, and
		// mapped hops are trusted or named as IPv4.
		{"[::ffff:10.0.0.2]:4000", "203.0.113.1", "", "203.0.113.1", false},
		{"[::ffff:198.51.100.7]:4000", "203.0.113.1", "", "198.51.100.7", false},
		{"10.0.0.2:4000", "::ffff:203.0.113.9, ::ffff:10.0.0.9", "", "203.0.113.9", false},
		{"[::ffff:10.0.0.2]:4000", "", `for="[::ffff:192.0.2.61]:80", for=10.0.0.3`, "192.0.2.61", true},
		{"[::ffff:10.0.0.2]:4000", "", "", "10.0.0.2", false}, // no header: the peer, as IPv4
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = tc.peer
		if tc.xff != "" {
			r.Header.Set("X-Forwarded-For", tc.xff)
		}
		if tc.fwd != "" {
			r.Header.Set("Forwarded", tc.fwd)
		}
		key := xff
		if tc.forwarded {
			key = fwd
		}
		assert.Equal(t, tc.want, key(r), "%+v", tc)
	}
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.Header.Set("X-API-Key", "k1")
	assert.Equal(t, "k1", Header("x-api-key")(r))
}

// TestKeysFromTheRequestAreBounded: a key read from the request longer
// than 256 bytes (up to the server's header limit) becomes a bounded key of
// its own (its start and a hash): never around the rules, never the shared
// no-key entry, and a longer key sharing its start is another key. Of a
// header sent twice, the first value names the caller.
func TestKeysFromTheRequestAreBounded(t *testing.T) {
	eng := engine(t, stattest.NewClock(0), flow.Rule{Resource: "api", Threshold: 2, PerKey: true})
	srv := httptest.NewServer(New(eng, WithKey(Header("X-Api-Key"))).Handler("api", ok))
	defer srv.Close()
	long := strings.Repeat("k", 100<<10)
	codes := func(key string) []int {
		var out []int
		for range 3 {
			out = append(out, get(t, srv.Client(), srv.URL, "X-Api-Key", key).StatusCode)
		}
		return out
	}
	assert.Equal(t, []int{200, 200, 429}, codes(long), "100 KiB: a key of its own at the threshold")
	assert.Equal(t, []int{200, 200, 429}, codes(long+"x"), "sharing the start is not sharing the key")

	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	require.NoError(t, err)
	req.Header.Add("X-Api-Key", "first")
	req.Header.Add("X-Api-Key", long+"y")
	for range 2 {
		res, err := srv.Client().Do(req)
		require.NoError(t, err)
		res.Body.Close()
		assert.Equal(t, 200, res.StatusCode)
	}
	res, err := srv.Client().Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, 429, res.StatusCode, "a repeated header: the first value is the key")
	assert.Equal(t, []int{200, 200, 429}, codes(long+"y"), "the value after it was not counted")
	snap, _ := eng.Snapshot("api")
	assert.Zero(t, snap.Keyless, "no request fell to the shared no-key entry")
}

// TestDeadlineWhileQueuedIs503: a server deadline that ends a throttling
// wait answers 503, never an empty 200.
func TestDeadlineWhileQueuedIs503(t *testing.T) {
	eng := engine(t, nil, flow.Rule{Resource: "slow", Threshold: 0.1, Behavior: flow.Throttle, MaxQueueing: time.Minute})
	h := New(eng).Handler("slow", ok)
	deadline := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 50*time.Millisecond)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
	srv := httptest.NewServer(deadline)
	defer srv.Close()
	assert.Equal(t, http.StatusOK, get(t, srv.Client(), srv.URL).StatusCode)
	assert.Equal(t, http.StatusServiceUnavailable, get(t, srv.Client(), srv.URL).StatusCode)
}

// TestOnlyTheSentStatusCounts: the status that went out decides the
// exception, not later WriteHeader calls.
func TestOnlyTheSentStatusCounts(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	mux := http.NewServeMux()
	mux.Handle("GET /late500", New(eng).Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
		w.WriteHeader(http.StatusInternalServerError) // superfluous: 200 went out
	})))
	mux.Handle("GET /500then200", New(eng).Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		w.WriteHeader(http.StatusOK)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	assert.Equal(t, http.StatusOK, get(t, srv.Client(), srv.URL+"/late500").StatusCode)
	assert.Equal(t, http.StatusInternalServerError, get(t, srv.Client(), srv.URL+"/500then200").StatusCode)
	for res, want := range map[string]int64{"GET /late500": 0, "GET /500then200": 1} {
		require.Eventually(t, func() bool {
			snap, _ := eng.Snapshot(res)
			return snap.MinutePass == 1 && snap.MinuteErrors == want
		}, 2*time.Second, 5*time.Millisecond, res)
	}
}

// TestExceptions: 5xx responses and panics count as exceptions; a panic
// goes on to the server.
func TestExceptions(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	mux := http.NewServeMux()
	mux.Handle("GET /fail", New(eng).Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	})))
	mux.Handle("GET /panic", New(eng).Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(http.ErrAbortHandler) // the server closes the connection quietly
	})))
	mux.Handle("GET /fine", New(eng).Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNotFound)
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c := srv.Client()
	assert.Equal(t, http.StatusBadGateway, get(t, c, srv.URL+"/fail").StatusCode)
	assert.Equal(t, http.StatusNotFound, get(t, c, srv.URL+"/fine").StatusCode)
	_, err := c.Get(srv.URL + "/panic")
	assert.Error(t, err, "the panic reached the server")
	// The client may send the request that panicked again on a new
	// connection (it is idempotent): every run counts.
	for res, failing := range map[string]bool{"GET /fail": true, "GET /panic": true, "GET /fine": false} {
		require.Eventually(t, func() bool {
			snap, _ := eng.Snapshot(res)
			if !failing {
				return snap.MinutePass == 1 && snap.MinuteErrors == 0 && snap.Inflight == 0
			}
			return snap.MinutePass >= 1 && snap.MinuteErrors == snap.MinutePass && snap.Inflight == 0
		}, 2*time.Second, 5*time.Millisecond, res)
	}
}

// TestHijackAndFlushThroughTheWrapper: the wrapped ResponseWriter hijacks
// and flushes as the server's does (a real server: httptest's recorder is
// no Hijacker).
func TestHijackAndFlushThroughTheWrapper(t *testing.T) {
	eng := engine(t, nil)
	mux := http.NewServeMux()
	mux.Handle("GET /raw", New(eng).Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer conn.Close()
		_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nraw ok")
		_ = buf.Flush()
	})))
	mux.Handle("GET /events", New(eng).Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		for i := range 3 {
			_, _ = fmt.Fprintf(w, "data: %d\n\n", i)
			if err := rc.Flush(); err != nil {
				return
			}
		}
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/raw")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, "raw ok", string(body))

	resp, err = srv.Client().Get(srv.URL + "/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var events []string
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data: ") {
			events = append(events, strings.TrimPrefix(line, "data: "))
		}
	}
	assert.Equal(t, []string{"0", "1", "2"}, events)
}

// TestCancelEndsTheWait: a client that gives up ends its request's
// throttling wait; the handler never runs for it.
func TestCancelEndsTheWait(t *testing.T) {
	eng := engine(t, nil, flow.Rule{Resource: "slow", Threshold: 0.1, Behavior: flow.Throttle, MaxQueueing: time.Minute})
	var ran atomic.Int64
	srv := httptest.NewServer(New(eng).Handler("slow", http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran.Add(1) })))
	defer srv.Close()
	get(t, srv.Client(), srv.URL) // takes the slot now; the next waits 10 s
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	_, err := srv.Client().Do(req)
	require.Error(t, err)
	require.Eventually(t, func() bool {
		snap, _ := eng.Snapshot("slow")
		return snap.Inflight == 0
	}, 2*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(1), ran.Load(), "only the first request ran")
}

// TestFailOpenWhenTheRegistryIsFull: a request whose resource cannot be
// made goes through, counted; WithFailClosed answers 503.
func TestFailOpenWhenTheRegistryIsFull(t *testing.T) {
	e, err := flow.New(flow.WithMaxResources(1))
	require.NoError(t, err)
	l := New(e, WithResource(MethodPath))
	srv := httptest.NewServer(l.Middleware(ok))
	defer srv.Close()
	c := srv.Client()
	assert.Equal(t, http.StatusOK, get(t, c, srv.URL+"/one").StatusCode)
	assert.Equal(t, http.StatusOK, get(t, c, srv.URL+"/two").StatusCode, "no room: let through")
	assert.Equal(t, int64(1), l.Stats().FailedOpen)

	closed := httptest.NewServer(New(e, WithResource(MethodPath), WithFailClosed()).Middleware(ok))
	defer closed.Close()
	assert.Equal(t, http.StatusServiceUnavailable, get(t, closed.Client(), closed.URL+"/three").StatusCode)
}

// TestConcurrency503: a Concurrency block may answer 503, with no
// Retry-After (the rule cannot say when).
func TestConcurrency503(t *testing.T) {
	eng := engine(t, nil, flow.Rule{Resource: "one", Metric: flow.Concurrency, Threshold: 1})
	release := make(chan struct{})
	started := make(chan struct{})
	srv := httptest.NewServer(New(eng, WithConcurrency503()).Handler("one", http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		close(started)
		<-release
	})))
	defer srv.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		resp, err := srv.Client().Get(srv.URL)
		if err == nil {
			_ = resp.Body.Close()
		}
	}()
	<-started
	resp := get(t, srv.Client(), srv.URL)
	close(release)
	<-done
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Retry-After"))
}

// TestPolicyNamesAreStructuredStrings: a rule ID with quotes, backslashes
// and bytes outside printable ASCII still gives a well-formed String.
func TestPolicyNamesAreStructuredStrings(t *testing.T) {
	assert.Equal(t, `"a\"b\\c"`, sfString("a\"b\\c"))
	assert.Equal(t, `"ab"`, sfString("a\x00\nb\xff"))
	q, w := policyQuota(5, 500*time.Millisecond)
	assert.Equal(t, []int64{10, 1}, []int64{q, w}, "a half-second window as its quota per second")
	q, w = policyQuota(7, 1500*time.Millisecond)
	assert.Equal(t, []int64{7, 2}, []int64{q, w}, "whole seconds, rounded up")
}

// TestStatusPerRequest: pooled status trackers never mix up requests:
// concurrent requests answering 200 and 500 count exceptions exactly.
func TestStatusPerRequest(t *testing.T) {
	eng := engine(t, nil)
	mux := http.NewServeMux()
	mux.Handle("GET /s/{code}", New(eng).Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("code") == "500" {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "fine")
	})))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var fails atomic.Int64
	done := make(chan struct{})
	for g := range 8 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 25 {
				code := "200"
				if (g+i)%3 == 0 {
					code = "500"
					fails.Add(1)
				}
				resp, err := srv.Client().Get(srv.URL + "/s/" + code)
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
			}
		}()
	}
	for range 8 {
		<-done
	}
	snap, _ := eng.Snapshot("GET /s/{code}")
	assert.Equal(t, int64(200), snap.MinutePass)
	assert.Equal(t, fails.Load(), snap.MinuteErrors)
}

// TestHeadersOnAdmit: with WithHeadersOnAdmit an admitted response names
// the resource's strictest QPS rule in RateLimit-Policy (a window under a
// second as its quota per second); a resource with no QPS rule gets none.
func TestHeadersOnAdmit(t *testing.T) {
	eng := engine(t, stattest.NewClock(0),
		flow.Rule{ID: "loose", Resource: "GET /a", Threshold: 100},
		flow.Rule{ID: "strict", Resource: "GET /a", Threshold: 3},
		flow.Rule{Resource: "GET /b", Threshold: 20, StatInterval: 500 * time.Millisecond},
		flow.Rule{Resource: "GET /c", Metric: flow.Concurrency, Threshold: 5},
	)
	mux := http.NewServeMux()
	for _, p := range []string{"GET /a", "GET /b", "GET /c"} {
		mux.Handle(p, New(eng, WithHeadersOnAdmit()).Middleware(ok))
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for path, want := range map[string][2]string{
		"/a": {`"strict";q=3;w=1`, `"strict";r=2;t=1`},
		"/b": {`"GET /b";q=20;w=1`, `"GET /b";r=9;t=1`},
		"/c": {"", ""},
	} {
		resp := get(t, srv.Client(), srv.URL+path)
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Equal(t, want[0], resp.Header.Get("RateLimit-Policy"), path)
		assert.Equal(t, want[1], resp.Header.Get("RateLimit"), path+": what is left after it")
	}
	resp := get(t, srv.Client(), srv.URL+"/a")
	assert.Equal(t, `"strict";r=1;t=1`, resp.Header.Get("RateLimit"))
}

// TestFlushSendsTheStatus: a Flush before any WriteHeader sends 200;
// a later WriteHeader(500) is superfluous, so the request must not count
// as an exception (HTTP/1 pooled wrapper, ResponseController, HTTP/2).
func TestFlushSendsTheStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		h2   bool
		rc   bool
	}{{"h1-Flush", false, false}, {"h1-ResponseController", false, true}, {"h2-Flush", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			eng := engine(t, stattest.NewClock(0))
			srv := httptest.NewUnstartedServer(New(eng).Handler("api", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tc.rc {
					_ = http.NewResponseController(w).Flush()
				} else {
					w.(http.Flusher).Flush()
				}
				w.WriteHeader(http.StatusInternalServerError) // superfluous: 200 went out
			})))
			srv.EnableHTTP2 = tc.h2
			srv.StartTLS()
			defer srv.Close()
			resp := get(t, srv.Client(), srv.URL)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "the client got 200")
			snap, _ := eng.Snapshot("api")
			assert.Equal(t, int64(1), snap.MinutePass)
			assert.Equal(t, int64(0), snap.MinuteErrors, "a 200 response counted as an exception")
		})
	}
}

// fancyWriter is what many logging middlewares (chi's WrapResponseWriter,
// gorilla's handlers) hand on: Flusher, Hijacker and io.ReaderFrom only,
// so httpflow takes the httpsnoop path.
type fancyWriter struct{ http.ResponseWriter }

func (f fancyWriter) Flush() { f.ResponseWriter.(http.Flusher).Flush() }
func (f fancyWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return f.ResponseWriter.(http.Hijacker).Hijack()
}
func (f fancyWriter) ReadFrom(r io.Reader) (int64, error) {
	return f.ResponseWriter.(io.ReaderFrom).ReadFrom(r)
}

// TestReadFromOnTheHttpsnoopPath: ReadFrom sends 200 on every path; the
// pooled wrapper knows it (TestHTTP1WriterCounts "/from"), the httpsnoop
// path does not hook ReadFrom.
func TestReadFromOnTheHttpsnoopPath(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	h := New(eng).Handler("api", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.(io.ReaderFrom).ReadFrom(strings.NewReader("body"))
		w.WriteHeader(http.StatusInternalServerError) // too late: 200 went out
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(fancyWriter{w}, r)
	}))
	defer srv.Close()
	resp := get(t, srv.Client(), srv.URL)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	snap, _ := eng.Snapshot("api")
	assert.Equal(t, int64(0), snap.MinuteErrors, "a 200 response counted as an exception")
}

// TestPolicyLeavesOutRelatedRules: a related-resource rule limits this
// resource by another's rate; it is no quota of this resource's, yet
// WithHeadersOnAdmit advertises it as one.
func TestPolicyLeavesOutRelatedRules(t *testing.T) {
	eng := engine(t, stattest.NewClock(0),
		flow.Rule{ID: "own", Resource: "GET /a", Threshold: 100},
		flow.Rule{ID: "rel", Resource: "GET /a", RelatedResource: "GET /b", Threshold: 1},
	)
	srv := httptest.NewServer(New(eng, WithHeadersOnAdmit()).Handler("GET /a", ok))
	defer srv.Close()
	codes := 0
	for range 5 {
		if get(t, srv.Client(), srv.URL).StatusCode == http.StatusOK {
			codes++
		}
	}
	require.Equal(t, 5, codes, "GET /a admits 5 in a second: q=1 is not its quota")
	assert.Equal(t, `"own";q=100;w=1`, get(t, srv.Client(), srv.URL).Header.Get("RateLimit-Policy"))
}

// TestColdWarmUpLeavesNothingRemaining: a cold WarmUp rule blocks below its Threshold,
// and the 429 then says r>0 (quota left) in its RateLimit field.
func TestColdWarmUpLeavesNothingRemaining(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{ID: "w", Resource: "api", Threshold: 30, Behavior: flow.WarmUp, WarmUpPeriod: 10 * time.Second})
	srv := httptest.NewServer(New(eng).Handler("api", ok))
	defer srv.Close()
	clock.Set(time.Second)
	var resp *http.Response
	for i := 0; i < 40; i++ {
		resp = get(t, srv.Client(), srv.URL)
		if resp.StatusCode == http.StatusTooManyRequests {
			t.Logf("blocked after %d admitted", i)
			break
		}
	}
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	t.Log(resp.Header.Get("RateLimit-Policy"), " / ", resp.Header.Get("RateLimit"))
	assert.True(t, strings.Contains(resp.Header.Get("RateLimit"), ";r=0"), "a 429 says quota remains: %q", resp.Header.Get("RateLimit"))
}

// TestPaddedForwardedForCostsNothing: behind a trusted proxy, the key of a
// request whose nearest hop is untrusted needs one hop parsed, but every
// hop of X-Forwarded-For is parsed (two error allocations each) before
// the limiter even runs, blocked requests included.
func TestPaddedForwardedForCostsNothing(t *testing.T) {
	key := ClientIP(netip.MustParsePrefix("10.0.0.0/8"))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", strings.Repeat("198.51.100.1, ", 1000)+"203.0.113.9")
	require.Equal(t, "203.0.113.9", key(r))
	allocs := testing.AllocsPerRun(10, func() { key(r) })
	assert.Less(t, allocs, 10.0, "allocations grow with the hops a client sent")
}

// TestEveryRefusalSaysWhenToRetry: on a route with a rule for all callers
// and one per caller, a 429 from either carries Retry-After and the
// RateLimit fields of the rule that refused.
func TestEveryRefusalSaysWhenToRetry(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock,
		flow.Rule{ID: "all", Resource: "GET /x", Threshold: 3},
		flow.Rule{ID: "each", Resource: "GET /x", Threshold: 0.5, StatInterval: 2 * time.Second, PerKey: true})
	mux := http.NewServeMux()
	mux.Handle("GET /x", ok)
	srv := httptest.NewServer(New(eng, WithKey(Header("X-User"))).Middleware(mux))
	defer srv.Close()
	c := srv.Client()
	assert.Equal(t, http.StatusOK, get(t, c, srv.URL+"/x", "X-User", "a").StatusCode)
	resp := get(t, c, srv.URL+"/x", "X-User", "a")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "2", resp.Header.Get("Retry-After"), "the key's 2 s window")
	assert.Equal(t, `"each";q=1;w=2`, resp.Header.Get("RateLimit-Policy"))
	assert.Equal(t, `"each";r=0;t=2`, resp.Header.Get("RateLimit"))
	get(t, c, srv.URL+"/x", "X-User", "b")
	get(t, c, srv.URL+"/x", "X-User", "c")
	clock.Set(300 * time.Millisecond)
	resp = get(t, c, srv.URL+"/x", "X-User", "a")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, `"all";q=3;w=1`, resp.Header.Get("RateLimit-Policy"), "the route's rule refused first")
	assert.Equal(t, "2", resp.Header.Get("Retry-After"), "and a's key waits longer: 1.7 s")
}

// A circuit breaker counts the responses that are exceptions (5xx, or
// WithExceptions's statuses) and, open, answers 503 with Retry-After until
// its next probe, and no RateLimit fields (a breaker has no quota); its
// probe's success closes it.
func TestBreakerCountsFailedResponsesAndAnswers503(t *testing.T) {
	breaker := flow.Rule{ID: "dep", Resource: "GET /x", Breaker: flow.ErrorCount, Threshold: 2, RetryTimeout: 10 * time.Second}
	for _, tc := range []struct {
		name       string
		opts       []Option
		bad, clean int
	}{
		{"default statuses", nil, http.StatusBadGateway, http.StatusNotFound},
		{"WithExceptions", []Option{WithExceptions(func(status int) bool { return status == http.StatusConflict })}, http.StatusConflict, http.StatusInternalServerError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := stattest.NewClock(time.Second)
			eng := engine(t, clock, breaker)
			var answer atomic.Int64
			mux := http.NewServeMux()
			mux.Handle("GET /x", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(int(answer.Load())) }))
			srv := httptest.NewServer(New(eng, tc.opts...).Middleware(mux))
			defer srv.Close()
			c := srv.Client()
			answer.Store(int64(tc.clean))
			for range 3 {
				require.Equal(t, tc.clean, get(t, c, srv.URL+"/x").StatusCode, "not failures")
			}
			answer.Store(int64(tc.bad))
			require.Equal(t, tc.bad, get(t, c, srv.URL+"/x").StatusCode)
			require.Equal(t, tc.bad, get(t, c, srv.URL+"/x").StatusCode)
			clock.Advance(4 * time.Second)
			resp := get(t, c, srv.URL+"/x")
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
			assert.Equal(t, "6", resp.Header.Get("Retry-After"), "until the next probe")
			assert.Empty(t, resp.Header.Get("RateLimit-Policy"))
			clock.Advance(6 * time.Second)
			answer.Store(http.StatusOK)
			require.Equal(t, http.StatusOK, get(t, c, srv.URL+"/x").StatusCode, "the probe")
			require.Equal(t, http.StatusOK, get(t, c, srv.URL+"/x").StatusCode, "closed")
		})
	}
}
