// Package breaker is the state machine of a circuit breaker: closed,
// open and half-open, with exactly one probe admitted per half-open
// period, and a window of its own that counts completed requests and the
// bad ones among them (errors, or requests slower than a limit).
//
// The state is one word (the state and the instant it began), moved only
// by compare-and-swap, so that every transition has exactly one winner,
// and the winner alone reports it. A completion is one compare-and-swap
// on the caller's stripe of the window's newest bucket, each bucket's
// count of requests and of bad ones in one word, so that a ratio read from
// the window is never torn. A bucket's epoch is kept modulo 2^20: a cell
// left untouched for a multiple of 2^20 buckets (29 h of 100 ms buckets),
// give or take lateBuckets, is read as current or newer until time passes
// it (at most lateBuckets buckets).
//
// Times are int64 nanoseconds of the caller's clock, passed in, so tests
// drive it with plain numbers. Package flow's breaker rules are a Breaker
// each, kept across reloads that do not change the rule.
package breaker

import (
	"math"
	"math/bits"
	"sync"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
)

// Strategy is what makes a completed request bad, and what trips.
type Strategy uint8

const (
	// SlowRatio trips when the share of requests slower than MaxRT among
	// those completed in the window reaches the threshold.
	SlowRatio Strategy = iota
	// ErrorRatio trips when the share of failed requests reaches it.
	ErrorRatio
	// ErrorCount trips when the failed requests in the window reach it.
	ErrorCount
)

// State is a breaker's state.
type State uint8

const (
	// Closed admits every request and counts completions.
	Closed State = iota
	// Open refuses every request until the retry timeout has passed.
	Open
	// HalfOpen has admitted one probe, whose outcome decides: bad, the
	// breaker opens again; good, it closes. Every other request is
	// refused until then, or until the probe timeout returns the probe's
	// place to the next request.
	HalfOpen
)

// String names the state.
func (s State) String() string {
	switch s {
	case Closed:
		return "Closed"
	case Open:
		return "Open"
	case HalfOpen:
		return "HalfOpen"
	}
	return "State(?)"
}

// Config is a breaker's rule, its durations in ns.
type Config struct {
	Strategy Strategy
	// Threshold is the ratio (in [0, 1]) or the count that trips.
	Threshold float64
	// MaxRT is the slowest a request may be before it counts as slow
	// (SlowRatio).
	MaxRT int64
	// MinRequests is the fewest completions in the window before the
	// breaker may trip.
	MinRequests int64
	// Interval is the window's length, in Buckets buckets (Interval a
	// whole multiple of Buckets).
	Interval int64
	Buckets  int
	// RetryTimeout is how long the breaker stays open before it admits a
	// probe (> 0).
	RetryTimeout int64
	// ProbeTimeout is how long a probe that has not completed holds its
	// place: after it the next request is the probe (> 0).
	ProbeTimeout int64
}

// Transition is one change of state, reported once, by the goroutine
// that made it.
type Transition struct {
	From, To State
	// At is when it happened (ns of the caller's clock).
	At int64
	// Value is what tripped a closed breaker (the ratio or the count); for
	// a probe's outcome, the probe's RT in ns (and 1 when it failed, for
	// the error strategies); 0 for open to half-open.
	Value float64
}

// The state word: the state in the low two bits, the instant it began
// (ns, in [-2^61, 2^61)) above them.
const stateBits = 2

func pack(s State, at int64) uint64 { return uint64(at)<<stateBits | uint64(s) }

func unpack(w uint64) (State, int64) { return State(w & (1<<stateBits - 1)), int64(w) >> stateBits }

// The bucket word: the bucket's epoch (its start over the bucket length,
// modulo 2^epochBits), its completions and its bad completions.
const (
	epochBits = 20
	countBits = 22
	countMax  = 1<<countBits - 1
	badShift  = 0
	allShift  = countBits
	epochShft = 2 * countBits
)

