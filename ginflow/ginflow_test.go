package ginflow

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
	"github.com/leapflow/leapflow/stat/stattest"
)

func init() { gin.SetMode(gin.TestMode) }

func engine(t *testing.T, rules ...flow.Rule) *flow.Engine {
	t.Helper()
	eng, err := flow.New(flow.WithClock(stattest.NewClock(0)))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules(rules))
	return eng
}

// served records, per request path, the method and full path gin itself
// gives the route that served it.
type served struct {
	mu   sync.Mutex
	seen map[string]string
}

func (s *served) handler(status int) gin.HandlerFunc {
	return func(c *gin.Context) {
		s.mu.Lock()
		s.seen[c.Request.URL.Path] = c.Request.Method + " " + c.FullPath()
		s.mu.Unlock()
		c.Status(status) // written by gin after the chain returns
	}
}

func (s *served) route(path string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[path]
}

// Registration says where the middleware goes.
type registration int

const (
	global   registration = iota // Use on the engine
	perRoute                     // first in each route's handlers
	group                        // Use on each top-level group, per route on the engine's own routes
)

func (g registration) String() string { return [...]string{"global", "per-route", "group"}[g] }

// newRouter builds routes in groups two levels deep, with mw where reg
// says; panics counts the panics its recovery caught.
func newRouter(mw gin.HandlerFunc, reg registration, s *served, panics *atomic.Int32) *gin.Engine {
	r := gin.New()
	r.HandleMethodNotAllowed = true
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) {
		panics.Add(1)
		c.AbortWithStatus(http.StatusInternalServerError)
	}))
	if reg == global {
		r.Use(mw)
	}
	// h is handler with mw in front where reg puts it on the route; top
	// says the route is the engine's own.
	h := func(top bool, handler gin.HandlerFunc) []gin.HandlerFunc {
		if reg == perRoute || reg == group && top {
			return []gin.HandlerFunc{mw, handler}
		}
		return []gin.HandlerFunc{handler}
	}
	r.GET("/items/:id", h(true, s.handler(http.StatusOK))...)
	r.POST("/items", h(true, s.handler(http.StatusCreated))...)

	api := r.Group("/api")
	admin := r.Group("/admin")
	if reg == group {
		api.Use(mw)
		admin.Use(mw)
	}
	api.GET("", h(false, s.handler(http.StatusOK))...)
	v1 := api.Group("/v1")
	v1.GET("/users/:uid", h(false, s.handler(http.StatusOK))...)
	v1.GET("/fail", h(false, s.handler(http.StatusBadGateway))...)
	v1.GET("/missing", h(false, s.handler(http.StatusNotFound))...)
	v1.GET("/abort", h(false, func(c *gin.Context) { c.AbortWithStatus(http.StatusServiceUnavailable) })...)
	v1.GET("/panic", h(false, func(*gin.Context) { panic("boom") })...)
	admin.GET("/stats/:day", h(false, s.handler(http.StatusOK))...)
	admin.Group("/deep").GET("/x/*rest", h(false, s.handler(http.StatusOK))...)
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

func server(t *testing.T, mw gin.HandlerFunc, reg registration) (*httptest.Server, *served, *atomic.Int32) {
	t.Helper()
	s := &served{seen: map[string]string{}}
	panics := &atomic.Int32{}
	srv := httptest.NewServer(newRouter(mw, reg, s, panics))
	t.Cleanup(srv.Close)
	return srv, s, panics
}

// TestNamesAreTheServingRoute: wherever the middleware is registered, each
// request enters the resource of the route gin serves it with, named as
// gin spells its full path, however nested; unmatched requests (404 and
// 405) enter httpflow.Unmatched.
func TestNamesAreTheServingRoute(t *testing.T) {
	cases := []struct{ method, path, want string }{
		{"GET", "/items/7", "GET /items/:id"},
		{"POST", "/items", "POST /items"},
		{"GET", "/api", "GET /api"},
		{"GET", "/api/v1/users/42", "GET /api/v1/users/:uid"},
		{"GET", "/admin/stats/monday", "GET /admin/stats/:day"},
		{"GET", "/admin/deep/x/1/2", "GET /admin/deep/x/*rest"},
	}
	for _, reg := range []registration{global, perRoute, group} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t)
			srv, s, _ := server(t, New(eng).Middleware, reg)
			for _, tc := range cases {
				resp := do(t, srv.Client(), tc.method, srv.URL+tc.path)
				require.Less(t, resp.StatusCode, 300, tc.path)
				assert.Equal(t, tc.want, s.route(tc.path), "gin's own name of the route")
				assert.Equal(t, int64(1), passes(eng, tc.want), tc.path)
			}
			if reg == global {
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/nowhere").StatusCode)
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/api/v1/nowhere").StatusCode)
				assert.Equal(t, http.StatusMethodNotAllowed, do(t, srv.Client(), "DELETE", srv.URL+"/items/7").StatusCode)
				assert.Equal(t, int64(3), passes(eng, httpflow.Unmatched))
			}
		})
	}
}

