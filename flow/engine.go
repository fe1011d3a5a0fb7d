package flow

import (
	"fmt"
	"sync"

	"github.com/leapflow/leapflow/internal/callerkey"
	"github.com/leapflow/leapflow/internal/clocks"
	"github.com/leapflow/leapflow/internal/pins"
	"github.com/leapflow/leapflow/internal/slots"
	"github.com/leapflow/leapflow/internal/stats"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/stat"
)

// Engine checks requests against rules and records their statistics. The
// zero value is not usable: its methods panic saying so; call New. An Engine is safe for simultaneous use
// by multiple goroutines. It starts no goroutine of its own (the default
// clock is one per process), so it needs no Close; a CPU meter for system
// rules (WithCPU) is its owner's to start and close.
type Engine struct {
	// clock is what the engine reads when coarse is nil: the user's clock
	// kept from stepping back (see WithClock).
	clock stat.Clock
	// coarse is set when the clock is a *clocks.Coarse (the default): read
	// through it, the clock read inlines and takes the stripe hint the
	// request already has. Entry and Exit spell that out (a helper would
	// not inline).
	coarse   *clocks.Coarse
	registry *stats.Registry
	pins     pins.Protocol[*stats.Registry, *stats.Node, *clocks.Coarse]
	// cached and behind are coarse's words when coarse is set: Exit reads
	// the cached time without a refresh draw unless behind says it must.
	cached *atomic.Int64
	behind *atomic.Bool
	// steady is the clock when coarse is nil, read every time; with
	// coarse, the hot paths read cached and refresh it through the pins
	// protocol when behind is set or a draw masked by refreshMask is 0
	// (see pinNow).
	steady      *steady
	refreshMask uint32
	// adopting counts the nodes that hold adopted requests (see adopt):
	// while it is 0, an Exit of a request no rule counted has nothing more
	// to do.
	adopting atomic.Int64
	// generalOnly turns the short paths off (see shortPaths): a test's
	// reference engine.
	generalOnly bool
	source      TokenSource
	sampleCount int
	spanBuckets int
	sleep       sleepFunc
	slots       *slots.Slots[site]
	none        *slots.Slot[site] // a sentinel: for admissions that hold nothing
	site        site              // this engine, for its slots
	maxKeys     int
	// breakerListener is told of every breaker's changes (nil: no one).
	breakerListener func(BreakerChange)
	// cpu is the CPU reading of system rules (nil: none).
	cpu CPUMeter

	rules atomic.Pointer[ruleSet]
	mu    sync.Mutex // serialises LoadRules

	feedOnce sync.Once
	feed     *Feed
}

// New returns an Engine with no rules. It returns an error naming the option
// and value when one is invalid.
func New(opts ...Option) (*Engine, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		source:          cfg.source,
		sampleCount:     cfg.sampleCount,
		spanBuckets:     cfg.spanBuckets,
		sleep:           cfg.sleep,
		maxKeys:         cfg.maxKeys,
		breakerListener: cfg.breakerListener,
		cpu:             cfg.cpu,
	}
	e.site = site{e: e}
	e.slots = slots.New(&e.site)
	e.none = slots.Sentinel(&e.site)
	e.clock = cfg.clock
	if c, ok := cfg.clock.(*clocks.Coarse); ok {
		e.coarse = c // monotonic by construction
	} else {
		e.steady = &steady{c: cfg.clock}
		e.clock = e.steady
	}
	reg, err := stats.NewRegistry(cfg.maxResources, stats.NodeConfig{SampleCount: cfg.sampleCount}, e.clock)
	if err != nil {
		return nil, err // validated above: cannot happen
	}
	e.registry = reg
	e.pins = pins.Stat.(pins.Protocol[*stats.Registry, *stats.Node, *clocks.Coarse])
	if c := e.coarse; c != nil {
		e.cached, e.behind = e.pins.Cached(c)
		e.refreshMask = e.pins.RefreshMask
	} else {
		e.steady.origin, e.steady.mono = e.pins.Monotonic(cfg.clock)
	}
	e.rules.Store(&ruleSet{byResource: map[string]*resourceRules{}})
	return e, nil
}

// errNoEngine is the panic of a method called on a nil or zero Engine.
const errNoEngine = "flow: nil or zero Engine: make one with flow.New"

// ruleSet returns the rules in force, panicking with errNoEngine on a nil
// or zero Engine (rather than with a nil dereference somewhere inside).
func (e *Engine) ruleSet() *ruleSet {
	if e == nil {
		panic(errNoEngine)
	}
	s := e.rules.Load()
	if s == nil {
		panic(errNoEngine)
	}
	return s
}

// timeSource returns the engine's clock: the one it was given, kept from
// stepping back (see WithClock).
func (e *Engine) timeSource() stat.Clock {
	if e.coarse != nil {
		return e.coarse
	}
	return e.clock
}

