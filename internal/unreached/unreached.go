// Package unreached logs the rules of an engine that cannot take effect as
// named (flow.Engine.Unreached), for the HTTP adapters.
package unreached

import (
	"log/slog"
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
)

// Reporter logs each rule of an engine that cannot take effect as named,
// once, looking at most every 10 s: an adapter calls Check after it
// counted a request under its unmatched resource. It is safe for
// simultaneous use.
type Reporter struct {
	eng       *flow.Engine
	logger    *slog.Logger
	unmatched string
	// checked is when Check last looked (unix ns); reported are the rules
	// it logged.
	checked  atomic.Int64
	mu       sync.Mutex
	reported map[string]bool
}

// New returns the Reporter of eng, logging to logger (nil:
// slog.Default()); unmatched names the adapter's catch-all resource.
func New(eng *flow.Engine, logger *slog.Logger, unmatched string) *Reporter {
	if logger == nil {
		logger = slog.Default()
	}
	return &Reporter{eng: eng, logger: logger, unmatched: unmatched}
}

// Check logs each rule that cannot take effect and was not logged yet,
// unless it looked less than 10 s ago.
func (u *Reporter) Check() {
	now := time.Now().UnixNano()
	last := u.checked.Load()
	if now-last < int64(10*time.Second) || !u.checked.CompareAndSwap(last, now) {
		return
	}
	for _, r := range u.eng.Unreached() {
		key := r.Resource + "\x00" + r.Name()
		u.mu.Lock()
		seen := u.reported[key]
		if !seen {
			if u.reported == nil {
				u.reported = map[string]bool{}
			}
			u.reported[key] = true
		}
		u.mu.Unlock()
		if !seen {
			u.logger.Warn("leapflow: a rule cannot take effect: its resource has seen no request while requests went unmatched; check the names the router gives (see docs/routers.md)",
				"rule", r.Name(), "resource", r.Resource, "unmatched", u.unmatched)
		}
	}
}

// Recheck makes the next Check look, however recent the last (tests).
func (u *Reporter) Recheck() { u.checked.Store(0) }
