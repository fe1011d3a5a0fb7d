package global

// Options: the Source's settings, their defaults and validation.

import (
	"fmt"
	"strings"
	"time"

	"github.com/leapflow/leapflow/stat"
)

// options configures a Source (see Option). Zero values pick the
// documented defaults; an option given a value it does not take records
// the error in bad, which New returns.
type options struct {
	bad error
	// Buckets is the number of buckets per window (default 10).
	Buckets int
	// MaxBatch is the most tokens one call leases beyond what the waiting
	// requests ask (default 100,000; 1 turns leasing off: each call asks
	// only for the requests waiting on it). Leases start at 4, double
	// while an instance spends a whole lease within one bucket and halve
	// when most of one goes unspent (see the package doc).
	MaxBatch int64
	// Timeout is the most a request waits for Redis to decide (default
	// 100 ms). A request still undecided then is refused (Stats.Late),
	// not failed over: a late reply is not evidence that Redis is down.
	// The defaults support a Redis up to 50 ms away (round trip).
	Timeout time.Duration
	// CallTimeout bounds each Redis call, which runs apart from the
	// requests waiting on it (default 1 s, at least Timeout): a reply
	// later than Timeout still installs its lease and counts as a
	// success, and a connection is dialled within it.
	CallTimeout time.Duration
	// FailAfter is how many calls of a limit in a row must fail before
	// the Source backs off Redis for it and its rules' fallbacks apply
	// (default 2).
	FailAfter int
	// ExactBelow makes limits of at most this many admissions per window
	// use the exact sliding log (default 0: never).
	ExactBelow int64
	// Backoff is how long the Source stays off Redis before one call
	// probes it (default 100 ms); it doubles after every FailAfter probes
	// that fail, up to MaxBackoff (default 5 s).
	Backoff, MaxBackoff time.Duration
	// PresenceTTL is how long an instance's presence in a limit lasts
	// (default 1 s); it is renewed every third of that while Redis
	// answers, for the limits of rules with FallbackLocal. Once it lapses
	// the other instances keep the rule's LocalShare of the threshold
	// (up to half the threshold for all lapsed instances together) from
	// what they admit, for up to PresenceHold (default 10 s), since the
	// instance may be admitting it on its own (see the package doc).
	PresenceTTL, PresenceHold time.Duration
	// Prefix starts every key (default "leapflow").
	Prefix string
	// MaxKeys is the most callers' limits of PerKey rules the Source
	// keeps at once (default 100,000; about 600 bytes each): a caller's
	// limit evicted loses only its lease, and is made again when seen.
	MaxKeys int
	// Clock times leases; it must never read behind real time by more
	// than ClockSlack, which is taken off every lease (defaults
	// stat.NewMonotonic() and 2 ms). A coarse clock lags by its tick and
	// more under load: it would spend leases late.
	Clock      stat.Clock
	ClockSlack time.Duration
	// OnAdmit, if set, is called for every admission with the start of
	// the server bucket it was counted in, or for a GCRA rule the server
	// time of the decision (for audits and tests; it runs on the request
	// path and must be fast).
	OnAdmit func(bucket time.Time, n int64)
}

// Option shapes a Source (see New).
type Option func(*options)

// WithBuckets sets the number of buckets per window (default 10; 1 to 1000).
func WithBuckets(n int) Option {
	return func(o *options) {
		if n < 1 {
			o.setBad(fmt.Errorf("global: WithBuckets must be in [1, 1000], got %d", n))
		}
		o.Buckets = n
	}
}

// WithMaxBatch sets the most tokens one call leases beyond what the waiting
// requests ask (default 100,000; 1 turns leasing off: each call asks only
// for the requests waiting on it). Leases start at 4, double while an
// instance spends a whole lease within one bucket and halve when most of
// one goes unspent (see the package doc).
func WithMaxBatch(n int64) Option {
	return func(o *options) {
		if n < 1 {
			o.setBad(fmt.Errorf("global: WithMaxBatch must be >= 1, got %d", n))
		}
		o.MaxBatch = n
	}
}

