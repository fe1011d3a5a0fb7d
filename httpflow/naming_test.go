package httpflow

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// TestNestedMuxesNameTheServingRoute: the resource is the pattern of the
// route that serves the request however the muxes nest: a middleware
// around a mux mounted under an outer one beside /metrics (with WithMux
// and without: Middleware(mux) knows its mux), a mux whose pattern leads
// to another mux, and a middleware on the inner route itself; never the
// outer mux's "/".
func TestNestedMuxesNameTheServingRoute(t *testing.T) {
	for _, tc := range []struct {
		name  string
		build func(eng *flow.Engine) http.Handler
	}{
		{"middleware around the inner mux", func(eng *flow.Engine) http.Handler {
			top, mux := http.NewServeMux(), http.NewServeMux()
			mux.Handle("GET /items/{id}", ok)
			top.Handle("/metrics", ok)
			top.Handle("/", New(eng).Middleware(mux))
			return top
		}},
		{"WithMux, behind another middleware", func(eng *flow.Engine) http.Handler {
			top, mux := http.NewServeMux(), http.NewServeMux()
			mux.Handle("GET /items/{id}", ok)
			top.Handle("/metrics", ok)
			top.Handle("/", New(eng, WithMux(mux)).Middleware(http.HandlerFunc(mux.ServeHTTP)))
			return top
		}},
		{"middleware around the outer mux, routes two muxes deep", func(eng *flow.Engine) http.Handler {
			top, api, items := http.NewServeMux(), http.NewServeMux(), http.NewServeMux()
			items.Handle("GET /api/v1/items/{id}", ok)
			api.Handle("/api/v1/", items)
			top.Handle("/api/", api)
			top.Handle("/metrics", ok)
			return New(eng).Middleware(top)
		}},
		{"middleware on the inner route", func(eng *flow.Engine) http.Handler {
			top, mux := http.NewServeMux(), http.NewServeMux()
			mux.Handle("GET /items/{id}", New(eng).Middleware(ok))
			mux.Handle("GET /api/v1/items/{id}", New(eng).Middleware(ok))
			top.Handle("/", mux)
			return top
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng := engine(t, stattest.NewClock(0),
				flow.Rule{Resource: "GET /items/{id}", Threshold: 1},
				flow.Rule{Resource: "GET /api/v1/items/{id}", Threshold: 1})
			srv := httptest.NewServer(tc.build(eng))
			defer srv.Close()
			c := srv.Client()
			path := "/items/"
			if strings.Contains(tc.name, "deep") {
				path = "/api/v1/items/"
			}
			assert.Equal(t, http.StatusOK, get(t, c, srv.URL+path+"1").StatusCode)
			assert.Equal(t, http.StatusTooManyRequests, get(t, c, srv.URL+path+"2").StatusCode, "the inner route's rule applies")
			_, outer := eng.Snapshot("/")
			assert.False(t, outer, "the outer pattern names nothing")
			if strings.Contains(tc.name, "deep") {
				assert.Equal(t, http.StatusNotFound, get(t, c, srv.URL+"/api/v1/nothing").StatusCode)
				_, found := eng.Snapshot(Unmatched)
				assert.True(t, found, "a path no inner route matches is unmatched")
			}
		})
	}
}

// TestUnreachedRuleIsLoggedOnce: while requests go unmatched, a rule whose
// resource sees none is logged once, with its name and resource; a rule
// whose resource has traffic is not.
func TestUnreachedRuleIsLoggedOnce(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock,
		flow.Rule{ID: "typo", Resource: "GET /itemz/{id}", Threshold: 5},
		flow.Rule{ID: "used", Resource: "GET /b", Threshold: 5})
	var buf syncBuffer
	mux := http.NewServeMux()
	mux.Handle("GET /b", ok)
	lim := New(eng, WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	srv := httptest.NewServer(lim.Middleware(mux))
	defer srv.Close()
	c := srv.Client()
	get(t, c, srv.URL+"/b")
	get(t, c, srv.URL+"/items/1")
	assert.Empty(t, buf.String(), "the rules are new: too soon to say")
	clock.Set(11 * time.Second)
	lim.unreached.Recheck() // as if 10 s had passed on the wall clock too
	get(t, c, srv.URL+"/items/1")
	lim.unreached.Recheck()
	get(t, c, srv.URL+"/items/1")
	out := buf.String()
	require.Equal(t, 1, strings.Count(out, "cannot take effect"), out)
	assert.Contains(t, out, "rule=typo")
	assert.Contains(t, out, "resource=\"GET /itemz/{id}\"")
	assert.NotContains(t, out, "rule=used")
}

// syncBuffer is a bytes.Buffer safe for the server's goroutines.
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

// TestConnectRequestsShareTheUnmatchedResource: CONNECT requests that no
// CONNECT pattern matches (ServeMux would name one it redirects by its
// own path) are all unmatched: a flood of them makes no resources.
func TestConnectRequestsShareTheUnmatchedResource(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	mux := http.NewServeMux()
	mux.Handle("/{tenant}/", ok)
	h := New(eng).Middleware(mux)
	for i := range 20 {
		r := httptest.NewRequest(http.MethodConnect, "/", nil)
		r.URL.Path = "/t" + strings.Repeat("x", i)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	_, found := eng.Snapshot(Unmatched)
	assert.True(t, found)
	_, found = eng.Snapshot("/{tenant}/")
	assert.False(t, found, "a pattern without a method names no CONNECT")
	for i := range 20 {
		_, found := eng.Snapshot("/t" + strings.Repeat("x", i) + "/")
		assert.False(t, found, "no resource per path")
	}
}
