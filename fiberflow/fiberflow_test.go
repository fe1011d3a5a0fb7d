package fiberflow

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
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

// served records, per request path, the method and path fiber itself gives
// the route that served it.
type served struct {
	mu   sync.Mutex
	seen map[string]string
}

func (s *served) handler(status int) fiber.Handler {
	return func(c *fiber.Ctx) error {
		s.mu.Lock()
		// fiber's strings point into its buffers: copied.
		s.seen[strings.Clone(c.Path())] = strings.Clone(c.Method() + " " + c.Route().Path)
		s.mu.Unlock()
		return c.SendStatus(status)
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
	global   registration = iota // Use on the app
	perRoute                     // first in each route's handlers
	group                        // on each top-level group, per route on the app's own routes
)

func (g registration) String() string { return [...]string{"global", "per-route", "group"}[g] }

// newApp builds routes in groups and a mounted app two levels deep, with
// mw where reg says; panics counts the panics its recovery caught.
func newApp(mw fiber.Handler, reg registration, s *served, panics *atomic.Int32) *fiber.App {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(func(c *fiber.Ctx) (err error) {
		defer func() {
			if v := recover(); v != nil {
				panics.Add(1)
				err = fiber.ErrInternalServerError
			}
		}()
		return c.Next()
	})
	if reg == global {
		app.Use(mw)
	}
	// h is handler with mw in front where reg puts it on the route; top
	// says the route is the app's own.
	h := func(top bool, handler fiber.Handler) []fiber.Handler {
		if reg == perRoute || reg == group && top {
			return []fiber.Handler{mw, handler}
		}
		return []fiber.Handler{handler}
	}
	var gm []fiber.Handler
	if reg == group {
		gm = []fiber.Handler{mw}
	}
	app.Get("/items/:id", h(true, s.handler(http.StatusOK))...)
	app.Post("/items", h(true, s.handler(http.StatusCreated))...)

	api := app.Group("/api", gm...)
	api.Get("", h(false, s.handler(http.StatusOK))...)
	v1 := api.Group("/v1")
	v1.Get("/users/:uid", h(false, s.handler(http.StatusOK))...)
	v1.Get("/fail", h(false, s.handler(http.StatusBadGateway))...)
	v1.Get("/missing", h(false, s.handler(http.StatusNotFound))...)
	v1.Get("/error", h(false, func(*fiber.Ctx) error { return fiber.NewError(http.StatusServiceUnavailable) })...)
	v1.Get("/plain-error", h(false, func(*fiber.Ctx) error { return errors.New("boom") })...)
	v1.Get("/denied", h(false, func(*fiber.Ctx) error { return fiber.ErrForbidden })...)
	v1.Get("/panic", h(false, func(*fiber.Ctx) error { panic("boom") })...)

	admin := app.Group("/admin", gm...)
	admin.Get("/stats/:day", h(false, s.handler(http.StatusOK))...)
	deep := fiber.New()
	deep.Get("/x/*", h(false, s.handler(http.StatusOK))...)
	admin.Mount("/deep", deep)
	return app
}

// do sends a request through app.Test, which returns once the app has
// served it.
func do(t *testing.T, app *fiber.App, method, path string, header ...string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := app.Test(req, -1)
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

func newServed() *served { return &served{seen: map[string]string{}} }

// TestNamesAreTheServingRoute: wherever the middleware is registered (with
// Use on the app above all, where Ctx.Route is the Use route's), each
// request enters the resource of the route fiber serves it with, named as
// fiber spells its full path, through groups and a mounted app; unmatched
// requests (404 and 405) enter httpflow.Unmatched.
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
			s := newServed()
			var panics atomic.Int32
			app := newApp(New(eng).Middleware, reg, s, &panics)
			for _, tc := range cases {
				resp := do(t, app, tc.method, tc.path)
				require.Less(t, resp.StatusCode, 300, tc.path)
				assert.Equal(t, tc.want, s.route(tc.path), "fiber's own name of the route")
				assert.Equal(t, int64(1), passes(eng, tc.want), tc.path)
			}
			switch reg {
			case global:
				assert.Equal(t, http.StatusNotFound, do(t, app, "GET", "/nowhere").StatusCode)
				assert.Equal(t, http.StatusNotFound, do(t, app, "GET", "/api/v1/nowhere").StatusCode)
				assert.Equal(t, http.StatusMethodNotAllowed, do(t, app, "DELETE", "/items/7").StatusCode)
				assert.Equal(t, int64(3), passes(eng, httpflow.Unmatched))
			case group:
				assert.Equal(t, http.StatusNotFound, do(t, app, "GET", "/api/v1/nowhere").StatusCode)
				assert.Equal(t, int64(1), passes(eng, httpflow.Unmatched))
			}
		})
	}
}

