// Package fiberflow puts leapflow in front of fiber routes
// (github.com/gofiber/fiber/v2): each request enters the resource named
// after the route fiber dispatches it to, its method and the route's full
// path as registered ("GET /api/v1/items/:id"), however deeply its groups
// and mounted apps nest; a request no route matches enters
// httpflow.Unmatched. A refused request gets the status and header fields
// httpflow answers with (429 with Retry-After and the RateLimit fields,
// httpflow.RefusalFields) and the rest of the chain does not run; a 5xx
// status, an error whose answer is a 5xx, and a panic count as
// exceptions.
//
//	lim := fiberflow.New(eng, fiberflow.WithKey(fiberflow.Header("X-API-Key")))
//	app := fiber.New()
//	app.Use(recover.New(), lim.Middleware)
//	app.Get("/items/:id", getItem) // resource "GET /items/:id"
//
// # Naming
//
// fiber does not route a request once, ahead of its handlers: it walks
// its stack of routes, the Use ones among them, and each c.Next() goes on
// to the next route that matches. So a middleware registered with Use (on
// the app or on a group) sees its own route in Ctx.Route, the Use route's
// prefix: naming by it would put every request in one resource. The
// middleware finds the route itself: the first time it sees an app, it
// copies the app's routes that are not Use routes (App.GetRoutes(true):
// methods and full paths, groups and mounted apps included) into an app
// of its own, with no-op handlers and the same routing settings
// (CaseSensitive, StrictRouting, UnescapePath, RequestMethods), and for
// each request it lets that app route the request
// (AcquireCtx(c.Context()) and RestartRouting), which is fiber's own
// matching over the same routes in the same order. The copy is made again
// when the app's HandlersCount changes. Registered on one route
// (app.Get(path, lim.Middleware, h)) the middleware finds that same route.
//
// The route found is the first that matches: a handler that passes the
// request on to a later matching route with c.Next() leaves it under the
// first one's name. Files of App.Static are served by a Use route: they
// are httpflow.Unmatched (name them with WithResource).
//
// # Status
//
// fiber answers an error a handler returns after the whole chain has
// returned. So that its status counts, the middleware hands a returned
// error to the app's ErrorHandler itself and returns nil, as fiber's
// logger middleware does. A wait that ended with the request's
// UserContext, and WithFailClosed, are answered 503 as httpflow answers
// them; a request whose resource cannot be made (a full registry) goes
// through, counted in Stats.
package fiberflow

import (
	"log/slog"
	"net/http"
	"net/netip"
	"sync"

	"github.com/gofiber/fiber/v2"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
	"github.com/leapflow/leapflow/internal/adapt"
)

type config struct {
	adapt.Config[*fiber.Ctx]
	block func(*fiber.Ctx, httpflow.Blocked) error
}

// Option configures a Limiter.
type Option func(*config)

// WithResource names each request's resource (default: its route, see the
// package doc). The name must outlive the request: strings fiber returns
// (Ctx.Path, Ctx.Get, ...) point into buffers the next request reuses,
// copy them (utils.CopyString).
func WithResource(fn func(*fiber.Ctx) string) Option {
	return func(c *config) { c.Resource = fn }
}

// WithKey names each request's caller for PerKey rules ("" for none): see
// Header and ClientIP. The key may point into fiber's buffers (the engine
// keeps no key bytes).
func WithKey(fn func(*fiber.Ctx) string) Option { return func(c *config) { c.Key = fn } }

// Header returns a key function naming each request's caller by a header
// (an API key, a tenant ID); "" when absent.
func Header(name string) func(*fiber.Ctx) string {
	return func(c *fiber.Ctx) string { return c.Get(name) }
}

// ClientIP returns a key function naming each request's caller by the
// address Ctx.IP gives (the peer's, or the app's ProxyHeader's as its
// settings trust it), grouped as flow.AddrKey groups them (IPv6 by /64);
// "" when it is no address.
func ClientIP() func(*fiber.Ctx) string {
	return func(c *fiber.Ctx) string {
		a, err := netip.ParseAddr(c.IP())
		if err != nil {
			return ""
		}
		return flow.AddrKey(a)
	}
}

// WithBlockHandler replaces the answer to a refused request; what it
// returns is the middleware's return.
func WithBlockHandler(fn func(*fiber.Ctx, httpflow.Blocked) error) Option {
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

// Limiter admits fiber requests through an engine: its Middleware enters
// each request before the rest of the chain runs. It is safe for
// simultaneous use; one Limiter may serve any number of routes and apps.
type Limiter struct {
	cfg  config
	core adapt.Core[*fiber.Ctx]
	// apps holds the copy of each app's routes (see the package doc).
	apps sync.Map // *fiber.App -> *routes
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
	l.core.Init(eng, l.cfg.Config, "fiberflow")
	return l
}

// Stats returns the Limiter's counts so far.
func (l *Limiter) Stats() httpflow.Stats { return l.core.Stats() }

// Middleware is a fiber handler: register it with Use on an app or a
// group, or first in one route's handlers.
func (l *Limiter) Middleware(c *fiber.Ctx) error {
	ctx := c.UserContext()
	en, err := l.core.Enter(c, ctx)
	if err != nil {
		switch f, msg := l.core.Failed(ctx, err); f {
		case adapt.Refused:
			return l.cfg.block(c, en.Refusal())
		case adapt.Unavailable:
			return plain(c, fiber.StatusServiceUnavailable, msg)
		}
		return c.Next()
	}
	defer func() {
		if v := recover(); v != nil {
			l.core.Panicked(&en)
			panic(v)
		}
	}()
	if err := c.Next(); err != nil {
		if err := c.App().ErrorHandler(c, err); err != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}
	l.core.Exit(&en, c.Response().StatusCode())
	return nil
}

// defaultBlock answers as httpflow's default block handler does.
func (l *Limiter) defaultBlock(c *fiber.Ctx, b httpflow.Blocked) error {
	status, fields := httpflow.RefusalFields(b, l.cfg.Conc503)
	for _, f := range fields {
		c.Set(f[0], f[1])
	}
	return plain(c, status, http.StatusText(status))
}

// plain answers status with msg as http.Error does.
func plain(c *fiber.Ctx, status int, msg string) error {
	c.Set(fiber.HeaderContentType, fiber.MIMETextPlainCharsetUTF8)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	return c.Status(status).SendString(msg + "\n")
}