// Breaker is one breaker's state and window. It is safe for use by
// multiple goroutines at once.
type Breaker struct {
	cfg       Config
	bucketLen int64
	// An epoch is a time in ms times magic's high word, for times in ms
	// below fast (see epoch): a multiplication where a division would
	// cost several times as much on Exit's path.
	magic, fast uint64
	word        atomic.Uint64
	// cells are every stripe's ring of bucket words, each stripe's on
	// lines of their own: stripe p's bucket of epoch e is
	// cells[pad+p*stride+e&ring]. A ring is the power of two at or above
	// Buckets (indexing it is a mask), and holds the window's last
	// Buckets epochs among older ones.
	cells  []atomic.Uint64
	stride int
	ring   uint64
	mask   int
	// changed is called with every transition, by the goroutine that
	// made it, after the state changed (never while holding anything),
	// until the breaker is retired.
	changed func(Transition)
	// mu guards retired, heard (the state the listener was last told of)
	// and delivering (reports being made, which Retire waits for, so that
	// nothing it reported reaches the listener after what its caller
	// reports next).
	mu         sync.Mutex
	retired    bool
	heard      State
	delivering int
	delivered  sync.Cond
	// into counts the transitions into each state; tripped is the Value
	// of the last closed-to-open one (float64 bits).
	into    [3]atomic.Int64
	tripped atomic.Uint64
}

// New returns a closed breaker of cfg that reports transitions to changed
// (nil: to no one). cfg must be valid (flow validates rules).
func New(cfg Config, changed func(Transition)) *Breaker {
	n := cpu.Stripes()
	const perLine = cpu.CacheLine / 8
	ring := 1 << bits.Len(uint(cfg.Buckets-1))
	stride := (ring + perLine - 1) / perLine * perLine
	b := &Breaker{cfg: cfg, bucketLen: cfg.Interval / int64(cfg.Buckets), cells: make([]atomic.Uint64, pad+n*stride+pad),
		stride: stride, ring: uint64(ring - 1), mask: n - 1, changed: changed}
	b.delivered.L = &b.mu
	if ms := uint64(b.bucketLen / 1e6); ms > 1 && b.bucketLen%1e6 == 0 {
		// hi(t * magic) is t / ms for every t with t * ms < 2^64.
		b.magic, b.fast = math.MaxUint64/ms+1, math.MaxUint64/ms
	}
	return b
}

// Config returns the breaker's rule.
func (b *Breaker) Config() Config { return b.cfg }

// State returns the breaker's state and when it began.
func (b *Breaker) State() (State, int64) { return unpack(b.word.Load()) }

// Closed says whether the breaker is closed: Enter would admit any
// request. It is one load, inlined, for the callers' common case.
func (b *Breaker) Closed() bool { return State(b.word.Load()&(1<<stateBits-1)) == Closed }

// Enter decides a request at now: admitted (ok), and whether it is the
// half-open period's probe; when refused, retry is how long until a
// request could be admitted (the next probe), in ns.
func (b *Breaker) Enter(now int64) (ok, probe bool, retry int64) {
	for {
		w := b.word.Load()
		s, at := unpack(w)
		var due int64
		switch s {
		case Closed:
			return true, false, 0
		case Open:
			due = at + b.cfg.RetryTimeout
		default: // HalfOpen: the probe holds its place until its timeout
			due = at + b.cfg.ProbeTimeout
		}
		if now < due {
			return false, false, due - now
		}
		// This request is the probe: one compare-and-swap, one winner.
		if b.word.CompareAndSwap(w, pack(HalfOpen, now)) {
			if s == Open {
				b.report(Transition{From: Open, To: HalfOpen, At: now})
			}
			return true, true, 0
		}
	}
}

// GiveBack gives back the place of the probe admitted at at (a later rule
// refused the request, or its wait was cancelled): the next request may
// be the probe.
func (b *Breaker) GiveBack(at int64) {
	b.word.CompareAndSwap(pack(HalfOpen, at), pack(HalfOpen, GivenBack))
}

// GivenBack is the instant of a probe's place given back: long past, so
// that the next request is the probe, and no request's start.
const GivenBack = -1 << 60

