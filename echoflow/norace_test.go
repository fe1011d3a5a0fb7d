//go:build !race

package echoflow

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// newLimited returns an Echo with a route two groups deep, the limiter on
// it with Use, or when eng is nil a middleware that only calls the next.
func newLimited(eng *flow.Engine) *echo.Echo {
	e := echo.New()
	if eng != nil {
		e.Use(New(eng).Middleware)
	} else {
		e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
			return func(c echo.Context) error { return next(c) }
		})
	}
	e.Group("/api").Group("/v1").GET("/items/:id", func(c echo.Context) error { return c.NoContent(http.StatusNoContent) })
	return e
}

// TestMiddlewareAllocations: an admitted request allocates nothing in the
// middleware once its route has been seen: an Echo with it allocates as
// much per request as one with a middleware that does nothing (echo makes
// each middleware's handler per request). Not under the race detector,
// whose pools drop entries.
func TestMiddlewareAllocations(t *testing.T) {
	eng, err := flow.New()
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "GET /api/v1/items/:id", Threshold: 1e12}}))
	allocs := func(e *echo.Echo) float64 {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/v1/items/7", nil)
		e.ServeHTTP(w, req)
		return testing.AllocsPerRun(200, func() { e.ServeHTTP(w, req) })
	}
	assert.Equal(t, allocs(newLimited(nil)), allocs(newLimited(eng)))
}

func BenchmarkMiddleware(b *testing.B) {
	eng, err := flow.New()
	require.NoError(b, err)
	require.NoError(b, eng.LoadRules([]flow.Rule{{Resource: "GET /api/v1/items/:id", Threshold: 1e12}}))
	for name, e := range map[string]*echo.Echo{"noop": newLimited(nil), "leapflow": newLimited(eng)} {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/v1/items/7", nil)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				e.ServeHTTP(w, req)
			}
		})
	}
}
