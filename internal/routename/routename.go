// Package routename interns the resource names HTTP adapters give routes
// ("GET /items/{id}"), so that naming a request of a route seen before
// allocates nothing.
package routename

import (
	"maps"
	"sync"
	"sync/atomic"
)

// route is a method and a route's pattern.
type route struct{ method, pattern string }

// Table interns resource names: a read is a lookup in an immutable map; a
// new name copies the map (routes are few, and each is added once). The
// zero Table is ready to use.
type Table struct {
	m  atomic.Pointer[map[route]string]
	mu sync.Mutex // serialises the copies
}

// maxNames bounds the table: method and pattern come from the router's
// own tables, so it is not reached in practice; past it names are made
// per request.
const maxNames = 4096

// Of returns method, a space and pattern, interned.
func (t *Table) Of(method, pattern string) string {
	k := route{method, pattern}
	if m := t.m.Load(); m != nil {
		if s, ok := (*m)[k]; ok {
			return s
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	next := map[route]string{}
	if m := t.m.Load(); m != nil {
		if s, ok := (*m)[k]; ok {
			return s
		}
		if len(*m) >= maxNames {
			return method + " " + pattern
		}
		next = maps.Clone(*m)
	}
	s := method + " " + pattern
	next[k] = s
	t.m.Store(&next)
	return s
}
