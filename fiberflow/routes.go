package fiberflow

import (
	"github.com/gofiber/fiber/v2"

	"github.com/leapflow/leapflow/httpflow"
)

// routes is a copy of an app's routes that routes requests without
// serving them (see the package doc).
type routes struct {
	app      *fiber.App              // the copy: the routes that are not Use routes, with no-op handlers
	handlers uint32                  // the app's HandlersCount when copied
	names    map[*fiber.Route]string // the resource of each route of the copy
}

// route names the request of c after the route its app dispatches it to,
// or httpflow.Unmatched.
func (l *Limiter) route(c *fiber.Ctx) string {
	rs := l.routesOf(c.App())
	probe := rs.app.AcquireCtx(c.Context())
	name := httpflow.Unmatched
	if probe.RestartRouting() == nil { // only a matching route's no-op handler returns nil
		name = rs.names[probe.Route()]
	}
	rs.app.ReleaseCtx(probe)
	return name
}

// routesOf returns the copy of app's routes, making it when app has none or
// its routes changed.
func (l *Limiter) routesOf(app *fiber.App) *routes {
	n := app.HandlersCount()
	if v, ok := l.apps.Load(app); ok && v.(*routes).handlers == n {
		return v.(*routes)
	}
	rs := copyRoutes(app, n)
	l.apps.Store(app, rs)
	return rs
}

func copyRoutes(app *fiber.App, handlers uint32) *routes {
	cfg := app.Config()
	cp := fiber.New(fiber.Config{
		CaseSensitive:  cfg.CaseSensitive,
		StrictRouting:  cfg.StrictRouting,
		UnescapePath:   cfg.UnescapePath,
		RequestMethods: cfg.RequestMethods,
	})
	// In stack order, method by method: the order fiber tries them in.
	for _, r := range app.GetRoutes(true) {
		cp.Add(r.Method, r.Path, found)
	}
	cp.Handler() // builds its routing tree
	// app.Get registers HEAD too: a HEAD request of a GET route counts as
	// GET, as under a ServeMux "GET" pattern, so that HEAD requests do not
	// go around the GET route's limits.
	gets := map[string]bool{}
	for _, r := range app.GetRoutes(true) {
		if r.Method == fiber.MethodGet {
			gets[r.Path] = true
		}
	}
	names := map[*fiber.Route]string{}
	for _, stack := range cp.Stack() {
		for _, r := range stack {
			method := r.Method
			if method == fiber.MethodHead && gets[r.Path] {
				method = fiber.MethodGet
			}
			names[r] = method + " " + r.Path
		}
	}
	return &routes{app: cp, handlers: handlers, names: names}
}

// found is the handler of every route of a copy.
func found(*fiber.Ctx) error { return nil }
