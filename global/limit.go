package global

// A limit: its state in this instance and the layout of its keys.

import (
	"math"
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
)

// keySchema versions the layout of a limit's keys. Instances on different
// versions count in different keys: during a rolling upgrade that changes
// it, each side enforces the full limit on its own (up to twice it in all)
// until the upgrade completes.
const keySchema = "v2"

// serverStep is the smallest step back of the server clock that a limit's
// time absorbs (µs; see scriptTime).
const serverStep = 100_000

// limitID identifies a limit and the layout of its keys; the threshold is
// an argument of each call.
type limitID struct {
	key      string
	interval time.Duration
	exact    bool
	span     bool // span-exact (a window of one bucket more); never with exact
}

// limit is the state of one limit in this instance: its keys, its leases
// and its calls.
type limit struct {
	keys   keys
	window int64 // µs
	exact  bool
	// span is set for a span-exact rule's limit: the script counts
	// Buckets+1 buckets of window/Buckets.
	span bool
	// leases holds one lease per stripe (P): admissions from a lease
	// touch only their own P's cache line.
	leases []paddedLease
	mask   int
	// cur is the limit's newest call: in flight, gathering requests for
	// when the one in flight ends, or done (see flight).
	cur      atomic.Pointer[flight]
	inFlight atomic.Int64
	// batch is the lease size asked for next.
	batch atomic.Int64
	// backMu guards back and reserves, touched only by calls: tokens of
	// leases replaced before they expired, and calls whose requests may
	// not have claimed all they asked for, to give back with the next
	// call.
	backMu   sync.Mutex
	back     []giveBack
	reserves []*flight
	// closed is when the window, full at the last refusal, first has room
	// again for a request of need (the Source's clock): such requests
	// before then are refused without a round trip.
	closed atomic.Pointer[closedWindow]
	// binds counts the live bound sources of l (see Bind); bound is set
	// once it has had one.
	binds atomic.Int64
	bound atomic.Bool
	// present is set while this instance's presence is in the hash
	// (guarded by the Source's renewMu).
	present bool
	// share is what this instance admits per window on its own while it
	// falls back (FallbackLocal): its presence is kept while it is > 0.
	share atomic.Int64
	// health is the limit's own, or for a caller's limit of a PerKey
	// rule, the rule's (shared by its keys).
	*health
	// perKey is set on a caller's limit of a PerKey rule: it leases only
	// once hot (see perkey.go).
	perKey bool
	calls  callCount
	// nodes holds, for a PerKey rule's limit in a Redis Cluster, the
	// health of its keys on each master (address -> *health).
	nodes sync.Map
	// fellBack is set when a request of this limit got an error (its
	// rule's fallback applied) and cleared by the limit's next renewal of
	// presence, which then keeps this instance's share from the others
	// for a window. It is per limit: a failing limit must not take the
	// shares of healthy ones.
	fellBack atomic.Bool
	// carried is what this instance's fallback admitted on its own, for
	// the next calls to count on Redis; counting is set once it has been
	// told of one (its rule's engine is a flow.LocalCounter's user).
	carried  *carried
	counting atomic.Bool
}

// closedWindow is a full window: requests of need or more are refused
// until until.
type closedWindow struct{ until, need int64 }

// full reports whether a request for n is refused without a round trip.
func (l *limit) full(now, n int64) bool {
	c := l.closed.Load()
	return c != nil && now < c.until && n >= c.need
}

// hash is the key of the limit's hash that holds presence.
func (l *limit) hash() string {
	if l.exact {
		return l.keys.meta
	}
	return l.keys.window
}

// giveBackLater queues g for the next call.
func (l *limit) giveBackLater(g giveBack) {
	l.backMu.Lock()
	l.back = append(l.back, g)
	l.backMu.Unlock()
}

// initialBatch is the first lease size of a limit. It starts small, so
// that instances that see little of the traffic lease little (with 16
// instances and one hot, a first lease of 100 kept an eighth of the window
// away from the others); a busy instance doubles it with every top-up
// within a bucket.
const initialBatch = 4

// perWindow is a rule's threshold as admissions per window.
func perWindow(req flow.GlobalRequest) int64 {
	return int64(math.Floor(req.Threshold * req.Interval.Seconds()))
}