// TestRefusedPastTheRouteRule: a rule on a nested route's name refuses its
// requests past the threshold with httpflow's answer, and the handler does
// not run; other routes are not limited by it.
func TestRefusedPastTheRouteRule(t *testing.T) {
	for _, reg := range []registration{global, perRoute, group} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t, flow.Rule{ID: "users", Resource: "GET /api/v1/users/:uid", Threshold: 2})
			srv, s, _ := server(t, New(eng).Middleware, reg)
			c := srv.Client()
			codes := []int{}
			for _, uid := range []string{"1", "2", "3"} {
				codes = append(codes, do(t, c, "GET", srv.URL+"/api/v1/users/"+uid).StatusCode)
			}
			assert.Equal(t, []int{200, 200, 429}, codes)
			assert.Empty(t, s.route("/api/v1/users/3"), "the chain was aborted")
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
	eng := engine(t, flow.Rule{Resource: "GET /items/:id", Threshold: 1, PerKey: true})
	srv, _, _ := server(t, New(eng, WithKey(FromRequest(httpflow.Header("X-Tenant")))).Middleware, global)
	get := func(tenant string) int {
		return do(t, srv.Client(), "GET", srv.URL+"/items/1", "X-Tenant", tenant).StatusCode
	}
	assert.Equal(t, []int{200, 429, 200, 429}, []int{get("a"), get("a"), get("b"), get("b")})
}

// TestExceptions: a 5xx status, set with Status (sent after the chain) or
// AbortWithStatus, and a panic count as exceptions, a 4xx does not; the
// panic goes on to the recovery.
func TestExceptions(t *testing.T) {
	for _, reg := range []registration{global, perRoute} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t)
			srv, _, panics := server(t, New(eng).Middleware, reg)
			c := srv.Client()
			assert.Equal(t, http.StatusBadGateway, do(t, c, "GET", srv.URL+"/api/v1/fail").StatusCode)
			assert.Equal(t, http.StatusServiceUnavailable, do(t, c, "GET", srv.URL+"/api/v1/abort").StatusCode)
			assert.Equal(t, http.StatusNotFound, do(t, c, "GET", srv.URL+"/api/v1/missing").StatusCode)
			assert.Equal(t, http.StatusInternalServerError, do(t, c, "GET", srv.URL+"/api/v1/panic").StatusCode)
			assert.Equal(t, int32(1), panics.Load())
			want := map[string]int64{"GET /api/v1/fail": 1, "GET /api/v1/abort": 1, "GET /api/v1/panic": 1, "GET /api/v1/missing": 0}
			for res, errs := range want {
				require.Eventually(t, func() bool {
					snap, _ := eng.Snapshot(res)
					return snap.MinutePass == 1 && snap.Inflight == 0 && snap.MinuteErrors == errs
				}, 2*time.Second, 5*time.Millisecond, res)
			}
		})
	}
}

// TestOptions: WithResource, WithBlockHandler, WithExceptions and
// WithConcurrency503 replace their defaults.
func TestOptions(t *testing.T) {
	eng := engine(t,
		flow.Rule{Resource: "all", Threshold: 1},
		flow.Rule{Resource: "conc", Metric: flow.Concurrency, Threshold: 0})
	blocked := New(eng,
		WithResource(func(*gin.Context) string { return "all" }),
		WithBlockHandler(func(c *gin.Context, b httpflow.Blocked) {
			c.String(http.StatusTeapot, "slow down, %s", b.Resource)
		}),
		WithExceptions(func(status int) bool { return status == http.StatusCreated }))
	srv, _, _ := server(t, blocked.Middleware, global)
	assert.Equal(t, http.StatusCreated, do(t, srv.Client(), "POST", srv.URL+"/items").StatusCode)
	assert.Equal(t, http.StatusTeapot, do(t, srv.Client(), "GET", srv.URL+"/items/1").StatusCode)
	require.Eventually(t, func() bool {
		snap, _ := eng.Snapshot("all")
		return snap.MinutePass == 1 && snap.MinuteErrors == 1
	}, 2*time.Second, 5*time.Millisecond)

	conc := New(eng, WithResource(func(*gin.Context) string { return "conc" }), WithConcurrency503())
	srv, _, _ = server(t, conc.Middleware, global)
	resp := do(t, srv.Client(), "GET", srv.URL+"/items/1")
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Empty(t, resp.Header.Get("Retry-After"), "a Concurrency rule cannot say when")
}

// TestFailOpenAndClosed: a request whose resource cannot be made goes
// through, counted, unless WithFailClosed.
func TestFailOpenAndClosed(t *testing.T) {
	eng, err := flow.New(flow.WithMaxResources(1))
	require.NoError(t, err)
	_, err = eng.Entry("filler")
	require.NoError(t, err)
	open := New(eng)
	srv, _, _ := server(t, open.Middleware, global)
	assert.Equal(t, http.StatusOK, do(t, srv.Client(), "GET", srv.URL+"/items/1").StatusCode)
	assert.Equal(t, httpflow.Stats{FailedOpen: 1}, open.Stats())

	closed := New(eng, WithFailClosed())
	srv, _, _ = server(t, closed.Middleware, global)
	assert.Equal(t, http.StatusServiceUnavailable, do(t, srv.Client(), "GET", srv.URL+"/items/1").StatusCode)
	assert.Equal(t, httpflow.Stats{FailedClosed: 1}, closed.Stats())
}

// TestUnreachedRuleIsLogged: while requests go unmatched, a rule whose
// resource sees none is logged once.
func TestUnreachedRuleIsLogged(t *testing.T) {
	clock := stattest.NewClock(0)
	eng, err := flow.New(flow.WithClock(clock))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "typo", Resource: "GET /itemz/:id", Threshold: 5}}))
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	r := gin.New()
	r.Use(New(eng, WithLogger(logger)).Middleware)
	r.GET("/items/:id", func(c *gin.Context) { c.Status(http.StatusOK) })
	srv := httptest.NewServer(r)
	defer srv.Close()
	clock.Set(11 * time.Second)
	for range 2 {
		do(t, srv.Client(), http.MethodGet, srv.URL+"/nowhere")
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	assert.Equal(t, 1, strings.Count(out, "cannot take effect"), out)
	assert.Contains(t, out, "rule=typo")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
