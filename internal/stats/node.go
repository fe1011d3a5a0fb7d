package stats

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/metric"
	"github.com/leapflow/leapflow/stat"
)

// NodeConfig shapes the windows of every Node of a Registry.
type NodeConfig struct {
	// SampleCount is the number of buckets of the 1 s window (default 4).
	// It must divide one second into whole nanoseconds.
	SampleCount int
}

// DefaultSampleCount is the bucket count of a Node's second window when
// NodeConfig leaves it zero (see the package doc for the trade-off).
const DefaultSampleCount = 4

func (c NodeConfig) withDefaults() NodeConfig {
	if c.SampleCount == 0 {
		c.SampleCount = DefaultSampleCount
	}
	return c
}

func (c NodeConfig) validate() error {
	if c.SampleCount < 1 || int64(time.Second)%int64(c.SampleCount) != 0 {
		return fmt.Errorf("stat: SampleCount must divide 1s into whole nanoseconds, got %d", c.SampleCount)
	}
	return nil
}

const (
	second = int64(time.Second)
	minute = 60 * second
)

// Node holds the statistics of one resource. It is safe for simultaneous use
// and must not be copied.
type Node struct {
	resource string
	second   *window.Window
	minute   *window.Window

	// Totals of every bucket the second window has retired, for the
	// in-flight figure; written by its hand-over (see window.WithHandover).
	retiredPass    atomic.Int64
	retiredSuccess atomic.Int64
	retiredBlock   atomic.Int64
	// allowed counts, by stripe, the requests Allow admitted: they never
	// exit, so the in-flight figure takes them off as it does completions.
	// Made on the first (most resources never see Allow).
	allowed atomic.Pointer[[]paddedCount]

	// concurrency is the exact in-flight count of requests admitted by
	// concurrency rules; unlike Inflight it is one shared word, because
	// admission against it must be a single atomic step.
	_           [cpu.CacheLine]byte
	concurrency atomic.Int64
	// adopted is the part of concurrency that counts requests no rule
	// counted at admission: in flight when a Concurrency rule was loaded
	// (see adopt). Their Exits end it.
	adopted atomic.Int64
	// adopting is set while adopt counts.
	adopting atomic.Bool
	_        [cpu.CacheLine - 20]byte

	// fallbacks counts requests a global rule decided locally because its
	// token source failed.
	fallbacks atomic.Int64
	// keyless counts requests without a key checked by a per-key rule;
	// keyEvictions counts keys a per-key rule evicted from its table
	// while their window still held admissions.
	// keysForgotten counts evicted keys a per-key rule forgot while their
	// window still held admissions.
	keyless, keyEvictions, keysForgotten atomic.Int64

	mu      sync.Mutex // guards adding to windows; reads go through the pointer
	windows atomic.Pointer[map[windowShape]*window.Window]

	// feedMu guards feed, and orders hand-overs into the minute window
	// against deliveries of completed seconds (see handOver).
	feedMu sync.Mutex
	feed   secondFeed

	// pinned is set while a rule names the resource (guarded by the
	// registry's mu); state says whether the registry let the node go.
	pinned bool
	state  atomic.Int32
	// created is the registry clock's reading when the node was made.
	created int64
}

// The states of a node.
const (
	nodeLive     = iota
	nodeDropping // the registry is deciding, under its lock
	nodeDropped
)

// Dropped reports whether the registry let the node go to make room (see
// Registry). A writer calls it after counting on the node: if it reports
// true, the count went to a node no one reads, and the writer counts again
// on the resource's current node. While the registry is deciding (a
// few reads under its lock), Dropped waits for the decision.
func (n *Node) Dropped() bool {
	if n.state.Load() == nodeLive {
		return false // the common case, inlined into the writer
	}
	return n.deciding()
}

// deciding is Dropped once the node is not live: it waits out a decision.
func (n *Node) deciding() bool {
	for {
		switch n.state.Load() {
		case nodeLive:
			return false
		case nodeDropped:
			return true
		}
		runtime.Gosched()
	}
}

// idle reports whether the node holds nothing a drop would lose: it is a
// minute old or more, with nothing in flight, nothing borrowed, and no
// event in the last minute.
func (n *Node) idle(now int64) bool {
	if now-n.created < minute || n.Concurrency() != 0 || n.Inflight() != 0 || n.second.Borrowed() != 0 {
		return false
	}
	for _, e := range [...]metric.Event{metric.Pass, metric.Block, metric.Success, metric.Exception, metric.OccupiedPass} {
		if n.Minute(now, e) != 0 {
			return false
		}
	}
	return true
}

