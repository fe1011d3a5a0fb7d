package flow

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// Option configures an Engine.
type Option func(*config)

type config struct {
	clock         stat.Clock
	maxResources  int
	sampleCount   int
	source        TokenSource
	occupyTimeout time.Duration
	sleep         func(ctx context.Context, d time.Duration) error
}

// WithClock sets the engine's clock (default stat.DefaultClock(): a shared
// 1 ms coarse clock; stat.NewMonotonic() gives nanosecond RTs at the price
// of a clock read per Entry and per Exit).
func WithClock(c stat.Clock) Option { return func(cfg *config) { cfg.clock = c } }

// WithMaxResources caps the resources the engine keeps statistics for
// (default stat.DefaultMaxResources). Entry on a new resource past the cap
// returns an error matching stat.ErrTooManyResources.
func WithMaxResources(n int) Option { return func(cfg *config) { cfg.maxResources = n } }

// WithSampleCount sets the bucket count of every resource's 1 s window
// (default stat.DefaultSampleCount).
func WithSampleCount(n int) Option { return func(cfg *config) { cfg.sampleCount = n } }

// WithTokenSource sets the source that global rules consult.
func WithTokenSource(s TokenSource) Option { return func(cfg *config) { cfg.source = s } }

// WithOccupyTimeout sets how long a priority request may wait for a future
// window (default 500 ms; 0 disables borrowing).
func WithOccupyTimeout(d time.Duration) Option { return func(cfg *config) { cfg.occupyTimeout = d } }

// WithSleep replaces how the engine waits (throttling, borrowing); tests
// pass one that moves a manual clock. It must return ctx.Err() if ctx ends
// first.
func WithSleep(fn func(ctx context.Context, d time.Duration) error) Option {
	return func(cfg *config) { cfg.sleep = fn }
}

// DefaultOccupyTimeout is how long priority requests may wait by default.
const DefaultOccupyTimeout = 500 * time.Millisecond

// Engine checks requests against rules and records their statistics. The
// zero value is not usable; call New. An Engine is safe for simultaneous use
// by multiple goroutines.
type Engine struct {
	clock stat.Clock
	// coarse is clock when it is a *stat.Coarse (the default): read
	// through it, the clock read inlines to one load instead of an
	// interface call. Entry and Exit spell that out (a helper would not
	// inline).
	coarse        *stat.Coarse
	registry      *stat.Registry
	source        TokenSource
	occupyTimeout int64
	sampleCount   int
	sleep         func(ctx context.Context, d time.Duration) error

	rules atomic.Pointer[ruleSet]
	mu    sync.Mutex // serialises LoadRules
}

// New returns an Engine with no rules. It returns an error naming the option
// and value when one is invalid.
func New(opts ...Option) (*Engine, error) {
	cfg := config{occupyTimeout: DefaultOccupyTimeout, sampleCount: stat.DefaultSampleCount, sleep: sleep}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.clock == nil {
		cfg.clock = stat.DefaultClock()
	}
	if cfg.occupyTimeout < 0 {
		return nil, fmt.Errorf("flow: occupy timeout must be >= 0, got %v", cfg.occupyTimeout)
	}
	reg, err := stat.NewRegistry(cfg.maxResources, stat.NodeConfig{SampleCount: cfg.sampleCount})
	if err != nil {
		return nil, err
	}
	e := &Engine{
		clock:         cfg.clock,
		registry:      reg,
		source:        cfg.source,
		occupyTimeout: int64(cfg.occupyTimeout),
		sampleCount:   cfg.sampleCount,
		sleep:         cfg.sleep,
	}
	e.coarse, _ = cfg.clock.(*stat.Coarse)
	e.rules.Store(&ruleSet{byResource: map[string]*resourceRules{}})
	return e, nil
}

var (
	defaultOnce   sync.Once
	defaultEngine *Engine
)

// Default returns the package's default engine, made on first use with no
// options. The package-level functions use it.
func Default() *Engine {
	defaultOnce.Do(func() {
		e, err := New()
		if err != nil {
			panic(err) // no options: cannot happen
		}
		defaultEngine = e
	})
	return defaultEngine
}

// LoadRules replaces the default engine's rules; see Engine.LoadRules.
func LoadRules(rules []Rule) error { return Default().LoadRules(rules) }

// Enter checks a request on the default engine; see Engine.Entry.
func Enter(resource string, opts ...EntryOption) (Entry, error) {
	return Default().Entry(resource, opts...)
}

// Registry returns the engine's resource statistics.
func (e *Engine) Registry() *stat.Registry { return e.registry }

// Clock returns the engine's clock.
func (e *Engine) Clock() stat.Clock { return e.clock }

// Snapshot returns the statistics of resource now, and false if it has none.
func (e *Engine) Snapshot(resource string) (stat.Snapshot, bool) {
	n := e.registry.Lookup(resource)
	if n == nil {
		return stat.Snapshot{}, false
	}
	return n.Snapshot(e.clock.Now()), true
}