// now reads the engine's clock (the hot paths spell this out: see pinNow).
func (e *Engine) now() int64 {
	if c := e.coarse; c != nil {
		return c.Now()
	}
	return e.clock.Now()
}

// Snapshot returns the statistics of resource now, and false if it has none.
func (e *Engine) Snapshot(resource string) (stat.Snapshot, bool) {
	e.ruleSet()
	n := e.registry.Lookup(resource)
	if n == nil {
		return stat.Snapshot{}, false
	}
	return n.Snapshot(e.now()), true
}

// Rules returns a copy of the rules in force, with defaults filled in:
// loading them again changes nothing.
func (e *Engine) Rules() []Rule {
	return append([]Rule(nil), e.ruleSet().rules...)
}

// LoadRules validates every rule and, only if all are valid and the
// registry has room for every resource they name, swaps them in atomically
// under live traffic. Otherwise it returns a *RuleError naming the rule,
// field and value (unwrapping to the cause, such as
// stat.ErrTooManyResources), and nothing changes: the rules in force stay,
// and no resource is created (a token source that is a Binder may have
// been asked to bind the set's global rules). Statistics live in the resources' nodes and
// survive any reload; a rule that stays the same rule (its Resource, ID,
// Metric and PerKey) keeps its counts, warm-up and queues, fitted to what
// else changed (see the package doc, "Per-key limits"). A window the new rules count in and the old ones did
// not (a span-exact rule turned on or added, a new StatInterval) starts
// with what its resource passed over its span, and what waiting requests
// borrowed, so the reload does not admit its threshold again on top; it
// errs towards strictness (whole seconds back; passes older than a
// minute are not known).
func (e *Engine) LoadRules(rules []Rule) error {
	e.ruleSet()
	e.mu.Lock()
	defer e.mu.Unlock()
	norm, err := e.normalise(rules)
	if err != nil {
		return err
	}
	bounds, err := e.bind(norm)
	if err != nil {
		return err
	}
	names := resourcesOf(norm)
	nodes, err := e.pins.Pin(e.registry, names)
	if err != nil {
		return e.noRoom(norm, err)
	}
	byName := make(map[string]*stats.Node, len(names))
	for i, name := range names {
		byName[name] = nodes[i]
	}
	old := e.rules.Load()
	next := compile(e, norm, byName, bounds, old)
	adopting := toAdopt(old, next)
	// The breakers the set does not keep retire first, and their resets
	// reach the listener before any change of the breakers in force.
	e.retireBreakers(old, next)
	e.rules.Store(next)
	e.seedWindows(old, next)
	e.adopt(adopting)
	var dropped []string
	for _, name := range resourcesOf(old.rules) {
		if byName[name] == nil {
			dropped = append(dropped, name)
		}
	}
	e.pins.Unpin(e.registry, dropped)
	return nil
}

// CheckRules validates rules as LoadRules would, without loading them or
// making any resource: it returns them as they would load (defaults filled
// in, listed keys over 256 bytes as their start and a hash), or the
// *RuleError of the first bad one. It refuses a set that names more
// resources than the registry holds (WithMaxResources); whether the
// registry has room for them beside the resources it holds now, and a
// token source's binding, are not checked.
func (e *Engine) CheckRules(rules []Rule) ([]Rule, error) {
	e.ruleSet()
	norm, err := e.normalise(rules)
	if err != nil {
		return nil, err
	}
	if n := len(resourcesOf(norm)); n > e.registry.Cap() {
		return nil, tooManyResources(n, e.registry.Cap(), stat.ErrTooManyResources)
	}
	return norm, nil
}

// tooManyResources is the error of a rule set that names n resources, more
// than the registry's cap.
func tooManyResources(n, cap int, err error) error {
	return &RuleError{Index: -1, Field: "Resource", Value: n,
		Reason: fmt.Sprintf("names %d resources, more than the engine holds (WithMaxResources %d)", n, cap), Err: err}
}