// newNode makes the node of resource; cfg must be valid.
func newNode(resource string, cfg NodeConfig) *Node {
	n := &Node{resource: resource, feed: secondFeed{late: window.Counts{MinRT: -1}, lastEmitted: math.MinInt64}}
	// Written only by the second window's retirements: no striping needed.
	mins, err := window.NewWindow(60, time.Minute, window.WithStripes(1))
	if err != nil {
		panic(err)
	}
	// Retirements run one at a time, corrections at any time: Absorb and
	// the totals are atomic adds, safe for both.
	sec, err := window.NewWindow(cfg.SampleCount, time.Second, window.WithHandover(n.handOver))
	if err != nil {
		panic(err) // cfg was validated
	}
	n.second, n.minute = sec, mins
	n.windows.Store(&map[windowShape]*window.Window{})
	return n
}

// NewNode returns a standalone Node (engines make theirs through a
// Registry).
func NewNode(resource string, cfg NodeConfig) (*Node, error) {
	if err := checkName(resource); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return newNode(resource, cfg), nil
}

// Resource returns the resource name.
func (n *Node) Resource() string { return n.resource }

// stat.Second returns the 1 s window: rules on the default interval admit
// against it, and every request of the resource is counted in it.
func (n *Node) Second() *window.Window { return n.second }

// Inflight returns how many requests are in flight: every pass ever counted
// minus every completion. It costs requests nothing (both totals are kept
// anyway) and a walk over the second window to read. A read racing a
// rotation may be off for that instant; the totals themselves are exact (the
// hand-over of retiring buckets loses and repeats nothing).
func (n *Node) Inflight() int64 {
	pass := n.second.SumRange(math.MinInt64, math.MaxInt64, metric.Pass) + n.retiredPass.Load()
	done := n.second.SumRange(math.MinInt64, math.MaxInt64, metric.Success) + n.retiredSuccess.Load() + n.allowedTotal()
	return max(0, pass-done)
}

// paddedCount is a counter alone on its cache line.
type paddedCount struct {
	n atomic.Int64
	_ [cpu.CacheLine - 8]byte
}

// AddAllowed counts k requests that Allow admitted (their passes counted
// already) as ended without a completion, on the stripe hinted by p: the
// in-flight figure no longer counts them, and no Success or RT is
// counted. The stripes cost a resource nothing until its first.
func (n *Node) AddAllowed(p int, k int64) {
	s := n.allowed.Load()
	if s == nil {
		made := make([]paddedCount, cpu.Stripes())
		if !n.allowed.CompareAndSwap(nil, &made) {
			s = n.allowed.Load()
		} else {
			s = &made
		}
	}
	(*s)[p&(len(*s)-1)].n.Add(k)
}

// allowedTotal is every request AddAllowed counted.
func (n *Node) allowedTotal() int64 {
	s := n.allowed.Load()
	if s == nil {
		return 0
	}
	var t int64
	for i := range *s {
		t += (*s)[i].n.Load()
	}
	return t
}

// Concurrency returns the exact in-flight count that concurrency rules
// admit against.
func (n *Node) Concurrency() int64 { return n.concurrency.Load() }

// AcquireConcurrency counts n more requests in flight if that keeps the
// count at or below limit, in one atomic step; otherwise it reports false
// and the count it saw.
func (n *Node) AcquireConcurrency(k, limit int64) (seen int64, ok bool) {
	for {
		cur := n.concurrency.Load()
		if cur+k > limit {
			return cur, false
		}
		if n.concurrency.CompareAndSwap(cur, cur+k) {
			return cur + k, true
		}
		// Another request moved the count; check again.
	}
}

// ReleaseConcurrency ends n requests that AcquireConcurrency counted.
func (n *Node) ReleaseConcurrency(k int64) { n.concurrency.Sub(k) }

// ReleaseGivenBack ends k requests that AcquireConcurrency counted and
// that gave their passes back instead of completing (a later rule refused
// them, or their wait was cancelled); the caller gives the passes back
// first. A pass given back is no completion adopt could read after the
// concurrency: if adopt read the pass, the concurrency must still count
// it when adopt reads that, so an adopt under way is waited out (as in
// releaseAdopted; adopt is flagged before it reads the passes).
func (n *Node) ReleaseGivenBack(k int64) {
	if n.adopting.Load() {
		n.second.Locked(func() {})
	}
	n.concurrency.Sub(k)
}