// Wait is how long from now until the breaker would admit a request: 0
// closed, else until its next probe may go.
func (b *Breaker) Wait(now int64) int64 {
	s, at := unpack(b.word.Load())
	switch s {
	case Open:
		return max(at+b.cfg.RetryTimeout-now, 0)
	case HalfOpen:
		return max(at+b.cfg.ProbeTimeout-now, 0)
	}
	return 0
}

// Exit counts the completion at now of a request admitted at start (the
// now its Enter was given), failed or not, and moves the state: a
// closed breaker may trip; the probe's outcome closes or reopens a
// half-open one. probe says the request was admitted as a probe (by some
// breaker of its resource): only a probe's completion ends a half-open
// period, and only the one that began it (its start is the period's
// instant). Completions of requests admitted before the breaker opened,
// and of a probe whose place timed out, count for nothing.
func (b *Breaker) Exit(p int, start, now int64, failed, probe bool) {
	rt := max(now-start, 0)
	bad := failed
	if b.cfg.Strategy == SlowRatio {
		bad = rt > b.cfg.MaxRT
	}
	w := b.word.Load()
	s, at := unpack(w)
	if s != Closed {
		b.exitOpen(w, start, now, rt, bad, probe)
		return
	}
	if start < at {
		return // admitted before the breaker last closed
	}
	// Count it on stripe p, in now's bucket: a cell whose word is of an
	// older epoch starts over in the same compare-and-swap.
	e, i := b.epoch(now)
	inc := uint64(1) << allShift
	if bad {
		inc |= 1 << badShift
	}
	cell := &b.cells[pad+(p&b.mask)*b.stride+i]
	for {
		c := cell.Load()
		ce := c >> epochShft
		if ce != e && (c>>allShift&countMax == 0 || (ce-e)&(1<<epochBits-1) > lateBuckets) {
			// An older bucket's (or an empty cell's, cleared): it starts
			// over. (One more than
			// lateBuckets ahead is taken for one 2^20 buckets behind: a
			// cell idle for that long, in one of the few epochs before
			// a whole number of cycles, would otherwise read as newer
			// for hours, and Sum would skip what it counts.)
			if cell.CompareAndSwap(c, e<<epochShft|inc) {
				break
			}
			continue
		}
		// Now's bucket, or a newer one than this late completion's (a
		// clock read before another's): it counts there rather than wipe
		// it.
		next := c + inc
		if c>>allShift&countMax == countMax {
			// Full: the completions halve and it goes on counting. The
			// bad ones halve too (the ratio stays), but for ErrorCount,
			// which counts them, while they fit (its Threshold is
			// below: it would have tripped).
			bad := c >> badShift & countMax
			if b.cfg.Strategy != ErrorCount || bad > countMax/2 {
				bad /= 2
			}
			next = ce<<epochShft | (countMax/2)<<allShift | bad<<badShift + inc
		}
		if cell.CompareAndSwap(c, next) {
			break
		}
	}
	if bad {
		b.mayTrip(w, now)
	}
}

// exitOpen is Exit on a breaker not closed (state word w) of a request
// that took rt and was bad or not.
func (b *Breaker) exitOpen(w uint64, start, now, rt int64, bad, probe bool) {
	s, at := unpack(w)
	switch {
	case s == HalfOpen && probe && start == at:
		// The probe (no other request was admitted since it).
		value := float64(rt)
		to := Closed
		if bad {
			to = Open
			if b.cfg.Strategy != SlowRatio {
				value = 1
			}
		}
		if to == Closed {
			// The window starts afresh. Nothing counts while half-open,
			// so clearing it before the breaker closes loses nothing.
			b.clear(now)
		}
		if b.word.CompareAndSwap(w, pack(to, now)) {
			b.report(Transition{From: HalfOpen, To: to, At: now, Value: value})
		}
	}
}

