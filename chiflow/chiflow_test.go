package chiflow

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
	"github.com/leapflow/leapflow/stat/stattest"
)

func engine(t *testing.T, rules ...flow.Rule) *flow.Engine {
	t.Helper()
	eng, err := flow.New(flow.WithClock(stattest.NewClock(0)))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules(rules))
	return eng
}

// served records, per request path, the method and pattern chi itself
// gives the route that served it.
type served struct {
	mu   sync.Mutex
	seen map[string]string
}

func (s *served) handler(status int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.seen[r.URL.Path] = r.Method + " " + chi.RouteContext(r.Context()).RoutePattern()
		s.mu.Unlock()
		w.WriteHeader(status)
	}
}

func (s *served) pattern(path string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[path]
}

// Registration says where the middleware goes.
type registration int

const (
	global   registration = iota // r.Use on the outermost router
	perRoute                     // With on each route
	inner                        // Use on each subrouter, With on the outermost router's own routes
)

func (g registration) String() string { return [...]string{"global", "per-route", "inner"}[g] }

// recoverer answers 500 to a panic, counting it.
func recoverer(panics *atomic.Int32) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer func() {
				if v := recover(); v != nil {
					panics.Add(1)
					w.WriteHeader(http.StatusInternalServerError)
				}
			}()
			next.ServeHTTP(w, r)
		})
	}
}

// newRouter builds routes two levels deep through Route, Group and Mount,
// with mw where reg says. panics counts the panics its recoverer caught.
func newRouter(mw func(http.Handler) http.Handler, reg registration, s *served, panics *atomic.Int32) http.Handler {
	// use registers mw on a router at depth (0: the outermost), with on
	// one route of it: each request meets mw once.
	use := func(r chi.Router, depth int) {
		if reg == global && depth == 0 || reg == inner && depth == 1 {
			r.Use(mw)
		}
	}
	with := func(r chi.Router, depth int) chi.Router {
		if reg == perRoute || reg == inner && depth == 0 {
			return r.With(mw)
		}
		return r
	}
	r := chi.NewRouter()
	r.Use(recoverer(panics))
	use(r, 0)
	with(r, 0).Get("/items/{id}", s.handler(http.StatusOK))
	with(r, 0).Post("/items", s.handler(http.StatusCreated))
	r.Route("/api", func(r chi.Router) {
		use(r, 1)
		with(r, 1).Get("/", s.handler(http.StatusOK))
		r.Route("/v1", func(r chi.Router) {
			use(r, 2)
			with(r, 2).Get("/users/{uid}", s.handler(http.StatusOK))
			with(r, 2).Get("/fail", s.handler(http.StatusBadGateway))
			with(r, 2).Get("/missing", s.handler(http.StatusNotFound))
			with(r, 2).Get("/panic", func(http.ResponseWriter, *http.Request) { panic("boom") })
		})
	})
	deep := chi.NewRouter()
	use(deep, 2)
	with(deep, 2).Get("/x/{y}", s.handler(http.StatusOK))
	admin := chi.NewRouter()
	use(admin, 1)
	admin.Group(func(g chi.Router) {
		with(g, 1).Get("/stats/{day}", s.handler(http.StatusOK))
	})
	admin.Mount("/deep", deep)
	r.Mount("/admin", admin)
	return r
}

func do(t *testing.T, c *http.Client, method, url string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
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

// passes returns how many requests resource admitted.
func passes(eng *flow.Engine, resource string) int64 {
	snap, _ := eng.Snapshot(resource)
	return snap.MinutePass
}

// TestNamesAreTheServingRoute: wherever the middleware is registered, each
// request enters the resource of the route chi serves it with, named as
// chi spells that route's full pattern, however nested; unmatched
// requests (404 and 405) enter httpflow.Unmatched.
func TestNamesAreTheServingRoute(t *testing.T) {
	cases := []struct{ method, path, want string }{
		{"GET", "/items/7", "GET /items/{id}"},
		{"POST", "/items", "POST /items"},
		{"GET", "/api", "GET /api"},
		{"GET", "/api/v1/users/42", "GET /api/v1/users/{uid}"},
		{"GET", "/admin/stats/monday", "GET /admin/stats/{day}"},
		{"GET", "/admin/deep/x/1", "GET /admin/deep/x/{y}"},
	}
	for _, reg := range []registration{global, perRoute, inner} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t)
			s := &served{seen: map[string]string{}}
			var panics atomic.Int32
			srv := httptest.NewServer(newRouter(New(eng).Middleware, reg, s, &panics))
			defer srv.Close()
			for _, tc := range cases {
				resp := do(t, srv.Client(), tc.method, srv.URL+tc.path)
				require.Less(t, resp.StatusCode, 300, tc.path)
				assert.Equal(t, tc.want, s.pattern(tc.path), "chi's own name of the route")
				assert.Equal(t, int64(1), passes(eng, tc.want), tc.path)
			}
			if reg == global {
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/nowhere").StatusCode)
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/api/v1/nowhere").StatusCode)
				assert.Equal(t, http.StatusMethodNotAllowed, do(t, srv.Client(), "DELETE", srv.URL+"/items/7").StatusCode)
				assert.Equal(t, int64(3), passes(eng, httpflow.Unmatched))
			}
			if reg == inner {
				// A subrouter's Use runs for the requests it does not
				// route too.
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/admin/nowhere").StatusCode)
				assert.Equal(t, int64(1), passes(eng, httpflow.Unmatched))
			}
		})
	}
}