// Rules returns a copy of the rules in force, with defaults filled in.
func (e *Engine) Rules() []Rule {
	return append([]Rule(nil), e.rules.Load().rules...)
}

// ruleSet is an immutable compiled rule set, swapped in whole.
type ruleSet struct {
	rules      []Rule
	byResource map[string]*resourceRules
	// states holds shaping state by rule, so a reload that keeps a rule
	// keeps its warm-up tokens and throttle timeline.
	warm   map[Rule]*warmUp
	pacers map[Rule]*pacer
	locals map[Rule]*metric.Window
}

// resourceRules is everything Entry needs for one resource with rules.
type resourceRules struct {
	// single is set when the resource's only rules are Reject QPS rules on
	// its second window: Entry then takes a short path, reading the window,
	// limit and error copied here (no further pointer to chase), first in
	// the struct so that the short path reads one cache line of it.
	single      *metric.Window
	singleLimit int64
	singleBE    *BlockError
	node        *stat.Node
	concLimit   int64 // -1: no concurrency rule
	concBE      *BlockError
	groups      []windowGroup
	countsNode  bool // a group admits on the node's second window
	paced       []pacedRule
	related     []relatedRule
	globals     []globalRule
}

// windowGroup is every Reject and WarmUp rule that counts in one window:
// they admit together, with one Admit at the smallest of their limits, so a
// pass is counted once.
type windowGroup struct {
	w          *metric.Window
	intervalS  float64
	static     int64 // smallest Reject limit; MaxInt64 if none
	staticBE   *BlockError
	borrowable bool // only Reject rules: priority requests may borrow
	warm       []warmRule
}

type warmRule struct {
	w  *warmUp
	be *BlockError
}

type pacedRule struct {
	p    *pacer
	rate float64 // Throttle
	warm *warmUp // WarmUpThrottle
	be   *BlockError
}

type relatedRule struct {
	node      *stat.Node
	threshold float64
	be        *BlockError
}

type globalRule struct {
	req        GlobalRequest
	bound      BoundSource // set when the source is a Binder
	fallback   Fallback
	local      *metric.Window
	localLimit int64
	be         *BlockError // refused globally
	beLocal    *BlockError // refused by the local fallback
}

// LoadRules validates every rule and, only if all are valid, swaps them in
// atomically under live traffic. An invalid rule returns a *RuleError naming
// the rule, field and value, and the rules in force stay unchanged.
// Statistics live in the resources' nodes and survive any reload; a rule
// loaded again unchanged keeps its warm-up and throttle state.
func (e *Engine) LoadRules(rules []Rule) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	norm := make([]Rule, len(rules))
	for i, r := range rules {
		r = r.withDefaults()
		if err := r.validate(i); err != nil {
			return err
		}
		if r.Global && e.source == nil {
			return &RuleError{Rule: r.name(), Index: i, Field: "Global", Value: true, Reason: "needs an engine made WithTokenSource"}
		}
		norm[i] = r
	}
	old := e.rules.Load()
	next := &ruleSet{
		rules:      norm,
		byResource: map[string]*resourceRules{},
		warm:       map[Rule]*warmUp{},
		pacers:     map[Rule]*pacer{},
		locals:     map[Rule]*metric.Window{},
	}
	for i := range norm {
		if err := e.compile(next, old, &norm[i], i); err != nil {
			return err
		}
	}
	for _, rr := range next.byResource {
		if len(rr.groups) == 1 && rr.countsNode && len(rr.groups[0].warm) == 0 && rr.concLimit < 0 &&
			len(rr.globals) == 0 && len(rr.related) == 0 && len(rr.paced) == 0 {
			g := &rr.groups[0]
			rr.single, rr.singleLimit, rr.singleBE = g.w, g.static, g.staticBE
		}
	}
	e.rules.Store(next)
	return nil
}

func (e *Engine) node(r *Rule, i int, resource string) (*stat.Node, error) {
	n, err := e.registry.Node(resource)
	if err != nil {
		return nil, &RuleError{Rule: r.name(), Index: i, Field: "Resource", Value: resource, Reason: "has no room in the registry: " + err.Error()}
	}
	return n, nil
}