// mayTrip opens the closed breaker (state word w) if its window has
// reached the threshold.
func (b *Breaker) mayTrip(w uint64, now int64) {
	all, bad := b.Sum(now)
	if all < b.cfg.MinRequests || bad == 0 {
		return
	}
	value := float64(bad)
	if b.cfg.Strategy != ErrorCount {
		value = float64(bad) / float64(all)
	}
	if value < b.cfg.Threshold {
		return
	}
	if b.word.CompareAndSwap(w, pack(Open, now)) {
		b.report(Transition{From: Closed, To: Open, At: now, Value: value})
	}
}

// report tells the listener of t, unless the breaker was retired; a
// listener's panic is dropped, so that the request that made the change
// completes (its state already changed).
func (b *Breaker) report(t Transition) {
	b.into[t.To].Add(1)
	if t.From == Closed {
		b.tripped.Store(math.Float64bits(t.Value))
	}
	if b.changed == nil {
		return
	}
	b.mu.Lock()
	if b.retired {
		b.mu.Unlock()
		return
	}
	b.heard = t.To
	b.delivering++
	b.mu.Unlock()
	defer func() {
		_ = recover()
		b.mu.Lock()
		if b.delivering--; b.delivering == 0 {
			b.delivered.Broadcast()
		}
		b.mu.Unlock()
	}()
	b.changed(t)
}

// Transitions returns how many times the breaker went into state s.
func (b *Breaker) Transitions(s State) int64 { return b.into[s].Load() }

// Tripped returns the Value of the breaker's last trip (closed to open),
// 0 if it never tripped.
func (b *Breaker) Tripped() float64 { return math.Float64frombits(b.tripped.Load()) }

// Retire stops the breaker's reports (its rule changed: the one in force
// is another), once those being made have reached the listener, and
// returns the state the listener was last told of (Closed if none): a
// change not reported, as the breaker retired, is not the listener's to
// undo. The listener must not retire breakers (load rules): Retire waits
// for its reports.
func (b *Breaker) Retire() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.retired = true
	for b.delivering > 0 {
		b.delivered.Wait()
	}
	return b.heard
}

// epoch is the bucket number of now, and its place in the ring.
func (b *Breaker) epoch(now int64) (uint64, int) {
	t := uint64(max(now, 0))
	var e uint64
	if ms := t / 1e6; ms < b.fast {
		e, _ = bits.Mul64(ms, b.magic)
	} else {
		e = t / uint64(b.bucketLen)
	}
	return e & (1<<epochBits - 1), int(e & b.ring)
}

// Sum returns the completions and bad completions in the window ending at
// now: the buckets of the last Buckets epochs (a ring's other cells hold
// older ones).
func (b *Breaker) Sum(now int64) (all, bad int64) {
	e, _ := b.epoch(now)
	n := uint64(b.cfg.Buckets)
	for p := 0; p <= b.mask; p++ {
		cells := b.cells[pad+p*b.stride:][:b.ring+1]
		for j := range cells {
			w := cells[j].Load()
			if (e-w>>epochShft)&(1<<epochBits-1) >= n {
				continue // an older window's
			}
			all += int64(w >> allShift & countMax)
			bad += int64(w >> badShift & countMax)
		}
	}
	return all, bad
}

// Reset closes the breaker at now and forgets its window (a rule that
// changed starts afresh); it reports nothing.
func (b *Breaker) Reset(now int64) {
	b.clear(now)
	b.word.Store(pack(Closed, now))
}

// clear empties the window at now: every cell holds no completions, of an
// epoch half a cycle before now's, older than any a completion near now
// could take for newer.
func (b *Breaker) clear(now int64) {
	e, _ := b.epoch(now)
	old := (e - 1<<(epochBits-1)) & (1<<epochBits - 1) << epochShft
	for i := range b.cells {
		b.cells[i].Store(old)
	}
}

// lateBuckets is how far behind the newest bucket of a stripe's cell a
// completion may be and still count there (a clock read before another's,
// then descheduled): farther is taken for a cell left from 2^20 buckets
// before.
const lateBuckets = 64

// MaxCount is the most completions one stripe's bucket counts; past it a
// bucket halves its counts (keeping its ratio) and goes on counting.
const MaxCount = countMax

// pad keeps the cells off the lines of whatever is allocated beside them.
const pad = cpu.CacheLine / 8