// TestRefusedPastTheRouteRule: a rule on a nested route's name refuses its
// requests past the threshold with httpflow's answer; other routes, and
// the same route under another path value, share nothing else.
func TestRefusedPastTheRouteRule(t *testing.T) {
	for _, reg := range []registration{global, perRoute} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t, flow.Rule{ID: "users", Resource: "GET /api/v1/users/{uid}", Threshold: 2})
			var panics atomic.Int32
			srv := httptest.NewServer(newRouter(New(eng).Middleware, reg, &served{seen: map[string]string{}}, &panics))
			defer srv.Close()
			c := srv.Client()
			codes := []int{}
			for _, uid := range []string{"1", "2", "3"} {
				codes = append(codes, do(t, c, "GET", srv.URL+"/api/v1/users/"+uid).StatusCode)
			}
			assert.Equal(t, []int{200, 200, 429}, codes)
			resp := do(t, c, "GET", srv.URL+"/api/v1/users/4")
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "1", resp.Header.Get("Retry-After"))
			assert.Equal(t, `"users";q=2;w=1`, resp.Header.Get("RateLimit-Policy"))
			assert.Equal(t, `"users";r=0;t=1`, resp.Header.Get("RateLimit"))
			assert.Equal(t, http.StatusOK, do(t, c, "GET", srv.URL+"/items/1").StatusCode, "another route")
		})
	}
}

// TestPerKey: a PerKey rule keyed by a header admits each key on its own.
func TestPerKey(t *testing.T) {
	eng := engine(t, flow.Rule{Resource: "GET /items/{id}", Threshold: 1, PerKey: true})
	var panics atomic.Int32
	lim := New(eng, httpflow.WithKey(httpflow.Header("X-Tenant")))
	srv := httptest.NewServer(newRouter(lim.Middleware, global, &served{seen: map[string]string{}}, &panics))
	defer srv.Close()
	c := srv.Client()
	get := func(tenant string) int { return do(t, c, "GET", srv.URL+"/items/1", "X-Tenant", tenant).StatusCode }
	assert.Equal(t, []int{200, 429, 200, 429}, []int{get("a"), get("a"), get("b"), get("b")})
}

// TestExceptions: a 5xx response and a panic count as exceptions, a 4xx
// does not; the panic goes on to the recoverer.
func TestExceptions(t *testing.T) {
	for _, reg := range []registration{global, perRoute} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t)
			var panics atomic.Int32
			srv := httptest.NewServer(newRouter(New(eng).Middleware, reg, &served{seen: map[string]string{}}, &panics))
			defer srv.Close()
			c := srv.Client()
			assert.Equal(t, http.StatusBadGateway, do(t, c, "GET", srv.URL+"/api/v1/fail").StatusCode)
			assert.Equal(t, http.StatusNotFound, do(t, c, "GET", srv.URL+"/api/v1/missing").StatusCode)
			assert.Equal(t, http.StatusInternalServerError, do(t, c, "GET", srv.URL+"/api/v1/panic").StatusCode)
			assert.Equal(t, int32(1), panics.Load())
			for res, want := range map[string]int64{"GET /api/v1/fail": 1, "GET /api/v1/panic": 1, "GET /api/v1/missing": 0} {
				require.Eventually(t, func() bool {
					snap, _ := eng.Snapshot(res)
					return snap.MinutePass == 1 && snap.Inflight == 0 && snap.MinuteErrors == want
				}, 2*time.Second, 5*time.Millisecond, res)
			}
		})
	}
}

// TestRoutePathRewrite: a middleware that rewrites the routing path on the
// outermost router before the limiter is seen by it.
func TestRoutePathRewrite(t *testing.T) {
	eng := engine(t)
	r := chi.NewRouter()
	r.Use(func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			chi.RouteContext(r.Context()).RoutePath = strings.TrimPrefix(r.URL.Path, "/v2")
			next.ServeHTTP(w, r)
		})
	})
	r.Use(New(eng).Middleware)
	r.Get("/items/{id}", func(http.ResponseWriter, *http.Request) {})
	srv := httptest.NewServer(r)
	defer srv.Close()
	assert.Equal(t, http.StatusOK, do(t, srv.Client(), "GET", srv.URL+"/v2/items/1").StatusCode)
	assert.Equal(t, int64(1), passes(eng, "GET /items/{id}"))
}

// TestOutsideChi: without a chi router every request is unmatched.
func TestOutsideChi(t *testing.T) {
	eng := engine(t)
	srv := httptest.NewServer(New(eng).Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
	defer srv.Close()
	assert.Equal(t, http.StatusOK, do(t, srv.Client(), "GET", srv.URL+"/x").StatusCode)
	assert.Equal(t, int64(1), passes(eng, httpflow.Unmatched))
}

// TestWithResourceReplacesTheNaming: httpflow's WithResource after New's
// own naming wins.
func TestWithResourceReplacesTheNaming(t *testing.T) {
	eng := engine(t)
	lim := New(eng, httpflow.WithResource(func(r *http.Request) string { return "all" }))
	var panics atomic.Int32
	srv := httptest.NewServer(newRouter(lim.Middleware, global, &served{seen: map[string]string{}}, &panics))
	defer srv.Close()
	assert.Equal(t, http.StatusOK, do(t, srv.Client(), "GET", srv.URL+"/items/1").StatusCode)
	assert.Equal(t, int64(1), passes(eng, "all"))
}
