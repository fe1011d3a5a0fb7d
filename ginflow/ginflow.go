// Package ginflow puts leapflow in front of gin routes
// (github.com/gin-gonic/gin): each request enters the resource named after
// the route that serves it, its method and gin's full path ("GET
// /api/v1/items/:id"), however deeply its groups nest; a request no route
// matches (404, 405) enters httpflow.Unmatched. A refused request gets
// httpflow's answer (429 with Retry-After and the RateLimit fields, see
// httpflow.RefusalFields) and the rest of the chain is aborted; a 5xx
// status and a panic count as exceptions.
//
//	lim := ginflow.New(eng, ginflow.WithKey(ginflow.FromRequest(httpflow.ClientIP())))
//	router := gin.New()
//	router.Use(gin.Recovery(), lim.Middleware)
//	router.GET("/items/:id", getItem) // resource "GET /items/:id"
//
// # Naming
//
// gin routes a request before it runs any handler, the middlewares of Use
// included (it adds them to each route's chain), so the middleware reads
// the route from Context.FullPath wherever it is registered: on the
// engine, on a group, or on one route (router.GET(path, lim.Middleware,
// h)). Requests gin does not route (NoRoute, NoMethod) run the engine's
// Use middlewares with an empty FullPath: they are httpflow.Unmatched.
// Names are interned: naming a request allocates nothing once its route
// has been seen.
//
// # Status
//
// gin holds a status set with Context.Status until the first write or
// the end of the chain, so the exception is decided on
// Context.Writer.Status() once the chain below returns, not on what was
// written. A refused request, a wait that ended with the request's
// context, and WithFailClosed are answered as httpflow answers them; a
// request whose resource cannot be made (a full registry) goes through,
// counted in Stats.
package ginflow

import (
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
	"github.com/leapflow/leapflow/internal/adapt"
	"github.com/leapflow/leapflow/internal/routename"
)

type config struct {
	adapt.Config[*gin.Context]
	block func(*gin.Context, httpflow.Blocked)
}

// Option configures a Limiter.
type Option func(*config)

// WithResource names each request's resource (default: Resource).
func WithResource(fn func(*gin.Context) string) Option {
	return func(c *config) { c.Resource = fn }
}

// WithKey names each request's caller for PerKey rules ("" for none);
// FromRequest adapts httpflow's ClientIP and Header.
func WithKey(fn func(*gin.Context) string) Option { return func(c *config) { c.Key = fn } }

// FromRequest returns fn as a key function of gin's: FromRequest(httpflow.Header("X-API-Key")).
func FromRequest(fn func(*http.Request) string) func(*gin.Context) string {
	return func(c *gin.Context) string { return fn(c.Request) }
}

// WithBlockHandler replaces the answer to a refused request; the chain is
// aborted after it.
func WithBlockHandler(fn func(*gin.Context, httpflow.Blocked)) Option {
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

// Resource returns the resource of c: the request's method, a space and
// the full path of its route, or httpflow.Unmatched when gin routed it to
// none.
func Resource(c *gin.Context) string {
	path := c.FullPath()
	if path == "" {
		return httpflow.Unmatched
	}
	return names.Of(c.Request.Method, path)
}

// Limiter admits gin requests through an engine: its Middleware enters
// each request before the rest of its chain runs. It is safe for
// simultaneous use; one Limiter may serve any number of routes and
// engines.
type Limiter struct {
	cfg  config
	core adapt.Core[*gin.Context]
}

// New returns a Limiter on eng.
func New(eng *flow.Engine, opts ...Option) *Limiter {
	l := &Limiter{}
	l.cfg.Resource = Resource
	for _, o := range opts {
		if o != nil {
			o(&l.cfg)
		}
	}
	if l.cfg.block == nil {
		l.cfg.block = l.defaultBlock
	}
	l.core.Init(eng, l.cfg.Config, "ginflow")
	return l
}

// Stats returns the Limiter's counts so far.
func (l *Limiter) Stats() httpflow.Stats { return l.core.Stats() }

// Middleware is a gin handler: register it with Use on an engine or a
// group, or first in one route's handlers.
func (l *Limiter) Middleware(c *gin.Context) {
	ctx := c.Request.Context()
	en, err := l.core.Enter(c, ctx)
	if err != nil {
		switch f, msg := l.core.Failed(ctx, err); f {
		case adapt.Refused:
			l.cfg.block(c, en.Refusal())
		case adapt.Unavailable:
			http.Error(c.Writer, msg, http.StatusServiceUnavailable)
		default:
			c.Next()
			return
		}
		c.Abort()
		return
	}
	defer func() {
		if v := recover(); v != nil {
			l.core.Panicked(&en)
			panic(v)
		}
		l.core.Exit(&en, c.Writer.Status())
	}()
	c.Next()
}

// defaultBlock answers as httpflow's default block handler does.
func (l *Limiter) defaultBlock(c *gin.Context, b httpflow.Blocked) {
	status, fields := httpflow.RefusalFields(b, l.cfg.Conc503)
	h := c.Writer.Header()
	for _, f := range fields {
		h.Set(f[0], f[1])
	}
	http.Error(c.Writer, http.StatusText(status), status)
}

// names interns the resource names of the routes.
var names routename.Table
