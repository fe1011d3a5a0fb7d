package fiberflow_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/recover"

	"github.com/leapflow/leapflow/fiberflow"
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
	app := fiber.New()
	app.Use(recover.New(), fiberflow.New(eng).Middleware)
	app.Group("/api").Group("/v1").Get("/items/:id", func(c *fiber.Ctx) error {
		return c.SendString("item " + c.Params("id"))
	})

	for _, id := range []string{"1", "2", "3"} {
		resp, err := app.Test(httptest.NewRequest(http.MethodGet, "/api/v1/items/"+id, nil), -1)
		if err != nil {
			panic(err)
		}
		fmt.Printf("%s: %d %q\n", id, resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// Output:
	// 1: 200 ""
	// 2: 200 ""
	// 3: 429 "1"
}
