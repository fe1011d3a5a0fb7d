package httpflow

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/leapflow/leapflow/flow"
)

// BenchmarkMiddleware is a trivial handler in process, with and without
// the middleware in front (a rule that never blocks).
func BenchmarkMiddleware(b *testing.B) {
	e, err := flow.New()
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]flow.Rule{{Resource: "GET /x", Threshold: 1e12}}); err != nil {
		b.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for name, handler := range map[string]http.Handler{"plain": h, "leapflow": Handler(e, "GET /x", h)} {
		b.Run(name, func(b *testing.B) {
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				handler.ServeHTTP(w, r)
			}
		})
	}
}