// compile adds rule r to the set being built.
func (e *Engine) compile(next, old *ruleSet, r *Rule, i int) error {
	rr := next.byResource[r.Resource]
	if rr == nil {
		n, err := e.node(r, i, r.Resource)
		if err != nil {
			return err
		}
		rr = &resourceRules{node: n, concLimit: -1}
		next.byResource[r.Resource] = rr
	}
	switch {
	case r.Metric == Concurrency:
		limit := int64(math.Floor(r.Threshold))
		if rr.concLimit < 0 || limit < rr.concLimit {
			rr.concLimit, rr.concBE = limit, newBlockError(r, ReasonConcurrency)
		}
	case r.RelatedResource != "":
		n, err := e.node(r, i, r.RelatedResource)
		if err != nil {
			return err
		}
		rr.related = append(rr.related, relatedRule{node: n, threshold: r.Threshold, be: newBlockError(r, ReasonFlow)})
	case r.Global:
		if len(rr.globals) == maxGlobalRules {
			return &RuleError{Rule: r.name(), Index: i, Field: "Global", Value: true,
				Reason: fmt.Sprintf("exceeds %d global rules for resource %q", maxGlobalRules, r.Resource)}
		}
		local := reuse(old.locals, *r, func() *metric.Window {
			w, _ := metric.NewWindow(e.buckets(r.StatInterval), r.StatInterval) // validated: cannot fail
			return w
		})
		next.locals[*r] = local
		req := GlobalRequest{Key: r.name(), Resource: r.Resource, Threshold: r.Threshold, Interval: r.StatInterval}
		var bound BoundSource
		if b, ok := e.source.(Binder); ok {
			bound = b.Bind(req)
		}
		rr.globals = append(rr.globals, globalRule{
			req:        req,
			bound:      bound,
			fallback:   r.Fallback,
			local:      local,
			localLimit: perWindow(r.Threshold*r.LocalShare, r.StatInterval),
			be:         newBlockError(r, ReasonGlobal),
			beLocal:    newBlockError(r, ReasonFlow),
		})
	case r.Behavior == Throttle || r.Behavior == WarmUpThrottle:
		if len(rr.paced) == maxPacedRules {
			return &RuleError{Rule: r.name(), Index: i, Field: "Behavior", Value: r.Behavior,
				Reason: fmt.Sprintf("exceeds %d throttling rules for resource %q", maxPacedRules, r.Resource)}
		}
		p := reuse(old.pacers, *r, func() *pacer { return newPacer(r.MaxQueueing) })
		next.pacers[*r] = p
		pr := pacedRule{p: p, rate: r.Threshold, be: newBlockError(r, ReasonQueue)}
		if r.Behavior == WarmUpThrottle {
			pr.warm = reuse(old.warm, *r, func() *warmUp { return newWarmUp(r) })
			next.warm[*r] = pr.warm
		}
		rr.paced = append(rr.paced, pr)
	default: // Reject or WarmUp, counted in a window
		w, err := e.window(rr.node, r.StatInterval)
		if err != nil {
			return &RuleError{Rule: r.name(), Index: i, Field: "StatInterval", Value: r.StatInterval, Reason: err.Error()}
		}
		g := rr.group(w, r.StatInterval)
		if w == rr.node.Second() {
			rr.countsNode = true
		}
		if r.Behavior == WarmUp {
			wu := reuse(old.warm, *r, func() *warmUp { return newWarmUp(r) })
			next.warm[*r] = wu
			g.warm = append(g.warm, warmRule{w: wu, be: newBlockError(r, ReasonFlow)})
			g.borrowable = false
		} else if limit := perWindow(r.Threshold, r.StatInterval); limit < g.static {
			g.static, g.staticBE = limit, newBlockError(r, ReasonFlow)
		}
	}
	return nil
}

// window returns the node window a rule with this interval counts in.
func (e *Engine) window(n *stat.Node, interval time.Duration) (*metric.Window, error) {
	if interval == time.Second {
		return n.Second(), nil
	}
	return n.Window(interval, e.buckets(interval))
}

// buckets is the bucket count for a window of interval: the engine's sample
// count if it divides the interval, else 1.
func (e *Engine) buckets(interval time.Duration) int {
	if int64(interval)%int64(e.sampleCount) != 0 {
		return 1
	}
	return e.sampleCount
}

// A resource's throttling and global rules are held on the stack during
// Entry, so their number per resource is bounded.
const (
	maxPacedRules  = 4
	maxGlobalRules = 4
)

// group returns the group of window w, adding one if needed; the node's
// second window goes first.
func (rr *resourceRules) group(w *metric.Window, interval time.Duration) *windowGroup {
	for i := range rr.groups {
		if rr.groups[i].w == w {
			return &rr.groups[i]
		}
	}
	rr.groups = append(rr.groups, windowGroup{w: w, intervalS: interval.Seconds(), static: math.MaxInt64, borrowable: true})
	return &rr.groups[len(rr.groups)-1]
}

// perWindow is a per-second threshold as a count per window of interval.
func perWindow(threshold float64, interval time.Duration) int64 {
	return int64(math.Floor(threshold * interval.Seconds()))
}

func reuse[V any](old map[Rule]V, r Rule, make func() V) V {
	if v, ok := old[r]; ok {
		return v
	}
	return make()
}

// sleep is the default wait: a timer, cut short by ctx.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// errBadCount is returned for a non-positive count.
var errBadCount = errors.New("flow: count must be >= 1")
