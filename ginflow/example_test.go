package ginflow_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gin-gonic/gin"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/ginflow"
	"github.com/leapflow/leapflow/httpflow"
)

// Two requests a second to any item under /api/v1, per API key; the
// limiter is registered once, on the engine, and names requests by the
// route that serves them.
func Example() {
	eng, _ := flow.New()
	if err := eng.LoadRules([]flow.Rule{{Resource: "GET /api/v1/items/:id", Threshold: 2, PerKey: true}}); err != nil {
		panic(err)
	}
	lim := ginflow.New(eng, ginflow.WithKey(ginflow.FromRequest(httpflow.Header("X-API-Key"))))

	gin.SetMode(gin.ReleaseMode)
	router := gin.New()
	router.Use(gin.Recovery(), lim.Middleware)
	router.Group("/api").Group("/v1").GET("/items/:id", func(c *gin.Context) {
		c.String(http.StatusOK, "item %s", c.Param("id"))
	})

	for _, key := range []string{"a", "a", "a", "b"} {
		w := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/api/v1/items/1", nil)
		req.Header.Set("X-API-Key", key)
		router.ServeHTTP(w, req)
		fmt.Printf("%s: %d %q\n", key, w.Code, w.Header().Get("Retry-After"))
	}
	// Output:
	// a: 200 ""
	// a: 200 ""
	// a: 429 "1"
	// b: 200 ""
}
