package global

// Options: the Source's settings, their defaults and validation.

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/leapflow/leapflow/stat"
)

// options is a Source's settings (see the With options for each). New
// starts from defaultOptions, applies the options given, then fills the
// defaults that follow others, so an option given explicitly, 0 included,
// is validated as given.
type options struct {
	Buckets                   int
	MaxBatch                  int64
	Timeout, CallTimeout      time.Duration
	FailAfter                 int
	ExactBelow                int64
	Backoff, MaxBackoff       time.Duration
	PresenceTTL, PresenceHold time.Duration
	Prefix                    string
	MaxKeys                   int
	Clock                     stat.Clock
	ClockSlack                time.Duration
	OnAdmit                   func(bucket time.Time, n int64)
}

// unset marks the defaults that follow another setting (CallTimeout,
// MaxBackoff, PresenceHold) until New fills them: no option can give it.
const unset = math.MinInt64

// defaultOptions is a Source's settings before any option.
func defaultOptions() options {
	return options{Buckets: 10, MaxBatch: 100_000, Timeout: 100 * time.Millisecond, CallTimeout: unset,
		FailAfter: 2, Backoff: 100 * time.Millisecond, MaxBackoff: unset, PresenceTTL: time.Second, PresenceHold: unset,
		Prefix: "leapflow", MaxKeys: 100_000, Clock: stat.NewMonotonic(), ClockSlack: 2 * time.Millisecond}
}

// newOptions applies opts over the defaults, fills the defaults that
// follow others and validates the result.
func newOptions(opts []Option) (options, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if o.CallTimeout == unset {
		o.CallTimeout = max(time.Second, o.Timeout)
	}
	if o.MaxBackoff == unset {
		o.MaxBackoff = max(5*time.Second, o.Backoff)
	}
	if o.PresenceHold == unset {
		o.PresenceHold = max(10*time.Second, o.PresenceTTL)
	}
	return o, o.validate()
}

// Option shapes a Source (see New).
type Option func(*options)

// WithBuckets sets the number of buckets per window (default 10; 1 to 1000).
func WithBuckets(n int) Option { return func(o *options) { o.Buckets = n } }

// WithMaxBatch sets the most tokens one call leases beyond what the waiting
// requests ask (default 100,000; 1 turns leasing off: each call asks only
// for the requests waiting on it). Leases start at 4, double while an
// instance spends a whole lease within one bucket and halve when most of
// one goes unspent (see the package doc).
func WithMaxBatch(n int64) Option { return func(o *options) { o.MaxBatch = n } }

// WithTimeout sets the most a request waits for Redis to decide (default
// 100 ms). A request still undecided then is refused (Stats.Late), not
// failed over: a late reply is not evidence that Redis is down. The
// defaults support a Redis up to 50 ms away (round trip).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.Timeout = d } }

// WithCallTimeout bounds each Redis call, which runs apart from the
// requests waiting on it (default 1 s, at least the Timeout): a reply later
// than Timeout still installs its lease and counts as a success, and a
// connection is dialled within it.
func WithCallTimeout(d time.Duration) Option { return func(o *options) { o.CallTimeout = d } }

// WithFailAfter sets how many calls of a limit in a row must fail before
// the Source backs off Redis for it and its rules' fallbacks apply
// (default 2; 1 to 1000).
func WithFailAfter(n int) Option { return func(o *options) { o.FailAfter = n } }

// WithExactBelow makes limits of at most n admissions per window use the
// exact sliding log (default 0: never).
func WithExactBelow(n int64) Option { return func(o *options) { o.ExactBelow = n } }

// WithBackoff sets how long the Source stays off Redis before one call
// probes it (default 100 ms; 0: at once); it doubles after every
// FailAfter probes that fail, up to the MaxBackoff.
func WithBackoff(d time.Duration) Option { return func(o *options) { o.Backoff = d } }

// WithMaxBackoff caps the backoff (default 5 s, at least the Backoff); a
// backoff ends on the wall clock's multiples of itself, up to half of it
// later (see the package doc, Failure).
func WithMaxBackoff(d time.Duration) Option { return func(o *options) { o.MaxBackoff = d } }

// WithPresenceTTL sets how long an instance's presence in a limit lasts
// (default 1 s; at least 10 ms); it is renewed every third of that while
// Redis answers, for the limits of rules with FallbackLocal. Once it
// lapses the other instances keep the rule's LocalShare of the threshold
// (up to half the threshold for all lapsed instances together) from what
// they admit, for up to the PresenceHold, since the instance may be
// admitting it on its own (see the package doc).
func WithPresenceTTL(d time.Duration) Option { return func(o *options) { o.PresenceTTL = d } }

// WithPresenceHold sets how long a lapsed instance's share is kept (default
// 10 s, at least the PresenceTTL).
func WithPresenceHold(d time.Duration) Option { return func(o *options) { o.PresenceHold = d } }

// WithPrefix starts every key with prefix (default "leapflow"; no braces).
func WithPrefix(prefix string) Option { return func(o *options) { o.Prefix = prefix } }

// WithMaxKeys sets the most callers' limits of PerKey rules the Source
// keeps at once (default 100,000, about 600 bytes each; at most 2^24): a
// caller's limit evicted loses only its lease, and is made again when seen.
func WithMaxKeys(n int) Option { return func(o *options) { o.MaxKeys = n } }

// WithClock times leases with c (default stat.NewMonotonic()); it must
// never read behind real time by more than the ClockSlack, which is taken
// off every lease. A coarse clock lags by its tick and more under load: it
// would spend leases late.
func WithClock(c stat.Clock) Option { return func(o *options) { o.Clock = c } }

// WithClockSlack sets what is taken off every lease for the clock's lag
// (default 2 ms; 0 or more).
func WithClockSlack(d time.Duration) Option { return func(o *options) { o.ClockSlack = d } }

// WithOnAdmit calls fn for every admission with the start of the server
// bucket it was counted in, or for a GCRA rule the server time of the
// decision (for audits and tests; it runs on the request path and must be
// fast).
func WithOnAdmit(fn func(bucket time.Time, n int64)) Option {
	return func(o *options) { o.OnAdmit = fn }
}

func (o options) validate() error {
	switch {
	case o.Buckets < 1 || o.Buckets > 1000:
		return fmt.Errorf("global: WithBuckets must be in [1, 1000], got %d", o.Buckets)
	case o.MaxBatch < 1:
		return fmt.Errorf("global: WithMaxBatch must be >= 1, got %d", o.MaxBatch)
	case o.Timeout <= 0:
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
	case o.Prefix == "":
		return fmt.Errorf("global: WithPrefix must not be empty")
	case o.Clock == nil:
		return fmt.Errorf("global: WithClock must not be nil")
	case strings.ContainsAny(o.Prefix, "{}"):
		// A brace would make the prefix the hash tag of every key: every
		// limit in one slot of a cluster.
		return fmt.Errorf("global: WithPrefix must not contain '{' or '}', got %q", o.Prefix)
	}
	return nil
}
