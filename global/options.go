package global

// Options: the Source's settings, their defaults and validation.

import (
	"fmt"
	"strings"
	"time"

	"github.com/leapflow/leapflow/stat"
)

// Options configures a Source. Zero values pick the documented defaults.
type Options struct {
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

func (o Options) withDefaults() Options {
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

func (o Options) validate() error {
	switch {
	case o.Buckets < 1 || o.Buckets > 1000:
		return fmt.Errorf("global: Buckets must be in [1, 1000], got %d", o.Buckets)
	case o.MaxBatch < 1:
		return fmt.Errorf("global: MaxBatch must be >= 1, got %d", o.MaxBatch)
	case o.Timeout < 0:
		return fmt.Errorf("global: Timeout must be > 0, got %v", o.Timeout)
	case o.CallTimeout < o.Timeout:
		return fmt.Errorf("global: CallTimeout must be at least Timeout (%v), got %v", o.Timeout, o.CallTimeout)
	case o.FailAfter < 1 || o.FailAfter > 1000:
		return fmt.Errorf("global: FailAfter must be in [1, 1000], got %d", o.FailAfter)
	case o.ExactBelow < 0:
		return fmt.Errorf("global: ExactBelow must be >= 0, got %d", o.ExactBelow)
	case o.Backoff < 0 || o.MaxBackoff < o.Backoff:
		return fmt.Errorf("global: Backoff must be in [0, MaxBackoff], got %v (MaxBackoff %v)", o.Backoff, o.MaxBackoff)
	case o.PresenceTTL < 10*time.Millisecond:
		return fmt.Errorf("global: PresenceTTL must be at least 10ms, got %v", o.PresenceTTL)
	case o.PresenceHold < o.PresenceTTL:
		return fmt.Errorf("global: PresenceHold must be at least PresenceTTL (%v), got %v", o.PresenceTTL, o.PresenceHold)
	case o.ClockSlack < 0:
		return fmt.Errorf("global: ClockSlack must be >= 0, got %v", o.ClockSlack)
	case o.MaxKeys < 1 || o.MaxKeys > 1<<24:
		return fmt.Errorf("global: MaxKeys must be in [1, 2^24], got %d", o.MaxKeys)
	case strings.ContainsAny(o.Prefix, "{}"):
		// A brace would make the prefix the hash tag of every key: every
		// limit in one slot of a cluster.
		return fmt.Errorf("global: Prefix must not contain '{' or '}', got %q", o.Prefix)
	}
	return nil
}
