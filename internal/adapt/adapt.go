// Package adapt is what the web-framework adapters (ginflow, echoflow,
// fiberflow) share: their options, the entry of a request, what a failed
// entry means, and the exit. C is the framework's request context.
package adapt

import (
	"context"
	"errors"
	"log/slog"
	"strconv"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/httpflow"
	"github.com/leapflow/leapflow/internal/callerkey"
	"github.com/leapflow/leapflow/internal/unreached"
)

// Config is what every adapter's options set.
type Config[C any] struct {
	// Resource names a request's resource; Key its caller ("" for none).
	Resource, Key func(C) string
	// Conc503 answers a Concurrency rule's refusal with 503; FailClosed
	// answers 503 when the resource cannot be made.
	Conc503, FailClosed bool
	// IsException decides which statuses count as exceptions (nil: 500
	// and above).
	IsException func(status int) bool
	// Logger is where unreached rules are logged (nil: slog.Default()).
	Logger *slog.Logger
}

// Core is the part of an adapter's Limiter that every framework shares.
type Core[C any] struct {
	eng *flow.Engine
	cfg Config[C]
	// failedOpen and failedClosed back Stats.
	failedOpen, failedClosed atomic.Int64
	unreached                *unreached.Reporter
	// name prefixes the exceptions' messages ("ginflow").
	name     string
	errPanic error
}

// Init sets the Core of an adapter called name up on eng with cfg, the
// options applied.
func (k *Core[C]) Init(eng *flow.Engine, cfg Config[C], name string) {
	if cfg.IsException == nil {
		cfg.IsException = func(status int) bool { return status >= 500 }
	}
	k.eng, k.cfg, k.name = eng, cfg, name
	k.errPanic = errors.New(name + ": handler panicked")
	k.unreached = unreached.New(eng, cfg.Logger, httpflow.Unmatched)
}

// Enter names the request of c and enters it, its wait bound by ctx;
// a request named unmatched, once counted, makes the Core look for rules
// that cannot take effect.
func (k *Core[C]) Enter(c C, ctx context.Context) (flow.Entry, error) {
	opts := [2]flow.EntryOption{flow.WithContext(ctx)}
	n := 1
	if k.cfg.Key != nil {
		if key := k.cfg.Key(c); key != "" {
			opts[1] = flow.WithKey(callerkey.Bound(key))
			n = 2
		}
	}
	resource := k.cfg.Resource(c)
	en, err := k.eng.Entry(resource, opts[:n]...)
	if resource == httpflow.Unmatched {
		k.unreached.Check()
	}
	return en, err
}

// Failure is what a failed Enter means for the request.
type Failure int

const (
	// Refused: a rule refused it; answer with its Refusal.
	Refused Failure = iota
	// Unavailable: answer 503 with the message Failed returns.
	Unavailable
	// Through: its resource could not be made; let it through.
	Through
)

// Failed says what err, Enter's error for a request whose context is
// ctx, means for it, and counts it in Stats.
func (k *Core[C]) Failed(ctx context.Context, err error) (Failure, string) {
	var be *flow.BlockError
	switch {
	case errors.As(err, &be):
		return Refused, ""
	case ctx.Err() != nil:
		// The wait ended with the request's context: never an empty 200.
		k.failedClosed.Inc()
		return Unavailable, "request ended while queued"
	case k.cfg.FailClosed:
		k.failedClosed.Inc()
		return Unavailable, "rate limiter unavailable"
	}
	k.failedOpen.Inc()
	return Through, ""
}

// Exit exits en with the response's status: an exception when
// IsException says so.
func (k *Core[C]) Exit(en *flow.Entry, status int) {
	if k.cfg.IsException(status) {
		en.Exit(errStatus{k.name, status})
		return
	}
	en.Exit(nil)
}

// Panicked exits en of a handler that panicked.
func (k *Core[C]) Panicked(en *flow.Entry) { en.Exit(k.errPanic) }

// Stats returns the counts so far.
func (k *Core[C]) Stats() httpflow.Stats {
	return httpflow.Stats{FailedOpen: k.failedOpen.Load(), FailedClosed: k.failedClosed.Load()}
}

// errStatus is the exception of a response with a status counted as one.
type errStatus struct {
	name   string
	status int
}

func (e errStatus) Error() string { return e.name + ": response status " + strconv.Itoa(e.status) }
