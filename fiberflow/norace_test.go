//go:build !race

package fiberflow

import (
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"

	"github.com/leapflow/leapflow/flow"
)

// newLimited returns the handler of an app with a route two groups deep,
// the limiter on it with Use, or when eng is nil a middleware that only
// calls the next.
func newLimited(eng *flow.Engine) fasthttp.RequestHandler {
	app := fiber.New()
	if eng != nil {
		app.Use(New(eng).Middleware)
	} else {
		app.Use(func(c *fiber.Ctx) error { return c.Next() })
	}
	app.Group("/api").Group("/v1").Get("/items/:id", func(c *fiber.Ctx) error { return c.SendStatus(http.StatusNoContent) })
	return app.Handler()
}

func request() *fasthttp.RequestCtx {
	var fctx fasthttp.RequestCtx
	fctx.Request.Header.SetMethod(http.MethodGet)
	fctx.Request.SetRequestURI("/api/v1/items/7")
	return &fctx
}

// TestMiddlewareAllocations: an admitted request allocates nothing in the
// middleware, the routing of its copy of the app's routes included: an
// app with it allocates as much per request as one with a middleware that
// does nothing. Not under the race detector, whose pools drop entries.
func TestMiddlewareAllocations(t *testing.T) {
	eng, err := flow.New()
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "GET /api/v1/items/:id", Threshold: 1e12}}))
	allocs := func(h fasthttp.RequestHandler) float64 {
		fctx := request()
		h(fctx)
		require.Equal(t, http.StatusNoContent, fctx.Response.StatusCode())
		return testing.AllocsPerRun(200, func() { h(fctx) })
	}
	assert.Equal(t, allocs(newLimited(nil)), allocs(newLimited(eng)))
}

func BenchmarkMiddleware(b *testing.B) {
	eng, err := flow.New()
	require.NoError(b, err)
	require.NoError(b, eng.LoadRules([]flow.Rule{{Resource: "GET /api/v1/items/:id", Threshold: 1e12}}))
	for name, h := range map[string]fasthttp.RequestHandler{"noop": newLimited(nil), "leapflow": newLimited(eng)} {
		fctx := request()
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h(fctx)
			}
		})
	}
}
