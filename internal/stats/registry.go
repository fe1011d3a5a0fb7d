package stats

import (
	"fmt"
	"math"
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/clocks"
	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/internal/pins"
	"github.com/leapflow/leapflow/stat"
)

// DefaultMaxResources is the cap of a Registry made with max 0.
const DefaultMaxResources = 10000

// checkName returns an error matching stat.ErrInvalidName if name is empty or
// longer than stat.MaxNameLen, and nil otherwise.
func checkName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: must not be empty", stat.ErrInvalidName)
	case len(name) > stat.MaxNameLen:
		return fmt.Errorf("%w: %d bytes, more than %d (%s)", stat.ErrInvalidName, len(name), stat.MaxNameLen, names.Abbrev(name))
	}
	return nil
}

// reclaimEvery is how often, at most, a full Registry walks its nodes for
// idle ones to let go: the walk is linear, and a full registry of busy
// resources must not turn every refused name into one.
const reclaimEvery = int64(time.Second)

// Registry maps resource names to Nodes. It holds at most a cap of them, so
// an unbounded, user-supplied key space cannot exhaust memory: at the cap
// it lets go of resources that are not pinned (flow pins those its rules
// name) and have been idle for a minute (nothing in flight, no event in the
// last 60 s: nothing is lost), and refuses new ones only if none is. A
// writer holding a node that was let go sees Node.Dropped and moves to the
// resource's current node. It is safe for simultaneous use.
type Registry struct {
	nodes       sync.Map // string -> *Node
	count       atomic.Int64
	max         int64
	cfg         NodeConfig
	clock       stat.Clock
	mu          sync.Mutex // serialises creation, pinning and reclaiming
	lastReclaim int64      // guarded by mu
	errFull     error      // built once: refusals allocate nothing
	// feeding is set by the first call of Seconds: nodes made from then
	// on keep their seconds from the start; fedTo is where the latest
	// call stood.
	feeding atomic.Bool
	fedTo   atomic.Int64
}