// adopt counts in the node's concurrency, as adopted, the requests in
// flight that it does not count: Inflight minus Concurrency, read while no
// bucket of the second window rotates (the totals are exact then). It is
// flow's, for a rule set that adds a Concurrency rule: the requests its
// resource admitted without one count against it until they exit. Every
// writer moves the figures in an order that makes the difference err low
// (a Concurrency rule's admission counts its concurrency before its pass;
// an Exit counts its completion before it ends its concurrency), and adopt
// reads them in the order that relies on it: the passes, then the
// concurrency, then the completions. A pass it reads was counted after its
// concurrency, so the concurrency read next still counts it unless it
// ended, and then its completion, read last, is seen. (Completions read
// before the concurrency would miss an Exit made in between, whose pass
// was read and whose concurrency was not: adopted for good, with no Exit
// left to end it.) So adopt never counts a request twice; it may miss one
// that was being admitted under the old rules, or exiting, at that
// instant.
func (n *Node) adopt() (added int64, first bool) {
	// Flagged first, so that an Exit that finds nothing adopted while the
	// count is being made waits for it (see releaseAdopted).
	n.adopting.Store(true)
	defer n.adopting.Store(false)
	n.second.Locked(func() {
		pass := n.second.SumRange(math.MinInt64, math.MaxInt64, metric.Pass) + n.retiredPass.Load()
		conc := n.concurrency.Load()
		done := n.second.SumRange(math.MinInt64, math.MaxInt64, metric.Success) + n.retiredSuccess.Load() + n.allowedTotal()
		added = pass - conc - done
		if added <= 0 {
			added = 0
			return
		}
		// The concurrency first: a release of adopted requests never
		// takes what is not counted yet.
		n.concurrency.Add(added)
		first = n.adopted.Add(added) == added
	})
	return added, first
}

// releaseAdopted ends up to k adopted requests: those an Exit of a request
// no rule counted finds, or a request that gives its pass back. It reports
// whether that ended the last. An Exit that finds none while adopt is
// counting waits for the count (adopt holds the rotation lock throughout),
// then looks again: the count may hold it.
func (n *Node) releaseAdopted(k int64) (drained bool) {
	counting := n.adopting.Load()
	for {
		a := n.adopted.Load()
		if a <= 0 {
			if !counting {
				return false
			}
			n.second.Locked(func() {})
			counting = false
			continue
		}
		d := min(a, k)
		if n.adopted.CompareAndSwap(a, a-d) {
			n.concurrency.Sub(d)
			return a == d
		}
	}
}

// windowShape names one of a node's extra windows: rules whose windows
// have the same interval and bucket count share it.
type windowShape struct {
	interval time.Duration
	buckets  int
}