// TestRoutingSettings: the copy routes as the app does: case-insensitive
// and with trailing slashes by default, case-sensitive and strict when
// the app is.
func TestRoutingSettings(t *testing.T) {
	for _, strict := range []bool{false, true} {
		eng := engine(t)
		app := fiber.New(fiber.Config{CaseSensitive: strict, StrictRouting: strict})
		app.Use(New(eng).Middleware)
		app.Get("/Items/:id", func(c *fiber.Ctx) error { return c.SendStatus(http.StatusOK) })
		want := http.StatusOK
		if strict {
			want = http.StatusNotFound
		}
		assert.Equal(t, want, do(t, app, "GET", "/items/1/").StatusCode)
		assert.Equal(t, http.StatusOK, do(t, app, "GET", "/Items/1").StatusCode)
		if strict {
			assert.Equal(t, int64(1), passes(eng, "GET /Items/:id"))
			assert.Equal(t, int64(1), passes(eng, httpflow.Unmatched))
		} else {
			assert.Equal(t, int64(2), passes(eng, "GET /Items/:id"))
		}
	}
}

// TestRoutesAddedLater: a route added after requests were named is named
// too.
func TestRoutesAddedLater(t *testing.T) {
	eng := engine(t)
	app := fiber.New()
	app.Use(New(eng).Middleware)
	app.Get("/a", func(c *fiber.Ctx) error { return c.SendStatus(http.StatusOK) })
	assert.Equal(t, http.StatusOK, do(t, app, "GET", "/a").StatusCode)
	app.Get("/b/:x", func(c *fiber.Ctx) error { return c.SendStatus(http.StatusOK) })
	assert.Equal(t, http.StatusOK, do(t, app, "GET", "/b/1").StatusCode)
	assert.Equal(t, int64(1), passes(eng, "GET /a"))
	assert.Equal(t, int64(1), passes(eng, "GET /b/:x"))
}

// TestRefusedPastTheRouteRule: a rule on a nested route's name refuses its
// requests past the threshold with httpflow's status and fields, and the
// handler does not run; other routes are not limited by it.
func TestRefusedPastTheRouteRule(t *testing.T) {
	for _, reg := range []registration{global, perRoute, group} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t, flow.Rule{ID: "users", Resource: "GET /api/v1/users/:uid", Threshold: 2})
			s := newServed()
			var panics atomic.Int32
			app := newApp(New(eng).Middleware, reg, s, &panics)
			codes := []int{}
			for _, uid := range []string{"1", "2", "3"} {
				codes = append(codes, do(t, app, "GET", "/api/v1/users/"+uid).StatusCode)
			}
			assert.Equal(t, []int{200, 200, 429}, codes)
			assert.Empty(t, s.route("/api/v1/users/3"), "the handler did not run")
			resp := do(t, app, "GET", "/api/v1/users/4")
			assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
			assert.Equal(t, "1", resp.Header.Get("Retry-After"))
			assert.Equal(t, `"users";q=2;w=1`, resp.Header.Get("RateLimit-Policy"))
			assert.Equal(t, `"users";r=0;t=1`, resp.Header.Get("RateLimit"))
			assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
			assert.Equal(t, http.StatusOK, do(t, app, "GET", "/items/1").StatusCode, "another route")
		})
	}
}

// TestPerKey: a PerKey rule keyed by a header admits each key on its own.
func TestPerKey(t *testing.T) {
	eng := engine(t, flow.Rule{Resource: "GET /items/:id", Threshold: 1, PerKey: true})
	var panics atomic.Int32
	app := newApp(New(eng, WithKey(Header("X-Tenant"))).Middleware, global, newServed(), &panics)
	get := func(tenant string) int { return do(t, app, "GET", "/items/1", "X-Tenant", tenant).StatusCode }
	assert.Equal(t, []int{200, 429, 200, 429}, []int{get("a"), get("a"), get("b"), get("b")})
}

// TestClientIP: keys by the address fiber gives, grouped by flow.AddrKey.
func TestClientIP(t *testing.T) {
	eng := engine(t, flow.Rule{Resource: "GET /", Threshold: 1, PerKey: true})
	app := fiber.New(fiber.Config{ProxyHeader: "X-Real-IP"})
	app.Use(New(eng, WithKey(ClientIP())).Middleware)
	app.Get("/", func(c *fiber.Ctx) error { return c.SendStatus(http.StatusOK) })
	get := func(ip string) int { return do(t, app, "GET", "/", "X-Real-IP", ip).StatusCode }
	assert.Equal(t, []int{200, 429, 200, 429},
		[]int{get("2001:db8::1"), get("2001:db8::2"), get("192.0.2.1"), get("192.0.2.1")},
		"one key per IPv6 /64 and per IPv4 address")
}