// normalise returns the rules with defaults filled in, or the first error.
func (e *Engine) normalise(rules []Rule) ([]Rule, error) {
	norm := make([]Rule, len(rules))
	paced := map[string]int{}
	globals := map[string]int{}
	gcras := map[string]int{}
	keyed := map[string][2]int{}
	windows := map[string]map[windowID]bool{}
	var keys int
	for i, r := range rules {
		r = r.withDefaults()
		if err := r.validate(i); err != nil {
			return nil, err
		}
		for k := range r.Keys { // a copy of the caller's (withDefaults)
			r.Keys[k].Key = callerkey.Bound(r.Keys[k].Key)
		}
		if err := e.checkKeyRules(i, &r, keyed, &keys); err != nil {
			return nil, err
		}
		if k := kindOf(&r); k == &windowKind || k == &warmUpKind {
			ids := windows[r.Resource]
			if ids == nil {
				ids = map[windowID]bool{}
				windows[r.Resource] = ids
			}
			if ids[windowID{r.StatInterval, r.SpanExact}] = true; len(ids) > maxWindows {
				return nil, r.errorf(i, "StatInterval", r.StatInterval, "makes %d distinct windows for resource %s, over %d", len(ids), names.Abbrev(r.Resource), maxWindows)
			}
		}
		if r.Global && e.source == nil {
			return nil, r.errorf(i, "Global", true, "needs an engine made WithTokenSource")
		}
		if (r.System == SystemCPU || r.System == SystemBBR) && e.cpu == nil {
			return nil, r.errorf(i, "System", r.System, "reads the CPU usage: it needs an engine made WithCPU")
		}
		// A resource's throttling and global rules are held on the stack
		// during Entry, so their number per resource is bounded.
		switch {
		case r.Global:
			if globals[r.Resource]++; globals[r.Resource] > maxGlobalRules {
				return nil, r.errorf(i, "Global", true, "exceeds %d global rules for resource %s", maxGlobalRules, names.Abbrev(r.Resource))
			}
		case r.PerKey:
		case r.Behavior == GCRA:
			if gcras[r.Resource]++; gcras[r.Resource] > maxGCRARules {
				return nil, r.errorf(i, "Behavior", r.Behavior, "exceeds %d GCRA rules for resource %s", maxGCRARules, names.Abbrev(r.Resource))
			}
		case r.Behavior == Throttle || r.Behavior == WarmUpThrottle:
			if paced[r.Resource]++; paced[r.Resource] > maxPacedRules {
				return nil, r.errorf(i, "Behavior", r.Behavior, "exceeds %d throttling rules for resource %s", maxPacedRules, names.Abbrev(r.Resource))
			}
		}
		norm[i] = r
	}
	return norm, nil
}

// bind resolves each global rule's limit with the token source, if it is a
// Binder. A panic in Bind refuses the rule set.
func (e *Engine) bind(rules []Rule) (bounds []BoundSource, err error) {
	b, ok := e.source.(Binder)
	if !ok {
		return make([]BoundSource, len(rules)), nil
	}
	bounds = make([]BoundSource, len(rules))
	for i := range rules {
		r := &rules[i]
		if !r.Global {
			continue
		}
		func() {
			defer func() {
				if v := recover(); v != nil {
					err = r.errorf(i, "Global", true, "was refused: the token source's Bind panicked: %v", v)
				}
			}()
			bounds[i] = b.Bind(globalRequest(r))
		}()
		if err != nil {
			return nil, err
		}
	}
	return bounds, nil
}

// noRoom names the first rule whose resource the registry lacked.
func (e *Engine) noRoom(rules []Rule, err error) error {
	if n := len(resourcesOf(rules)); n > e.registry.Cap() {
		return tooManyResources(n, e.registry.Cap(), err)
	}
	for i := range rules {
		r := &rules[i]
		for _, name := range [...]string{r.Resource, r.RelatedResource} {
			if name != "" && e.registry.Lookup(name) == nil {
				field := "Resource"
				if name != r.Resource {
					field = "RelatedResource"
				}
				return &RuleError{Rule: r.Name(), Index: i, Field: field, Value: name, Reason: "has no room in the registry", Err: err}
			}
		}
	}
	return &RuleError{Index: -1, Field: "Resource", Reason: "has no room in the registry", Err: err}
}

// resourcesOf lists the resources rules name, each once, in order.
func resourcesOf(rules []Rule) []string {
	seen := map[string]bool{}
	var names []string
	for _, r := range rules {
		for _, name := range [...]string{r.Resource, r.RelatedResource} {
			if name != "" && !seen[name] {
				seen[name] = true
				names = append(names, name)
			}
		}
	}
	return names
}

// checkKeyRules counts how many PerKey rules a rule set has per resource
// and in all, against the bounds (load time).
func (e *Engine) checkKeyRules(i int, r *Rule, perRes map[string][2]int, total *int) error {
	if !r.PerKey {
		return nil
	}
	c := perRes[r.Resource]
	if r.Global {
		// Counted with the resource's global rules; its local fallback
		// tracks keys too.
	} else if r.Metric == Concurrency {
		if c[1]++; c[1] > 1 {
			return r.errorf(i, "PerKey", true, "is a second PerKey Concurrency rule for resource %s: give one rule Keys instead", r.Resource)
		}
	} else if c[0]++; c[0] > maxKeyRules {
		return r.errorf(i, "PerKey", true, "exceeds %d PerKey QPS rules for resource %s", maxKeyRules, r.Resource)
	}
	perRes[r.Resource] = c
	if *total += r.MaxKeys; *total > e.maxKeys {
		return r.errorf(i, "MaxKeys", r.MaxKeys, "takes the rule set's keys to %d, over the engine's WithMaxKeys (%d)", *total, e.maxKeys)
	}
	return nil
}
