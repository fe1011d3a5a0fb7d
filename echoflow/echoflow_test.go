package echoflow

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
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

// served records, per request path, the method and path echo itself gives
// the route that served it.
type served struct {
	mu   sync.Mutex
	seen map[string]string
}

func (s *served) handler(status int) echo.HandlerFunc {
	return func(c echo.Context) error {
		s.mu.Lock()
		s.seen[c.Request().URL.Path] = c.Request().Method + " " + c.Path()
		s.mu.Unlock()
		return c.NoContent(status)
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
	global   registration = iota // Use on the Echo
	perRoute                     // on each route
	group                        // on each top-level group, per route on the Echo's own routes
)

func (g registration) String() string { return [...]string{"global", "per-route", "group"}[g] }

// newEcho builds routes in groups two levels deep, with mw where reg says;
// panics counts the panics its recovery caught.
func newEcho(mw echo.MiddlewareFunc, reg registration, s *served, panics *atomic.Int32) *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			defer func() {
				if v := recover(); v != nil {
					panics.Add(1)
					err = echo.NewHTTPError(http.StatusInternalServerError)
				}
			}()
			return next(c)
		}
	})
	if reg == global {
		e.Use(mw)
	}
	// m is mw where reg puts it on a route; top says the route is the
	// Echo's own.
	m := func(top bool) []echo.MiddlewareFunc {
		if reg == perRoute || reg == group && top {
			return []echo.MiddlewareFunc{mw}
		}
		return nil
	}
	var gm []echo.MiddlewareFunc
	if reg == group {
		gm = []echo.MiddlewareFunc{mw}
	}
	e.GET("/items/:id", s.handler(http.StatusOK), m(true)...)
	e.POST("/items", s.handler(http.StatusCreated), m(true)...)

	api := e.Group("/api", gm...)
	api.GET("", s.handler(http.StatusOK), m(false)...)
	v1 := api.Group("/v1")
	v1.GET("/users/:uid", s.handler(http.StatusOK), m(false)...)
	v1.GET("/fail", s.handler(http.StatusBadGateway), m(false)...)
	v1.GET("/missing", s.handler(http.StatusNotFound), m(false)...)
	v1.GET("/error", func(echo.Context) error { return echo.NewHTTPError(http.StatusServiceUnavailable) }, m(false)...)
	v1.GET("/plain-error", func(echo.Context) error { return errors.New("boom") }, m(false)...)
	v1.GET("/denied", func(echo.Context) error { return echo.ErrForbidden }, m(false)...)
	v1.GET("/panic", func(echo.Context) error { panic("boom") }, m(false)...)
	admin := e.Group("/admin", gm...)
	admin.GET("/stats/:day", s.handler(http.StatusOK), m(false)...)
	admin.Group("/deep").GET("/x/*", s.handler(http.StatusOK), m(false)...)
	return e
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

func server(t *testing.T, mw echo.MiddlewareFunc, reg registration) (*httptest.Server, *served, *atomic.Int32) {
	t.Helper()
	s := &served{seen: map[string]string{}}
	panics := &atomic.Int32{}
	srv := httptest.NewServer(newEcho(mw, reg, s, panics))
	t.Cleanup(srv.Close)
	return srv, s, panics
}

// TestNamesAreTheServingRoute: wherever the middleware is registered, each
// request enters the resource of the route echo serves it with, named as
// echo spells its path, however nested; unmatched requests (404, a
// group's not-found route, 405) enter httpflow.Unmatched.
func TestNamesAreTheServingRoute(t *testing.T) {
	cases := []struct{ method, path, want string }{
		{"GET", "/items/7", "GET /items/:id"},
		{"POST", "/items", "POST /items"},
		{"GET", "/api", "GET /api"},
		{"GET", "/api/v1/users/42", "GET /api/v1/users/:uid"},
		{"GET", "/admin/stats/monday", "GET /admin/stats/:day"},
		{"GET", "/admin/deep/x/1/2", "GET /admin/deep/x/*"},
	}
	for _, reg := range []registration{global, perRoute, group} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t)
			srv, s, _ := server(t, New(eng).Middleware, reg)
			for _, tc := range cases {
				resp := do(t, srv.Client(), tc.method, srv.URL+tc.path)
				require.Less(t, resp.StatusCode, 300, tc.path)
				assert.Equal(t, tc.want, s.route(tc.path), "echo's own name of the route")
				assert.Equal(t, int64(1), passes(eng, tc.want), tc.path)
			}
			switch reg {
			case global:
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/nowhere").StatusCode)
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/api/v1/nowhere").StatusCode)
				assert.Equal(t, http.StatusMethodNotAllowed, do(t, srv.Client(), "DELETE", srv.URL+"/items/7").StatusCode)
				assert.Equal(t, int64(3), passes(eng, httpflow.Unmatched))
			case group:
				// A group with middlewares routes what it does not match
				// to a RouteNotFound route ("/api/*"): unmatched too.
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/api/v1/nowhere").StatusCode)
				assert.Equal(t, http.StatusNotFound, do(t, srv.Client(), "GET", srv.URL+"/admin").StatusCode)
				assert.Equal(t, int64(2), passes(eng, httpflow.Unmatched))
			}
		})
	}
}

