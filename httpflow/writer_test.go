package httpflow

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// interfaces says which optional interfaces w has, of those httpsnoop
// knows.
func interfaces(w http.ResponseWriter) map[string]bool {
	has := map[string]bool{}
	_, has["Flusher"] = w.(http.Flusher)
	_, has["FlushError"] = w.(flushError)
	_, has["CloseNotifier"] = w.(http.CloseNotifier) //nolint:staticcheck // checked as the server has it
	_, has["Hijacker"] = w.(http.Hijacker)
	_, has["ReaderFrom"] = w.(io.ReaderFrom)
	_, has["deadliner"] = w.(deadliner)
	_, has["fullDuplex"] = w.(fullDuplexEnabler)
	_, has["StringWriter"] = w.(io.StringWriter)
	_, has["Pusher"] = w.(http.Pusher)
	return has
}

// TestWrapperKeepsEveryInterface: behind the middleware, a handler's
// writer has exactly the optional interfaces of the server's, over
// HTTP/1 (our pooled wrapper) and HTTP/2 (httpsnoop's), and unwraps to it.
func TestWrapperKeepsEveryInterface(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		type seen struct {
			wrapped, server map[string]bool
			fast            bool
		}
		got := make(chan seen, 1)
		eng := engine(t, stattest.NewClock(0))
		srv := httptest.NewUnstartedServer(New(eng).Handler("api", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			under := w.(interface{ Unwrap() http.ResponseWriter }).Unwrap()
			_, fast := w.(*http1Writer)
			got <- seen{interfaces(w), interfaces(under), fast}
			_, _ = io.WriteString(w, "ok")
		})))
		srv.EnableHTTP2 = h2
		srv.StartTLS()
		resp, err := srv.Client().Get(srv.URL)
		require.NoError(t, err)
		_ = resp.Body.Close()
		srv.Close()
		s := <-got
		assert.Equal(t, s.server, s.wrapped, "HTTP/2: %v", h2)
		assert.Equal(t, !h2, s.fast, "HTTP/1 takes the pooled wrapper")
		assert.Equal(t, h2, resp.ProtoMajor == 2)
	}
}

// TestHTTP1WriterCounts: through the pooled HTTP/1 wrapper, the status
// that went out decides the exception whatever way the body was written.
func TestHTTP1WriterCounts(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	mux := http.NewServeMux()
	routes := map[string]http.HandlerFunc{
		"GET /string": func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "x") },
		"GET /from": func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.(io.ReaderFrom).ReadFrom(strings.NewReader("body"))
			w.WriteHeader(http.StatusInternalServerError) // too late: 200 went out
		},
		"GET /fail": func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "down")
		},
		"GET /hint": func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusEarlyHints)
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	for p, h := range routes {
		mux.Handle(p, New(eng).Middleware(h))
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	want := map[string]int{"/string": 200, "/from": 200, "/fail": 503, "/hint": 502}
	for path, code := range want {
		assert.Equal(t, code, get(t, srv.Client(), srv.URL+path).StatusCode, path)
	}
	for path, code := range want {
		snap, _ := eng.Snapshot("GET " + path)
		assert.Equal(t, int64(1), snap.MinutePass, path)
		assert.Equal(t, map[bool]int64{true: 1, false: 0}[code >= 500], snap.MinuteErrors, path)
	}
}