// TestExceptions: a 5xx status, sent or the answer to a returned error,
// and a panic count as exceptions, a 4xx does not; the panic goes on to
// the recovery.
func TestExceptions(t *testing.T) {
	for _, reg := range []registration{global, perRoute} {
		t.Run(reg.String(), func(t *testing.T) {
			eng := engine(t)
			var panics atomic.Int32
			app := newApp(New(eng).Middleware, reg, newServed(), &panics)
			for path, code := range map[string]int{
				"/fail": http.StatusBadGateway, "/error": http.StatusServiceUnavailable,
				"/plain-error": http.StatusInternalServerError, "/panic": http.StatusInternalServerError,
				"/missing": http.StatusNotFound, "/denied": http.StatusForbidden,
			} {
				assert.Equal(t, code, do(t, app, "GET", "/api/v1"+path).StatusCode, path)
			}
			assert.Equal(t, int32(1), panics.Load())
			for path, errs := range map[string]int64{
				"/fail": 1, "/error": 1, "/plain-error": 1, "/panic": 1, "/missing": 0, "/denied": 0,
			} {
				snap, _ := eng.Snapshot("GET /api/v1" + path)
				assert.Equal(t, int64(1), snap.MinutePass, path)
				assert.Equal(t, int64(0), snap.Inflight, path)
				assert.Equal(t, errs, snap.MinuteErrors, path)
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
		WithResource(func(*fiber.Ctx) string { return "all" }),
		WithBlockHandler(func(c *fiber.Ctx, b httpflow.Blocked) error {
			return c.Status(http.StatusTeapot).SendString("slow down, " + b.Resource)
		}),
		WithExceptions(func(status int) bool { return status == http.StatusCreated }))
	var panics atomic.Int32
	app := newApp(blocked.Middleware, global, newServed(), &panics)
	assert.Equal(t, http.StatusCreated, do(t, app, "POST", "/items").StatusCode)
	assert.Equal(t, http.StatusTeapot, do(t, app, "GET", "/items/1").StatusCode)
	snap, _ := eng.Snapshot("all")
	assert.Equal(t, int64(1), snap.MinutePass)
	assert.Equal(t, int64(1), snap.MinuteErrors)

	conc := New(eng, WithResource(func(*fiber.Ctx) string { return "conc" }), WithConcurrency503())
	app = newApp(conc.Middleware, global, newServed(), &panics)
	resp := do(t, app, "GET", "/items/1")
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
	var panics atomic.Int32
	open := New(eng)
	assert.Equal(t, http.StatusOK, do(t, newApp(open.Middleware, global, newServed(), &panics), "GET", "/items/1").StatusCode)
	assert.Equal(t, httpflow.Stats{FailedOpen: 1}, open.Stats())

	closed := New(eng, WithFailClosed())
	assert.Equal(t, http.StatusServiceUnavailable, do(t, newApp(closed.Middleware, global, newServed(), &panics), "GET", "/items/1").StatusCode)
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
	app := fiber.New()
	app.Use(New(eng, WithLogger(slog.New(slog.NewTextHandler(&buf, nil)))).Middleware)
	app.Get("/items/:id", func(c *fiber.Ctx) error { return c.SendStatus(fiber.StatusOK) })
	clock.Set(11 * time.Second)
	for range 2 {
		do(t, app, http.MethodGet, "/nowhere")
	}
	assert.Equal(t, 1, strings.Count(buf.String(), "cannot take effect"), buf.String())
	assert.Contains(t, buf.String(), "rule=typo")
}

// TestHeadCountsAsGet: fiber's Get serves HEAD too; a HEAD request counts
// under the GET route's name, so it cannot go around its limit.
func TestHeadCountsAsGet(t *testing.T) {
	eng := engine(t, flow.Rule{Resource: "GET /items/:id", Threshold: 1})
	app := fiber.New()
	app.Use(New(eng).Middleware)
	app.Get("/items/:id", func(c *fiber.Ctx) error { return c.SendStatus(fiber.StatusOK) })
	assert.Equal(t, http.StatusOK, do(t, app, http.MethodHead, "/items/1").StatusCode)
	assert.Equal(t, http.StatusTooManyRequests, do(t, app, http.MethodGet, "/items/2").StatusCode, "the HEAD took the GET route's one")
	assert.Equal(t, int64(1), passes(eng, "GET /items/:id"))
}
