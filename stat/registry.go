package stat

import (
	"errors"
	"fmt"
	"sync"

	"go.uber.org/atomic"
)

// ErrTooManyResources is the error (wrapped with the cap) returned for a new
// resource once a Registry holds its maximum.
var ErrTooManyResources = errors.New("stat: too many resources")

// DefaultMaxResources is the cap of a Registry made with max 0.
const DefaultMaxResources = 10000

// Registry maps resource names to Nodes. Past its cap it refuses new
// resources, so an unbounded, user-supplied key space cannot exhaust memory.
// It is safe for simultaneous use.
type Registry struct {
	nodes   sync.Map // string -> *Node
	count   atomic.Int64
	max     int64
	cfg     NodeConfig
	mu      sync.Mutex // serialises creation, so no node is built twice
	errFull error      // built once: refusals allocate nothing
}

// NewRegistry returns a Registry holding at most max resources (0 means
// DefaultMaxResources), each with windows shaped by cfg. It returns an error
// naming the field and value when either is invalid.
func NewRegistry(max int, cfg NodeConfig) (*Registry, error) {
	if max < 0 {
		return nil, fmt.Errorf("stat: max resources must be >= 0, got %d", max)
	}
	if max == 0 {
		max = DefaultMaxResources
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Registry{
		max:     int64(max),
		cfg:     cfg,
		errFull: fmt.Errorf("%w (cap %d)", ErrTooManyResources, max),
	}, nil
}

// Lookup returns the node of resource, or nil if it has none.
func (r *Registry) Lookup(resource string) *Node {
	if v, ok := r.nodes.Load(resource); ok {
		return v.(*Node)
	}
	return nil
}

// Node returns the node of resource, creating it if needed. Past the cap it
// returns an error that matches ErrTooManyResources.
func (r *Registry) Node(resource string) (*Node, error) {
	if n := r.Lookup(resource); n != nil {
		return n, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if n := r.Lookup(resource); n != nil {
		return n, nil
	}
	if r.count.Load() >= r.max {
		return nil, r.errFull
	}
	n, err := newNode(resource, r.cfg)
	if err != nil {
		return nil, err
	}
	r.nodes.Store(resource, n)
	r.count.Inc()
	return n, nil
}

// Len returns the number of resources.
func (r *Registry) Len() int { return int(r.count.Load()) }

// Cap returns the maximum number of resources.
func (r *Registry) Cap() int { return int(r.max) }

// Range calls fn for each node until fn returns false.
func (r *Registry) Range(fn func(n *Node) bool) {
	r.nodes.Range(func(_, v any) bool { return fn(v.(*Node)) })
}