// TestRoutesAddedLater: a route added after requests were named is named
// too.
func TestRoutesAddedLater(t *testing.T) {
	eng := engine(t)
	e := echo.New()
	e.Use(New(eng).Middleware)
	e.GET("/a", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	srv := httptest.NewServer(e)
	defer srv.Close()
	assert.Equal(t, http.StatusOK, do(t, srv.Client(), "GET", srv.URL+"/a").StatusCode)
	e.GET("/b/:x", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	assert.Equal(t, http.StatusOK, do(t, srv.Client(), "GET", srv.URL+"/b/1").StatusCode)
	assert.Equal(t, int64(1), passes(eng, "GET /a"))
	assert.Equal(t, int64(1), passes(eng, "GET /b/:x"))
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
			assert.Empty(t, s.route("/api/v1/users/3"), "the handler did not run")
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

// TestExceptions: a 5xx status, written or from a returned error (an
// HTTPError's code, 500 for any other error), and a panic count as
// exceptions, a 4xx does not; the panic goes on to the recovery.
func TestExceptions(t *testing.T) {
	for _, reg := range []registration{global, perRoute} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t)
			srv, _, panics := server(t, New(eng).Middleware, reg)
			c := srv.Client()
			for path, code := range map[string]int{
				"/fail": http.StatusBadGateway, "/error": http.StatusServiceUnavailable,
				"/plain-error": http.StatusInternalServerError, "/panic": http.StatusInternalServerError,
				"/missing": http.StatusNotFound, "/denied": http.StatusForbidden,
			} {
				assert.Equal(t, code, do(t, c, "GET", srv.URL+"/api/v1"+path).StatusCode, path)
			}
			assert.Equal(t, int32(1), panics.Load())
			for path, errs := range map[string]int64{
				"/fail": 1, "/error": 1, "/plain-error": 1, "/panic": 1, "/missing": 0, "/denied": 0,
			} {
				res := "GET /api/v1" + path
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
		WithResource(func(echo.Context) string { return "all" }),
		WithBlockHandler(func(c echo.Context, b httpflow.Blocked) error {
			return c.String(http.StatusTeapot, "slow down, "+b.Resource)
		}),
		WithExceptions(func(status int) bool { return status == http.StatusCreated }))
	srv, _, _ := server(t, blocked.Middleware, global)
	assert.Equal(t, http.StatusCreated, do(t, srv.Client(), "POST", srv.URL+"/items").StatusCode)
	assert.Equal(t, http.StatusTeapot, do(t, srv.Client(), "GET", srv.URL+"/items/1").StatusCode)
	require.Eventually(t, func() bool {
		snap, _ := eng.Snapshot("all")
		return snap.MinutePass == 1 && snap.MinuteErrors == 1
	}, 2*time.Second, 5*time.Millisecond)

	conc := New(eng, WithResource(func(echo.Context) string { return "conc" }), WithConcurrency503())
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
	var buf bytes.Buffer
	e := echo.New()
	e.Use(New(eng, WithLogger(slog.New(slog.NewTextHandler(&buf, nil)))).Middleware)
	e.GET("/items/:id", func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	clock.Set(11 * time.Second)
	for range 2 {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/nowhere", nil))
		assert.Equal(t, http.StatusNotFound, rec.Code)
	}
	assert.Equal(t, 1, strings.Count(buf.String(), "cannot take effect"), buf.String())
	assert.Contains(t, buf.String(), "rule=typo")
}

// TestNotFoundCostsNoRouteReading: a 404 that echo routes to a
// RouteNotFound route (a group's) is named unmatched without reading the
// router's routes again: no allocation, however many come.
func TestNotFoundCostsNoRouteReading(t *testing.T) {
	e := echo.New()
	lim := New(engine(t))
	g := e.Group("/api")
	for i := range 50 {
		g.GET(fmt.Sprintf("/r%d/:id", i), func(c echo.Context) error { return c.NoContent(http.StatusOK) })
	}
	g.RouteNotFound("/*", func(c echo.Context) error { return c.NoContent(http.StatusNotFound) })
	c := e.NewContext(httptest.NewRequest(http.MethodGet, "/api/nowhere", nil), httptest.NewRecorder())
	e.Router().Find(http.MethodGet, "/api/nowhere", c)
	require.Equal(t, httpflow.Unmatched, lim.route(c))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _ = lim.route(c) }))
}
