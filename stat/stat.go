package stat

import (
	"errors"
	"time"
)

// ErrTooManyResources is the error (wrapped with the cap) returned for a new
// resource once an engine holds its maximum (flow.WithMaxResources) and none
// can be let go.
var ErrTooManyResources = errors.New("stat: too many resources")

// ErrInvalidName is the error (wrapped with the reason) returned for a
// resource name that is empty or longer than MaxNameLen.
var ErrInvalidName = errors.New("stat: invalid resource name")

// MaxNameLen is the longest resource name, in bytes: names end up in error
// messages, logs and metric labels, which must stay bounded.
const MaxNameLen = 1024

// Snapshot is every statistic of a node at one instant. The *QPS fields
// and AvgRT and MinRT are sliding: they cover the second
// window's buckets valid at the instant (the last second, in buckets of
// 250 ms by default), so they move as buckets come and go, up and down
// under steady load when requests are few. For steady per-second figures,
// read completed seconds (flow.Feed), each whole.
type Snapshot struct {
	Resource string
	// Per second, over the sliding last second.
	PassQPS, BlockQPS, SuccessQPS, ExceptionQPS, OccupiedQPS float64
	// Over the sliding last second (0 when nothing completed).
	AvgRT, MinRT  time.Duration
	Inflight      int64 // admitted and not exited, now
	PrevPass      int64 // the previous whole second
	PrevBlock     int64
	MinutePass    int64 // the last 60 seconds
	MinuteBlock   int64
	MinuteSuccess int64
	MinuteErrors  int64
	Fallbacks     int64 // decided by a global rule's fallback, ever
	Keyless       int64 // checked by a per-key rule without a key, ever
	KeyEvictions  int64 // keys evicted by a per-key rule while active, ever
	// KeysForgotten counts evicted keys a per-key rule forgot while their
	// window still mattered, to remember others: more were evicted within
	// a window than it remembers (4 x MaxKeys fit), and such a key, seen
	// again in that window, starts afresh. Ever.
	KeysForgotten int64
}

// Second is what one resource counted in one second of the engine clock:
// its completed seconds are read through flow.Feed, each once.
type Second struct {
	Resource string
	// Start is the engine clock's reading at the second's start (a whole
	// second); Time is the wall-clock time a Feed maps it to.
	Start int64
	Time  time.Time
	// Pass, Block, Success and Exception count requests; Occupied the
	// passes admitted against a future window (priority borrowing); RT is
	// the sum of the completed requests' response times and MinRT the
	// smallest (0 when none completed).
	Pass, Block, Success, Exception, Occupied int64
	RT, MinRT                                 time.Duration
	// MaxConcurrency is the most requests in flight a Concurrency rule
	// counted in the second (0 for a resource without one: in-flight is
	// not counted per request otherwise).
	MaxConcurrency int64
	// Fallbacks counts requests global rules decided by their fallback
	// since the node's previous delivery (they are counted when they
	// happen, not by second): requests their source failed on. A request
	// that a window rule's local share refuses without asking the source
	// (once the source answers again, within a window of the rule's last
	// fallback, its share spent) is not one.
	Fallbacks int64
	// Partial marks the second still running when a feed closed.
	Partial bool
}
