package global

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/callerkey"
)

// A PerKey rule's limit is one limit per caller key: its own Redis hash,
// whose hash tag holds the caller's key (escaped), so that the keys of one
// rule spread over the slots of a Redis Cluster; each expires on its own
// once idle, as every limit's data does. In this instance a caller's limit
// is a small state, kept in a bounded cache (WithMaxKeys): one lease
// slot rather than one per P, and the rule's health rather than its own, so
// that a failing Redis makes every key of the rule fall back together.
// A caller's limit leases tokens only once hot (hotCalls calls to Redis
// in one window): a cold key costs one round trip per decision, which is
// the price of a limit shared across instances for a key seen now and
// then.

// hotCalls is how many calls in one window make a caller's limit lease.
const hotCalls = 4

// keyLimitID names a caller's limit: its rule's limit in this instance and
// the caller's key ("" for requests without a key).
type keyLimitID struct {
	parent *limit
	caller string
}

func newKeyedLimits(maxKeys int) *otter.Cache[keyLimitID, *limit] {
	return otter.Must(&otter.Options[keyLimitID, *limit]{
		MaximumSize: maxKeys,
		// Maintenance on the calling goroutine: the Source starts no
		// goroutine for it, and it runs only on the path that makes a
		// caller's limit.
		Executor: func(fn func()) { fn() },
	})
}

// keyLimit returns the caller's limit of PerKey rule req, whose limit in
// this instance is parent.
func (s *Source) keyLimit(parent *limit, req *flow.GlobalRequest, caller string) *limit {
	// A caller's key is kept, and sent to Redis, at most 256 bytes long
	// (callerkey.Bound): flow allows 1024, and WithMaxKeys of them.
	caller = callerkey.Bound(caller)
	id := keyLimitID{parent: parent, caller: caller}
	if l, ok := s.keyed.GetIfPresent(id); ok {
		return l
	}
	id.caller = strings.Clone(caller) // never keep a caller's larger buffer alive
	l, _ := s.keyed.ComputeIfAbsent(id, func() (*limit, bool) {
		return s.newKeyLimit(parent, req, id.caller), false
	})
	return l
}

// callerKey is the limit key of a caller of rule key: "k", the rule key's
// length and the rule key, then "n" for requests without a key or "c:"
// and the caller's key. The length makes it one-to-one whatever bytes the
// rule's ID and the caller's key hold, and rule keys start with "id:" or
// "resource:", so no caller's limit is a rule's.
func callerKey(rule, caller string) string {
	prefix := "k" + strconv.Itoa(len(rule)) + ":" + rule
	if caller == "" {
		return prefix + "n"
	}
	return prefix + "c:" + caller
}

// callerKeys are the Redis keys of the caller's limit of PerKey rule
// req, whose limit in this instance is parent.
func (s *Source) callerKeys(parent *limit, req *flow.GlobalRequest, caller string) keys {
	shape := keySchema + "/" + strconv.FormatInt(req.Interval.Milliseconds(), 10) + "ms"
	if parent.exact {
		shape += "/log"
	} else {
		shape += "/" + strconv.Itoa(s.opts.Buckets)
	}
	return keysFor(s.opts.Prefix, callerKey(req.Key, caller), shape)
}

func (s *Source) newKeyLimit(parent *limit, req *flow.GlobalRequest, caller string) *limit {
	keys := s.callerKeys(parent, req, caller)
	l := &limit{
		keys:   keys,
		window: parent.window,
		exact:  parent.exact,
		health: s.healthFor(parent, keys.window),
		perKey: true,
		leases: make([]paddedLease, 1),
	}
	l.batch.Store(min(initialBatch, s.opts.MaxBatch))
	return l
}

// healthFor is the health a caller's limit whose hash is key shares: in a
// Redis Cluster, that of the rule's keys on the same master, so that a
// failing master fails only the keys on its slots while the others go on
// (a limit's own health would make each new key learn an outage anew);
// elsewhere, the rule's.
func (s *Source) healthFor(parent *limit, key string) *health {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return parent.health
	}
	ctx, cancel := context.WithTimeout(s.ctx, s.opts.Timeout)
	defer cancel()
	node, err := cc.MasterForKey(ctx, key) // the cluster's slots, cached
	if err != nil {
		return parent.health
	}
	h, _ := parent.nodes.LoadOrStore(node.Options().Addr, &health{})
	return h.(*health)
}

// keyedBound is the bound source of a PerKey rule.
type keyedBound struct {
	s      *Source
	parent *limit
	req    flow.GlobalRequest
	// byThreshold holds the request of each threshold of keys the rule
	// lists (float64 -> *flow.GlobalRequest).
	byThreshold sync.Map
}

// Acquire asks for a request without a key.
func (b *keyedBound) Acquire(ctx context.Context, n int64) (bool, error) {
	return b.AcquireKey(ctx, "", b.req.Threshold, n)
}

// AcquireKey implements flow.KeyedSource.
func (b *keyedBound) AcquireKey(ctx context.Context, caller string, threshold float64, n int64) (bool, error) {
	req := &b.req
	if threshold != req.Threshold {
		v, ok := b.byThreshold.Load(threshold)
		if !ok {
			r := b.req
			r.Threshold = threshold
			v, _ = b.byThreshold.LoadOrStore(threshold, &r)
		}
		req = v.(*flow.GlobalRequest)
	}
	return b.s.acquire(ctx, b.s.keyLimit(b.parent, req, caller), req, n)
}

// RetryInKey implements flow.KeyedRetryHinter.
func (b *keyedBound) RetryInKey(caller string, n int64) (time.Duration, bool) {
	l, ok := b.s.keyed.GetIfPresent(keyLimitID{parent: b.parent, caller: callerkey.Bound(caller)})
	if !ok {
		return 0, false
	}
	return b.s.retryIn(l, n)
}

// ResetKey implements flow.KeyResetter: it deletes the caller's limit in
// Redis (its window, or its log in exact mode), within the CallTimeout,
// and forgets its state in this instance (a lease it held is dropped).
// Other instances use up what they leased (at most a lease each) before
// they ask Redis again.
func (b *keyedBound) ResetKey(ctx context.Context, caller string) error {
	caller = callerkey.Bound(caller)
	b.s.keyed.Invalidate(keyLimitID{parent: b.parent, caller: caller})
	k := b.s.callerKeys(b.parent, &b.req, caller)
	ctx, cancel := context.WithTimeout(ctx, b.s.opts.CallTimeout)
	defer cancel()
	return b.s.client.Del(ctx, k.window, k.log, k.meta).Err()
}

// callCount counts a caller's limit's calls to Redis in its current window.
type callCount struct {
	window atomic.Int64 // index of the window counted
	n      atomic.Int64
}

// add counts a call at now (Source clock, ns) for a window of window µs.
func (c *callCount) add(now, window int64) {
	w := now / max(window*1000, 1)
	if c.window.Load() != w {
		c.window.Store(w)
		c.n.Store(0)
	}
	c.n.Inc()
}

// hot reports whether the limit made hotCalls calls in its window.
func (c *callCount) hot() bool { return c.n.Load() >= hotCalls }
