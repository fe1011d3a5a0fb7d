package echoflow

import (
	"sync/atomic"

	"github.com/labstack/echo/v4"

	"github.com/leapflow/leapflow/httpflow"
)

// route is a method and a route's path.
type route struct{ method, path string }

// routeSet is the resource names of a router's routes, as its Routes were
// when it was made, and the paths of its RouteNotFound routes: requests
// of those are unmatched without reading the routes.
type routeSet struct {
	names    map[route]string
	notFound map[string]bool
	n        int // len(Routes())
}

// routes is a router's current routeSet.
type routes struct{ set atomic.Pointer[routeSet] }

// route names the request of c after its route, or httpflow.Unmatched
// (see the package doc).
func (l *Limiter) route(c echo.Context) string {
	path := c.Path()
	if path == "" || c.Get(echo.ContextKeyHeaderAllow) != nil {
		return httpflow.Unmatched // no route, or 405
	}
	req := c.Request()
	rt := router(c.Echo(), req.Host)
	v, ok := l.routes.Load(rt)
	if !ok {
		v, _ = l.routes.LoadOrStore(rt, &routes{})
	}
	return v.(*routes).name(rt, route{req.Method, path})
}

// router returns the router echo routes requests for host with.
func router(e *echo.Echo, host string) *echo.Router {
	if rs := e.Routers(); len(rs) > 0 {
		if r, ok := rs[host]; ok {
			return r
		}
	}
	return e.Router()
}

// name returns the resource of k, a method and the path echo gave a
// request, if it is a route of rt; httpflow.Unmatched if not (a
// RouteNotFound route's path), reading rt's routes again when their
// number has changed.
func (rs *routes) name(rt *echo.Router, k route) string {
	s := rs.set.Load()
	if s != nil {
		if name, ok := s.names[k]; ok {
			return name
		}
		if s.notFound[k.path] {
			// A RouteNotFound route's: a 404, however many come, costs
			// no reading of the routes. (Echo gives only its routes'
			// paths: any other miss is a route added since.)
			return httpflow.Unmatched
		}
	}
	all := rt.Routes()
	if s == nil || s.n != len(all) {
		s = &routeSet{names: make(map[route]string, len(all)), notFound: map[string]bool{}, n: len(all)}
		for _, r := range all {
			if r.Method == echo.RouteNotFound {
				s.notFound[r.Path] = true
				continue
			}
			s.names[route{r.Method, r.Path}] = r.Method + " " + r.Path
		}
		rs.set.Store(s)
	}
	if name, ok := s.names[k]; ok {
		return name
	}
	return httpflow.Unmatched
}
