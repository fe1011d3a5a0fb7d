package chiflow_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/go-chi/chi/v5"

	"github.com/leapflow/leapflow/chiflow"
	"github.com/leapflow/leapflow/flow"
)

// Two requests a second to any item under /api; the limiter is registered
// once, on the outermost router, and names requests by the route that
// serves them.
func Example() {
	eng, _ := flow.New()
	if err := eng.LoadRules([]flow.Rule{{Resource: "GET /api/items/{id}", Threshold: 2}}); err != nil {
		panic(err)
	}
	r := chi.NewRouter()
	r.Use(chiflow.New(eng).Middleware)
	r.Route("/api", func(r chi.Router) {
		r.Get("/items/{id}", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintln(w, "item", chi.URLParam(r, "id"))
		})
	})

	for _, id := range []string{"1", "2", "3"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/items/"+id, nil))
		fmt.Printf("%s: %d %q\n", id, w.Code, w.Header().Get("Retry-After"))
	}
	// Output:
	// 1: 200 ""
	// 2: 200 ""
	// 3: 429 "1"
}
