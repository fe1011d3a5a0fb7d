package echoflow_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/leapflow/leapflow/echoflow"
	"github.com/leapflow/leapflow/flow"
)

// Two requests a second to any item under /api/v1; the limiter is
// registered once, with Use, and names requests by the route that serves
// them.
func Example() {
	eng, _ := flow.New()
	if err := eng.LoadRules([]flow.Rule{{Resource: "GET /api/v1/items/:id", Threshold: 2}}); err != nil {
		panic(err)
	}
	e := echo.New()
	e.Use(middleware.Recover(), echoflow.New(eng).Middleware)
	e.Group("/api").Group("/v1").GET("/items/:id", func(c echo.Context) error {
		return c.String(http.StatusOK, "item "+c.Param("id"))
	})

	for _, id := range []string{"1", "2", "3"} {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/api/v1/items/"+id, nil))
		fmt.Printf("%s: %d %q\n", id, w.Code, w.Header().Get("Retry-After"))
	}
	// Output:
	// 1: 200 ""
	// 2: 200 ""
	// 3: 429 "1"
}
