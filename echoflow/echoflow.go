// Package echoflow puts leapflow in front of echo routes
// (github.com/labstack/echo/v4): each request enters the resource named
// after the route that serves it, its method and echo's path ("GET
// /api/v1/items/:id"), however deeply its groups nest; a request no route
// matches (404, 405) enters httpflow.Unmatched. A refused request gets
// httpflow's answer (429 with Retry-After and the RateLimit fields, see
// httpflow.RefusalFields) and the handler does not run; a 5xx status and
// a panic count as exceptions.
//
//	lim := echoflow.New(eng, echoflow.WithKey(echoflow.FromRequest(httpflow.ClientIP())))
//	e := echo.New()
//	e.Use(middleware.Recover(), lim.Middleware)
//	e.GET("/items/:id", getItem) // resource "GET /items/:id"
//
// # Naming
//
// echo routes a request before the middlewares of Use run (those of Pre
// run before routing: there the middleware would see no route, and names
// every request httpflow.Unmatched), so the middleware reads the route
// from Context.Path wherever it is registered: with Use, on a group, or
// on one route. Context.Path alone does not tell a route from a miss: a
// request echo could not route has the path of the node it got furthest
// to (405), or of a RouteNotFound route, such as the "/api/*" each group
// with middlewares registers. So a request is named after its route only
// when its method and path are a route of the router that served it (its
// Routes, read once and again when their number changes); any other is
// httpflow.Unmatched. Naming a request of a route allocates nothing.
//
// # Status
//
// echo writes the answer to an error a handler returns after the whole
// chain has returned. So that its status counts, the middleware hands a
// returned error to the error handler itself (Context.Error, unless the
// response is already committed) and then returns it, as echo's
// RequestLogger does with HandleError: echo's default error handler does
// nothing for a committed response, and a custom one should do the same.
// A wait that ended with the request's context, and WithFailClosed, are
// answered as httpflow answers them; a request whose resource cannot be
// made (a full registry) goes through, counted in Stats.
package echoflow

import (
	"log/slog"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
	"github.com/leapflow/leapflow/internal/adapt"
)

type config struct {
	adapt.Config[echo.Context]
	block func(echo.Context, httpflow.Blocked) error
}

// Option configures a Limiter.
type Option func(*config)

// WithResource names each request's resource (default: its route, see the
// package doc).
func WithResource(fn func(echo.Context) string) Option {
	return func(c *config) { c.Resource = fn }
}

// WithKey names each request's caller for PerKey rules ("" for none);
// FromRequest adapts httpflow's ClientIP and Header.
func WithKey(fn func(echo.Context) string) Option { return func(c *config) { c.Key = fn } }

// FromRequest returns fn as a key function of echo's: FromRequest(httpflow.Header("X-API-Key")).
func FromRequest(fn func(*http.Request) string) func(echo.Context) string {
	return func(c echo.Context) string { return fn(c.Request()) }
}

// WithBlockHandler replaces the answer to a refused request; what it
// returns is the middleware's return.
func WithBlockHandler(fn func(echo.Context, httpflow.Blocked) error) Option {
	return func(c *config) { c.block = fn }
}

// WithConcurrency503 answers requests a Concurrency rule refused with 503
// Service Unavailable instead of 429.
func WithConcurrency503() Option { return func(c *config) { c.Conc503 = true } }

// WithLogger sets where the Limiter logs rules that cannot take effect:
// while requests go unmatched, a rule whose resource sees none
// (flow.Engine.Unreached; default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.Logger = l } }

// WithFailClosed answers 503 to a request whose resource cannot be made
// (a full registry) instead of letting it through.
func WithFailClosed() Option { return func(c *config) { c.FailClosed = true } }

// WithExceptions decides which response statuses count as exceptions
// (default: 500 and above).
func WithExceptions(fn func(status int) bool) Option {
	return func(c *config) { c.IsException = fn }
}

// Limiter admits echo requests through an engine: its Middleware enters
// each request before the handler runs. It is safe for simultaneous use;
// one Limiter may serve any number of routes and Echo instances.
type Limiter struct {
	cfg  config
	core adapt.Core[echo.Context]
	// routes holds a routeSet per echo Router it named requests of.
	routes sync.Map // *echo.Router -> *routeSet
}

// New returns a Limiter on eng.
func New(eng *flow.Engine, opts ...Option) *Limiter {
	l := &Limiter{}
	l.cfg.Resource = l.route
	for _, o := range opts {
		if o != nil {
			o(&l.cfg)
		}
	}
	if l.cfg.block == nil {
		l.cfg.block = l.defaultBlock
	}
	l.core.Init(eng, l.cfg.Config, "echoflow")
	return l
}

// Stats returns the Limiter's counts so far.
func (l *Limiter) Stats() httpflow.Stats { return l.core.Stats() }

// Middleware is an echo middleware: register it with Use, on a group, or
// on one route; not with Pre (see the package doc).
func (l *Limiter) Middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		ctx := c.Request().Context()
		en, err := l.core.Enter(c, ctx)
		if err != nil {
			switch f, msg := l.core.Failed(ctx, err); f {
			case adapt.Refused:
				return l.cfg.block(c, en.Refusal())
			case adapt.Unavailable:
				http.Error(c.Response(), msg, http.StatusServiceUnavailable)
				return nil
			}
			return next(c)
		}
		defer func() {
			if v := recover(); v != nil {
				l.core.Panicked(&en)
				panic(v)
			}
		}()
		res := c.Response()
		err = next(c)
		if err != nil && !res.Committed {
			c.Error(err)
		}
		l.core.Exit(&en, res.Status)
		return err
	}
}

// defaultBlock answers as httpflow's default block handler does.
func (l *Limiter) defaultBlock(c echo.Context, b httpflow.Blocked) error {
	status, fields := httpflow.RefusalFields(b, l.cfg.Conc503)
	h := c.Response().Header()
	for _, f := range fields {
		h.Set(f[0], f[1])
	}
	http.Error(c.Response(), http.StatusText(status), status)
	return nil
}