// WithTimeout sets the most a request waits for Redis to decide (default
// 100 ms). A request still undecided then is refused (Stats.Late), not
// failed over: a late reply is not evidence that Redis is down. The
// defaults support a Redis up to 50 ms away (round trip).
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.setBad(fmt.Errorf("global: WithTimeout must be > 0, got %v", d))
		}
		o.Timeout = d
	}
}

// WithCallTimeout bounds each Redis call, which runs apart from the
// requests waiting on it (default 1 s, at least the Timeout): a reply later
// than Timeout still installs its lease and counts as a success, and a
// connection is dialled within it.
func WithCallTimeout(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.setBad(fmt.Errorf("global: WithCallTimeout must be > 0, got %v", d))
		}
		o.CallTimeout = d
	}
}

// WithFailAfter sets how many calls of a limit in a row must fail before
// the Source backs off Redis for it and its rules' fallbacks apply
// (default 2; 1 to 1000).
func WithFailAfter(n int) Option {
	return func(o *options) {
		if n < 1 {
			o.setBad(fmt.Errorf("global: WithFailAfter must be in [1, 1000], got %d", n))
		}
		o.FailAfter = n
	}
}

// WithExactBelow makes limits of at most n admissions per window use the
// exact sliding log (default 0: never).
func WithExactBelow(n int64) Option {
	return func(o *options) {
		if n < 0 {
			o.setBad(fmt.Errorf("global: WithExactBelow must be >= 0, got %d", n))
		}
		o.ExactBelow = n
	}
}

// WithBackoff sets how long the Source stays off Redis before one call
// probes it (default 100 ms); it doubles after every FailAfter probes that
// fail, up to the MaxBackoff.
func WithBackoff(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.setBad(fmt.Errorf("global: WithBackoff must be > 0, got %v", d))
		}
		o.Backoff = d
	}
}

// WithMaxBackoff caps the backoff (default 5 s, at least the Backoff).
func WithMaxBackoff(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.setBad(fmt.Errorf("global: WithMaxBackoff must be > 0, got %v", d))
		}
		o.MaxBackoff = d
	}
}

// WithPresenceTTL sets how long an instance's presence in a limit lasts
// (default 1 s; at least 10 ms); it is renewed every third of that while
// Redis answers, for the limits of rules with FallbackLocal. Once it
// lapses the other instances keep the rule's LocalShare of the threshold
// (up to half the threshold for all lapsed instances together) from what
// they admit, for up to the PresenceHold, since the instance may be
// admitting it on its own (see the package doc).
func WithPresenceTTL(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.setBad(fmt.Errorf("global: WithPresenceTTL must be at least 10ms, got %v", d))
		}
		o.PresenceTTL = d
	}
}

// WithPresenceHold sets how long a lapsed instance's share is kept (default
// 10 s, at least the PresenceTTL).
func WithPresenceHold(d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			o.setBad(fmt.Errorf("global: WithPresenceHold must be > 0, got %v", d))
		}
		o.PresenceHold = d
	}
}

// WithPrefix starts every key with prefix (default "leapflow"; no braces).
func WithPrefix(prefix string) Option {
	return func(o *options) {
		if prefix == "" {
			o.setBad(fmt.Errorf("global: WithPrefix must not be empty"))
		}
		o.Prefix = prefix
	}
}

// WithMaxKeys sets the most callers' limits of PerKey rules the Source
// keeps at once (default 100,000, about 600 bytes each; at most 2^24): a
// caller's limit evicted loses only its lease, and is made again when seen.
func WithMaxKeys(n int) Option {
	return func(o *options) {
		if n < 1 {
			o.setBad(fmt.Errorf("global: WithMaxKeys must be in [1, 2^24], got %d", n))
		}
		o.MaxKeys = n
	}
}

// WithClock times leases with c (default stat.NewMonotonic()); it must
// never read behind real time by more than the ClockSlack, which is taken
// off every lease. A coarse clock lags by its tick and more under load: it
// would spend leases late.
func WithClock(c stat.Clock) Option {
	return func(o *options) {
		if c == nil {
			o.setBad(fmt.Errorf("global: WithClock must not be nil"))
		}
		o.Clock = c
	}
}

