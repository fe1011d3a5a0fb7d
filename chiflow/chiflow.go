// Package chiflow puts leapflow in front of a chi router
// (github.com/go-chi/chi/v5): each request enters the resource named after
// the route that serves it, its method and chi's full pattern ("GET
// /api/items/{id}"), however deeply that route is nested in Route, Mount
// and Group; a request no route matches (404, 405) enters
// httpflow.Unmatched. Everything else is httpflow's: New returns an
// httpflow.Limiter, takes httpflow's options (WithKey, WithBlockHandler,
// WithExceptions, WithConcurrency503, ...) and answers as it does (429
// with Retry-After and the RateLimit fields; 5xx responses and panics
// count as exceptions).
//
//	lim := chiflow.New(eng, httpflow.WithKey(httpflow.ClientIP()))
//	r := chi.NewRouter()
//	r.Use(lim.Middleware)
//	r.Get("/items/{id}", getItem) // resource "GET /items/{id}"
//
// # Naming
//
// chi runs the middlewares of Use before it routes, so at that point
// neither Request.Pattern nor chi's RouteContext().RoutePattern() names the
// route yet. Resource routes the request itself, ahead of time: it asks
// the outermost router (RouteContext().Routes) to Find the request's
// method and path on a fresh routing context, which descends into mounted
// subrouters as chi will, and names the request after the patterns it
// went through, joined as chi's RoutePattern joins them. The name is the
// same wherever the middleware sits: on the outermost router, on a
// subrouter's Use, or on one route with With(lim.Middleware).
//
// Before any routing the path is the one the outermost router will route
// (RouteContext().RoutePath when a middleware set it, else the URL's);
// below a mount it is the URL's path, so a RoutePath rewritten on an outer
// router is not seen by a middleware registered inside a subrouter.
// Outside a chi router every request is httpflow.Unmatched.
//
// # Cost
//
// Resource matches the request once more than chi does (Find walks the
// same tree). Names are interned: a request of a route of the outermost
// router is named without an allocation; below a mount, Find builds the
// remaining path and the joined pattern as chi's own routing does at each
// level (a few small strings).
package chiflow

import (
	"net/http"
	"sync"

	"github.com/go-chi/chi/v5"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
	"github.com/leapflow/leapflow/internal/routename"
)

// New returns an httpflow Limiter on eng that names each request by
// Resource; opts are httpflow's, and a WithResource among them replaces
// the naming. Register its Middleware with Use on any router, or on a
// route with With.
func New(eng *flow.Engine, opts ...httpflow.Option) *httpflow.Limiter {
	return httpflow.New(eng, append([]httpflow.Option{httpflow.WithResource(Resource)}, opts...)...)
}

// probes are the routing contexts Resource routes requests on.
var probes = sync.Pool{New: func() any { return chi.NewRouteContext() }}

// Resource returns the resource of r under a chi router: r's method, a
// space and the full pattern of the route chi routes r to, or
// httpflow.Unmatched when none does. See the package doc.
func Resource(r *http.Request) string {
	rctx := chi.RouteContext(r.Context())
	if rctx == nil || rctx.Routes == nil {
		return httpflow.Unmatched
	}
	method := rctx.RouteMethod
	if method == "" {
		method = r.Method
	}
	path := ""
	if len(rctx.RoutePatterns) == 0 {
		path = rctx.RoutePath // a rewrite for the outermost router
	}
	if path == "" {
		path = r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		if path == "" {
			path = "/"
		}
	}
	probe := probes.Get().(*chi.Context)
	probe.Reset()
	pattern := ""
	if rctx.Routes.Find(probe, method, path) != "" {
		pattern = probe.RoutePattern()
	}
	probes.Put(probe)
	if pattern == "" {
		return httpflow.Unmatched
	}
	return names.Of(method, pattern)
}

// names interns the resource names of the routes.
var names routename.Table