// Window returns the window of the given interval and bucket count used by
// rules with a stat interval other than 1 s, or span-exact rules, creating
// it the first time. Windows live as long as the node, so rule reloads
// keep their counts.
func (n *Node) Window(interval time.Duration, sampleCount int) (*window.Window, error) {
	k := windowShape{interval, sampleCount}
	if w, ok := (*n.windows.Load())[k]; ok {
		return w, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	old := *n.windows.Load()
	if w, ok := old[k]; ok {
		return w, nil
	}
	w, err := window.NewWindow(sampleCount, interval)
	if err != nil {
		return nil, err
	}
	// Copy on write: readers take no lock.
	next := make(map[windowShape]*window.Window, len(old)+1)
	for s, v := range old {
		next[s] = v
	}
	next[k] = w
	n.windows.Store(&next)
	return w, nil
}

// AddFallback counts a request that a global rule decided by its fallback.
func (n *Node) AddFallback() { n.fallbacks.Inc() }

// Fallbacks returns how many requests global rules decided by their
// fallback since the node was made.
func (n *Node) Fallbacks() int64 { return n.fallbacks.Load() }

// AddKeyless counts a request without a key that a per-key rule limited
// under its shared no-key entry.
func (n *Node) AddKeyless() { n.keyless.Inc() }

// Keyless returns how many requests without a key per-key rules checked
// since the node was made.
func (n *Node) Keyless() int64 { return n.keyless.Load() }

// AddKeyEviction counts a key evicted from a per-key rule's table while
// its window still held admissions.
func (n *Node) AddKeyEviction() { n.keyEvictions.Inc() }

// KeyEvictions returns how many keys per-key rules evicted while active
// since the node was made.
func (n *Node) KeyEvictions() int64 { return n.keyEvictions.Load() }

// AddKeyForgotten counts an evicted key a per-key rule forgot while its
// window still held admissions.
func (n *Node) AddKeyForgotten() { n.keysForgotten.Inc() }

// Rate returns event e per second over the last second.
func (n *Node) Rate(now int64, e metric.Event) float64 { return n.second.Rate(now, e) }

// AvgRT returns the mean response time over the last second (0 if none).
func (n *Node) AvgRT(now int64) time.Duration { return time.Duration(n.second.AvgRT(now)) }

// MinRT returns the smallest response time over the last second (0 if none).
func (n *Node) MinRT(now int64) time.Duration {
	v, _ := n.second.MinRT(now)
	return time.Duration(v)
}

// PreviousSecond returns event e's count in the whole second before the one
// holding now.
func (n *Node) PreviousSecond(now int64, e metric.Event) int64 {
	now = n.second.Clamp(now)
	hi := now - now%second
	return n.span(hi-second, hi, e)
}

// Counted returns every request the node counted, passed or blocked, since
// it was made. It reads the second window's buckets: not for a hot path.
func (n *Node) Counted() int64 {
	return n.second.SumRange(math.MinInt64, math.MaxInt64, metric.Pass) + n.retiredPass.Load() +
		n.second.SumRange(math.MinInt64, math.MaxInt64, metric.Block) + n.retiredBlock.Load()
}

// CountedSince returns the requests counted (passed or blocked) from the
// second holding lo to now, at most the last 60 whole seconds.
func (n *Node) CountedSince(lo, now int64) int64 {
	now = n.second.Clamp(now)
	hi := now - now%second + second
	lo = max(lo-lo%second, hi-minute)
	return n.span(lo, hi, metric.Pass) + n.span(lo, hi, metric.Block)
}

// Minute returns event e's count over the last 60 whole seconds, including
// the current one.
func (n *Node) Minute(now int64, e metric.Event) int64 {
	now = n.second.Clamp(now)
	hi := now - now%second + second
	return n.span(hi-minute, hi, e)
}

// PassedSince returns the passes the node counted from lo, rounded down
// to the second, up to now: what a window that starts counting for the
// node at now must be given to be at least as strict as if it had counted
// them all along (a reload that adds a rule in a window of its own).
// Passes older than the minute window (60 s) are not known.
func (n *Node) PassedSince(lo, now int64) int64 {
	now = n.second.Clamp(now)
	hi := now - now%second + second
	lo = max(lo, 0)
	lo = max(lo-lo%second, hi-minute)
	return n.span(lo, hi, metric.Pass)
}

// span sums [lo, hi) (second-aligned) from the minute window plus the
// buckets the second window has not handed over yet.
func (n *Node) span(lo, hi int64, e metric.Event) int64 {
	return n.minute.SumRange(lo, hi, e) + n.second.SumRange(lo, hi, e)
}

// stat.Snapshot reads every statistic at now.
func (n *Node) Snapshot(now int64) stat.Snapshot {
	return stat.Snapshot{
		Resource:      n.resource,
		PassQPS:       n.Rate(now, metric.Pass),
		BlockQPS:      n.Rate(now, metric.Block),
		SuccessQPS:    n.Rate(now, metric.Success),
		ExceptionQPS:  n.Rate(now, metric.Exception),
		OccupiedQPS:   n.Rate(now, metric.OccupiedPass),
		AvgRT:         n.AvgRT(now),
		MinRT:         n.MinRT(now),
		Inflight:      n.Inflight(),
		PrevPass:      n.PreviousSecond(now, metric.Pass),
		PrevBlock:     n.PreviousSecond(now, metric.Block),
		MinutePass:    n.Minute(now, metric.Pass),
		MinuteBlock:   n.Minute(now, metric.Block),
		MinuteSuccess: n.Minute(now, metric.Success),
		MinuteErrors:  n.Minute(now, metric.Exception),
		Fallbacks:     n.Fallbacks(),
		Keyless:       n.Keyless(),
		KeyEvictions:  n.KeyEvictions(),
		KeysForgotten: n.keysForgotten.Load(),
	}
}
