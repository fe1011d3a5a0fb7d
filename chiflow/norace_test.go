//go:build !race

package chiflow

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/go-chi/chi/v5"
	"github.com/stretchr/testify/assert"
)

// inRouter returns a request for path as the outermost router's Use
// middlewares see it.
func inRouter(path string) *http.Request {
	var panics atomic.Int32
	rctx := chi.NewRouteContext()
	rctx.Routes = newRouter(func(h http.Handler) http.Handler { return h }, global, &served{}, &panics).(chi.Routes)
	r := httptest.NewRequest(http.MethodGet, path, nil)
	return r.WithContext(context.WithValue(r.Context(), chi.RouteCtxKey, rctx))
}

// TestResourceAllocations: naming a request of a route of the outermost
// router, or of none, allocates nothing. Not under the race detector,
// whose pools drop entries.
func TestResourceAllocations(t *testing.T) {
	for path, want := range map[string]float64{"/items/7": 0, "/nowhere": 0} {
		r := inRouter(path)
		Resource(r)
		assert.Equal(t, want, testing.AllocsPerRun(100, func() { Resource(r) }), path)
	}
}

func BenchmarkResource(b *testing.B) {
	for _, path := range []string{"/items/7", "/api/v1/users/1", "/nowhere"} {
		r := inRouter(path)
		b.Run(path, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				Resource(r)
			}
		})
	}
}