// NewRegistry returns a Registry holding at most max resources (0 means
// DefaultMaxResources), each with windows shaped by cfg; clock (nil: the
// DefaultClock) times idleness. It returns an error naming the field and
// value when one is invalid.
func NewRegistry(max int, cfg NodeConfig, clock stat.Clock) (*Registry, error) {
	if max < 0 {
		return nil, fmt.Errorf("stat: max resources must be >= 0, got %d", max)
	}
	if max == 0 {
		max = DefaultMaxResources
	}
	if clock == nil {
		clock = stat.DefaultClock()
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Registry{
		max:         int64(max),
		cfg:         cfg,
		clock:       clock,
		lastReclaim: -reclaimEvery,
		errFull:     fmt.Errorf("%w (cap %d)", stat.ErrTooManyResources, max),
	}, nil
}

// Lookup returns the node of resource, or nil if it has none.
func (r *Registry) Lookup(resource string) *Node {
	if v, ok := r.nodes.Load(resource); ok {
		return v.(*Node)
	}
	return nil
}

// Node returns the node of resource, creating it if needed. It returns an
// error matching stat.ErrInvalidName for a bad name and one matching
// stat.ErrTooManyResources past the cap.
func (r *Registry) Node(resource string) (*Node, error) {
	if n := r.Lookup(resource); n != nil {
		return n, nil
	}
	if err := checkName(resource); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.Lookup(resource); n != nil {
		return n, nil
	}
	if !r.room(1) {
		return nil, r.errFull
	}
	return r.create(resource), nil
}

// pin returns the nodes of resources, creating those missing, and pins
// them all, so that the registry never lets them go; or, if the cap leaves
// no room for the missing ones, it changes nothing and returns an error
// matching stat.ErrTooManyResources (or stat.ErrInvalidName). It is flow's, which
// keeps the pins in step with its rules (through internal/pins).
func (r *Registry) pin(resources []string) ([]*Node, error) {
	for _, name := range resources {
		if err := checkName(name); err != nil {
			return nil, err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Pin what exists first, so that making room does not drop it.
	var pinned []*Node
	missing := map[string]bool{}
	for _, name := range resources {
		if n := r.Lookup(name); n == nil {
			missing[name] = true
		} else if !n.pinned {
			n.pinned = true
			pinned = append(pinned, n)
		}
	}
	if !r.room(int64(len(missing))) {
		for _, n := range pinned {
			n.pinned = false
		}
		return nil, r.errFull
	}
	nodes := make([]*Node, len(resources))
	for i, name := range resources {
		n := r.Lookup(name)
		if n == nil {
			n = r.create(name)
		}
		n.pinned = true
		nodes[i] = n
	}
	return nodes, nil
}

// replace returns the node that stands for dropped's resource now,
// creating it if needed, past the cap if it must: the drop freed the room
// (so the cap can be passed by the few resources that were dropped while a
// request was counting on them). It is flow's, for those requests.
func (r *Registry) replace(dropped *Node) *Node {
	if n := r.Lookup(dropped.resource); n != nil {
		return n
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.Lookup(dropped.resource); n != nil {
		return n
	}
	return r.create(dropped.resource)
}

// unpin lets the registry drop the nodes of resources again once idle. It
// is flow's.
func (r *Registry) unpin(resources []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, name := range resources {
		if n := r.Lookup(name); n != nil {
			n.pinned = false
		}
	}
}

// create makes and stores the node of resource. Called with mu held.
func (r *Registry) create(resource string) *Node {
	n := newNode(resource, r.cfg) // cfg was validated: cannot fail
	n.created = r.clock.Now()
	if r.feeding.Load() {
		// A feed runs: every count of the node is new (a request recounted
		// here after its node was let go may be from an earlier second,
		// which then goes out with the next one).
		n.feed.started = true
		n.feed.since = math.MinInt64
		n.feed.fed = r.fedTo.Load()
	}
	r.nodes.Store(resource, n)
	r.count.Inc()
	return n
}

// room reports whether k more nodes fit, letting idle ones go if needed.
// Called with mu held.
func (r *Registry) room(k int64) bool {
	if r.count.Load()+k <= r.max {
		return true
	}
	now := r.clock.Now()
	if now-r.lastReclaim < reclaimEvery {
		return false
	}
	r.lastReclaim = now
	r.nodes.Range(func(_, v any) bool {
		if n := v.(*Node); !n.pinned && n.idle(now) {
			// Mark first, then look again: a writer checks the mark after
			// counting (every access here is sequentially consistent), so
			// one that counted before the mark is seen by the second look,
			// and one that counted after it waits for the decision and, if
			// the node goes, counts again on a new one.
			n.state.Store(nodeDropping)
			if !n.idle(now) {
				n.state.Store(nodeLive)
				return true
			}
			r.nodes.Delete(n.resource)
			r.count.Dec()
			n.state.Store(nodeDropped)
		}
		return true
	})
	return r.count.Load()+k <= r.max
}

// Len returns the number of resources.
func (r *Registry) Len() int { return int(r.count.Load()) }

// Cap returns the maximum number of resources.
func (r *Registry) Cap() int { return int(r.max) }

// Seconds hands fn every second that completed by now on any node of the
// registry and was not handed out before (by time: nothing waits for the
// next write); with partial, it also hands out the seconds since then, the
// current one marked Partial (for a final delivery: the seconds it hands
// out early are not handed out again). A node's seconds are kept from its
// first call on: the first call starts the feed (it hands out nothing
// whole before the next second), and at most 64 seconds are kept between
// calls. A second completes a window (1 s) after it ends, when every
// bucket of it has left the second window. Seconds in which a resource counted nothing are skipped.
// Counts that reach a second after it was handed out (a pass taken back
// late, a write from a goroutine that read the clock long before) go out
// with the next second handed out of that resource: every count is handed
// out once. One caller at a time: flow.Feed is the one.
func (r *Registry) Seconds(now int64, partial bool, fn func(stat.Second)) {
	r.feeding.Store(true)
	if hi := now - second - (now-second)%second; hi > r.fedTo.Load() {
		r.fedTo.Store(hi)
	}
	r.nodes.Range(func(_, v any) bool {
		v.(*Node).deliver(now, partial, fn)
		return true
	})
}

// Recent hands fn, for every node, the seconds of the last minute that
// Seconds handed out already (or, on a node whose feed started with the
// latest call, that came before it), from the node's minute window: with
// what Seconds hands out from then on, every second of the last minute
// once. One caller at a time, and not during Seconds (flow.Feed holds its
// delivery lock).
func (r *Registry) Recent(fn func(stat.Second)) {
	r.nodes.Range(func(_, v any) bool {
		v.(*Node).recent(fn)
		return true
	})
}

// Range calls fn for each node until fn returns false.
func (r *Registry) Range(fn func(n *Node) bool) {
	r.nodes.Range(func(_, v any) bool { return fn(v.(*Node)) })
}

func init() {
	pins.Stat = pins.Protocol[*Registry, *Node, *clocks.Coarse]{
		Pin: (*Registry).pin, Unpin: (*Registry).unpin, Replace: (*Registry).replace,
		Adopt: (*Node).adopt, ReleaseAdopted: (*Node).releaseAdopted,
		Cached:  (*clocks.Coarse).Words,
		Refresh: (*clocks.Coarse).Refresh, RefreshMask: clocks.RefreshEvery - 1,
		Monotonic: func(c any) (time.Time, bool) {
			m, ok := c.(clocks.Monotonic)
			return m.Origin, ok
		},
	}
}