// WithClockSlack sets what is taken off every lease for the clock's lag
// (default 2 ms; 0 or more).
func WithClockSlack(d time.Duration) Option {
	return func(o *options) {
		if d < 0 {
			o.setBad(fmt.Errorf("global: WithClockSlack must be >= 0, got %v", d))
		}
		o.ClockSlack = d
	}
}

// WithOnAdmit calls fn for every admission with the start of the server
// bucket it was counted in, or for a GCRA rule the server time of the
// decision (for audits and tests; it runs on the request path and must be
// fast).
func WithOnAdmit(fn func(bucket time.Time, n int64)) Option {
	return func(o *options) { o.OnAdmit = fn }
}

func (o options) withDefaults() options {
	if o.Buckets == 0 {
		o.Buckets = 10
	}
	if o.MaxBatch == 0 {
		o.MaxBatch = 100_000
	}
	if o.Timeout == 0 {
		o.Timeout = 100 * time.Millisecond
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = max(time.Second, o.Timeout)
	}
	if o.FailAfter == 0 {
		o.FailAfter = 2
	}
	if o.Backoff == 0 {
		o.Backoff = 100 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = max(5*time.Second, o.Backoff)
	}
	if o.PresenceTTL == 0 {
		o.PresenceTTL = time.Second
	}
	if o.PresenceHold == 0 {
		o.PresenceHold = max(10*time.Second, o.PresenceTTL)
	}
	if o.MaxKeys == 0 {
		o.MaxKeys = 100_000
	}
	if o.Prefix == "" {
		o.Prefix = "leapflow"
	}
	if o.Clock == nil {
		o.Clock = stat.NewMonotonic()
	}
	if o.ClockSlack == 0 {
		o.ClockSlack = 2 * time.Millisecond
	}
	return o
}

func (o options) validate() error {
	if o.bad != nil {
		return o.bad
	}
	switch {
	case o.Buckets < 1 || o.Buckets > 1000:
		return fmt.Errorf("global: WithBuckets must be in [1, 1000], got %d", o.Buckets)
	case o.MaxBatch < 1:
		return fmt.Errorf("global: WithMaxBatch must be >= 1, got %d", o.MaxBatch)
	case o.Timeout < 0:
		return fmt.Errorf("global: WithTimeout must be > 0, got %v", o.Timeout)
	case o.CallTimeout < o.Timeout:
		return fmt.Errorf("global: WithCallTimeout must be at least WithTimeout (%v), got %v", o.Timeout, o.CallTimeout)
	case o.FailAfter < 1 || o.FailAfter > 1000:
		return fmt.Errorf("global: WithFailAfter must be in [1, 1000], got %d", o.FailAfter)
	case o.ExactBelow < 0:
		return fmt.Errorf("global: WithExactBelow must be >= 0, got %d", o.ExactBelow)
	case o.Backoff < 0 || o.MaxBackoff < o.Backoff:
		return fmt.Errorf("global: WithBackoff must be in [0, WithMaxBackoff], got %v (WithMaxBackoff %v)", o.Backoff, o.MaxBackoff)
	case o.PresenceTTL < 10*time.Millisecond:
		return fmt.Errorf("global: WithPresenceTTL must be at least 10ms, got %v", o.PresenceTTL)
	case o.PresenceHold < o.PresenceTTL:
		return fmt.Errorf("global: WithPresenceHold must be at least WithPresenceTTL (%v), got %v", o.PresenceTTL, o.PresenceHold)
	case o.ClockSlack < 0:
		return fmt.Errorf("global: WithClockSlack must be >= 0, got %v", o.ClockSlack)
	case o.MaxKeys < 1 || o.MaxKeys > 1<<24:
		return fmt.Errorf("global: WithMaxKeys must be in [1, 2^24], got %d", o.MaxKeys)
	case strings.ContainsAny(o.Prefix, "{}"):
		// A brace would make the prefix the hash tag of every key: every
		// limit in one slot of a cluster.
		return fmt.Errorf("global: WithPrefix must not contain '{' or '}', got %q", o.Prefix)
	}
	return nil
}

// setBad records the first bad option.
func (o *options) setBad(err error) {
	if o.bad == nil {
		o.bad = err
	}
}
