//go:build !race

package ginflow

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// TestMiddlewareAllocations: an admitted request allocates nothing in the
// middleware once its route has been seen: a router with it allocates as
// much per request as one without. Not under the race detector, whose
// pools drop entries.
func TestMiddlewareAllocations(t *testing.T) {
	eng, err := flow.New()
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "GET /api/items/:id", Threshold: 1e12}}))
	h := func(c *gin.Context) { c.Status(http.StatusNoContent) }
	allocs := func(mw ...gin.HandlerFunc) float64 {
		r := gin.New()
		r.Use(mw...)
		r.Group("/api").GET("/items/:id", h)
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/items/7", nil)
		r.ServeHTTP(w, req)
		return testing.AllocsPerRun(200, func() { r.ServeHTTP(w, req) })
	}
	assert.Equal(t, allocs(), allocs(New(eng).Middleware))
}

func BenchmarkMiddleware(b *testing.B) {
	eng, err := flow.New()
	require.NoError(b, err)
	require.NoError(b, eng.LoadRules([]flow.Rule{{Resource: "GET /api/items/:id", Threshold: 1e12}}))
	for _, name := range []string{"plain", "leapflow"} {
		r := gin.New()
		if name == "leapflow" {
			r.Use(New(eng).Middleware)
		}
		r.Group("/api").GET("/items/:id", func(c *gin.Context) { c.Status(http.StatusNoContent) })
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/items/7", nil)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.ServeHTTP(w, req)
			}
		})
	}
}
