package flow

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/stat"
)

// Metric is what a rule limits.
type Metric uint8

const (
	// QPS limits admissions per second, counted in a sliding window.
	QPS Metric = iota
	// Concurrency limits requests in flight (entered, not yet exited).
	Concurrency
)

func (m Metric) String() string {
	switch m {
	case QPS:
		return "QPS"
	case Concurrency:
		return "Concurrency"
	}
	return fmt.Sprintf("Metric(%d)", uint8(m))
}

// Behavior is what a QPS rule does with traffic over its threshold.
type Behavior uint8

const (
	// Reject fails fast: a request that would take the window over the
	// threshold is blocked at once.
	Reject Behavior = iota
	// WarmUp starts a cold resource at Threshold/ColdFactor and raises the
	// limit to Threshold over WarmUpPeriod of sustained load.
	WarmUp
	// Throttle spaces requests evenly at 1/Threshold, queueing each for at
	// most MaxQueueing.
	Throttle
	// WarmUpThrottle spaces requests evenly at the warming-up rate.
	WarmUpThrottle
	// GCRA is a token bucket (x/time/rate's model): Burst tokens, refilled
	// at Threshold per second; a request of n takes n or is refused at
	// once. It is one word of state, the theoretical arrival time of the
	// next request, moved by compare-and-swap (the generic cell rate
	// algorithm), exact at any concurrency. A Global GCRA rule keeps that
	// time in the shared store instead (see Rule.Global).
	GCRA
)

func (b Behavior) String() string {
	switch b {
	case Reject:
		return "Reject"
	case WarmUp:
		return "WarmUp"
	case Throttle:
		return "Throttle"
	case WarmUpThrottle:
		return "WarmUpThrottle"
	case GCRA:
		return "GCRA"
	}
	return fmt.Sprintf("Behavior(%d)", uint8(b))
}

// Fallback is what a global rule does when its TokenSource fails.
type Fallback uint8

const (
	// FallbackLocal checks the rule locally against LocalShare of its
	// threshold.
	FallbackLocal Fallback = iota
	// FallbackOpen admits.
	FallbackOpen
	// FallbackClosed blocks.
	FallbackClosed
)

func (f Fallback) String() string {
	switch f {
	case FallbackLocal:
		return "Local"
	case FallbackOpen:
		return "Open"
	case FallbackClosed:
		return "Closed"
	}
	return fmt.Sprintf("Fallback(%d)", uint8(f))
}

// Rule limits one resource. The zero values of the optional fields pick the
// defaults documented on each.
type Rule struct {
	// ID names the rule in errors; the resource name is used when empty.
	ID string
	// Resource is the protected resource's name (required).
	Resource string
	// Metric is QPS (default) or Concurrency.
	Metric Metric
	// Threshold is the limit: admissions per second for QPS, requests in
	// flight for Concurrency, from 0 (blocks everything) to MaxThreshold.
	// Per window, a QPS rule admits floor(Threshold * StatInterval / 1s).
	Threshold float64
	// StatInterval is the window a QPS rule counts in (default 1 s; a
	// positive whole number of milliseconds). Rules on 1 s share the
	// resource's second window.
	StatInterval time.Duration
	// Behavior is what happens over the threshold (default Reject). Only
	// Reject is valid for Concurrency.
	Behavior Behavior
	// WarmUpPeriod is how long a cold resource takes to reach Threshold
	// (WarmUp and WarmUpThrottle; required there).
	WarmUpPeriod time.Duration
	// ColdFactor is Threshold over the cold rate (WarmUp behaviours; default
	// 3, must be > 1).
	ColdFactor float64
	// MaxQueueing is the longest a Throttle request may wait (default 0:
	// admit only requests that need not wait).
	MaxQueueing time.Duration
	// RelatedResource, if set, makes the rule read that resource's pass
	// rate instead of this one's (Sentinel's associated strategy): this
	// resource is blocked while the related one is over the threshold. QPS
	// rules with Behavior Reject only.
	RelatedResource string
	// Global enforces Threshold across instances through the engine's
	// TokenSource; see Fallback and LocalShare for when it fails. QPS rules
	// with Behavior Reject or GCRA only (not PerKey GCRA). A Global GCRA
	// rule is one bucket shared by every instance, decided by the source
	// per request (the Redis source: one round trip, on the server's
	// clock, exact across instances); its Burst must refill within 30 days
	// (Burst / Threshold). Its FallbackLocal is a local bucket of
	// LocalShare of Threshold and max(1, floor(Burst x LocalShare))
	// tokens; what the source admitted is not given back when a later
	// rule blocks the request (as for every Global rule), what the local
	// bucket took is.
	Global bool
	// Fallback is what a Global rule does when the TokenSource fails.
	Fallback Fallback
	// LocalShare is the part of Threshold a Global rule enforces locally
	// under FallbackLocal (default 1, in (0, 1]; left zero otherwise).
	LocalShare float64
	// PerKey applies Threshold to each key of the resource separately (a
	// limit per user, per client IP, per tenant): requests name their key
	// with WithKey. A request without a key is limited under one shared
	// "no key" entry (one caller at Threshold) and counted in the
	// resource's Keyless statistic. QPS rules with Behavior Reject or Throttle,
	// and Concurrency rules; see the package doc for the memory bound.
	PerKey bool
	// MaxKeys is the most keys a PerKey rule tracks at once (default
	// DefaultMaxKeys, at most MaxMaxKeys; left zero otherwise). Keys
	// listed in Keys are tracked beside them, never evicted.
	MaxKeys int
	// Keys gives specific keys of a PerKey rule their own thresholds (a
	// premium tenant at ten times the rule's, a known abuser at 0).
	Keys []KeyLimit
	// Burst is a GCRA rule's bucket: the most requests admitted at once
	// after an idle spell (default 1, at most MaxBurst; left zero
	// otherwise). In any span of length L a GCRA rule admits at most
	// Burst + Threshold x L; a Global one across all instances together,
	// while its source answers.
	Burst int
	// DryRun makes the rule count what it would block without blocking
	// anything (a shadow mode, to roll a new limit out safely): it checks
	// each request the resource's other rules admitted, in a window of its
	// own, as if it were in force, and counts those it would have blocked
	// (Engine.DryRuns). QPS rules with Behavior Reject on their own
	// resource's rate only (not PerKey, Global or related).
	DryRun bool
	// SpanExact holds the threshold in every continuous span of
	// StatInterval, not only in each window of whole buckets: a plain
	// window of n buckets can admit up to twice its threshold in a span
	// that ends just after a bucket boundary (all of one window at the end
	// of its oldest bucket, all of the next at the start of its newest). A
	// span-exact rule admits against the last n+1 buckets of W/n, which
	// costs 1/(n+1) of the steady rate (n is the engine's WithSpanBuckets,
	// 10 by default: a steady 91% of Threshold);
	// see the package doc for the proof. QPS rules with Behavior Reject on
	// their own resource's rate (not PerKey, related or DryRun).
	// Span-exact rules of one resource and StatInterval admit together,
	// in a window of their own, beside the resource's plain rules. A
	// Global rule may be span-exact: the Redis source counts the extra
	// bucket on the server (see the global package), and its local
	// fallback window is span-exact too.
	SpanExact bool
}

// KeyLimit is a specific key's threshold in a PerKey rule.
type KeyLimit struct {
	Key       string
	Threshold float64
}

// Per-key bounds.
const (
	// DefaultMaxKeys is the MaxKeys of a PerKey rule with none.
	DefaultMaxKeys = 100_000
	// MaxMaxKeys is the largest MaxKeys a rule accepts.
	MaxMaxKeys = 1 << 24
	// MaxKeyLen is the longest key WithKey accepts, in bytes.
	MaxKeyLen = 1024
	// MaxKeyWindowCount is the most a PerKey QPS rule (or a specific key)
	// may admit per window: Threshold x StatInterval / 1s.
	MaxKeyWindowCount = 1<<32 - 1
	// maxKeyLimits bounds a rule's Keys.
	maxKeyLimits = 10_000
)

// MaxBurst is the largest Burst a GCRA rule accepts.
const MaxBurst = 1 << 30

// maxGCRARefill is the longest a GCRA rule's bucket may take to refill
// (Burst / Threshold): a local rule keeps it in int64 nanoseconds (Burst
// times the cost of a token, which would wrap past 292 years), and the
// Redis token source in nanoseconds that must stay exact in a Lua number
// (2^53 ns is 104 days, and a decision adds up to twice this).
const maxGCRARefill = 30 * 24 * time.Hour

// MaxThreshold is the largest Threshold a rule accepts: a trillion a second
// (or in flight) is beyond any real limit, and keeps every counter of an
// hour-long window far from the top of its 64-bit word.
const MaxThreshold = 1e12

// minPacedRate is the smallest non-zero Threshold of a throttling rule: one
// request per 1000 s. Slower paces are a misconfiguration, and their costs
// near the top of int64.
const minPacedRate = 1e-3

// Warm-up bounds keep the token counts of the warm-up model within range.
const (
	maxWarmUpPeriod = 24 * time.Hour
	maxColdFactor   = 1e6
	maxWarmUpTokens = 1e15
)

// warmUpTokens is the most tokens the warm-up model of r holds (see
// warmup.New).
func warmUpTokens(r *Rule) float64 {
	p := r.WarmUpPeriod.Seconds()
	return p*r.Threshold/(r.ColdFactor-1) + 2*p*r.Threshold/(1+r.ColdFactor)
}

// DefaultStatInterval is the window of a QPS rule with no StatInterval.
const DefaultStatInterval = time.Second

// DefaultColdFactor is the cold factor of a warm-up rule with none.
const DefaultColdFactor = 3.0

// Name returns the rule's ID, or its resource when it has none: how errors
// and middleware name it.
func (r *Rule) Name() string {
	if r.ID != "" {
		return r.ID
	}
	return r.Resource
}

// WithDefaults returns r with its zero-valued optional fields filled in, as
// the engine loads it.
func (r Rule) WithDefaults() Rule { return r.withDefaults() }

// withDefaults returns r with its zero-valued optional fields filled in.
func (r Rule) withDefaults() Rule {
	if r.Metric == QPS && r.StatInterval == 0 {
		r.StatInterval = DefaultStatInterval
	}
	if (r.Behavior == WarmUp || r.Behavior == WarmUpThrottle) && r.ColdFactor == 0 {
		r.ColdFactor = DefaultColdFactor
	}
	if r.Global && r.Fallback == FallbackLocal && r.LocalShare == 0 {
		r.LocalShare = 1
	}
	if r.PerKey && r.MaxKeys == 0 {
		r.MaxKeys = DefaultMaxKeys
	}
	if r.Behavior == GCRA && r.Burst == 0 {
		r.Burst = 1
	}
	if len(r.Keys) > 0 {
		r.Keys = append([]KeyLimit(nil), r.Keys...) // the caller's slice stays theirs
	}
	return r
}

// RuleError reports an invalid rule: which rule, which field, what value,
// and for a rule that is valid but could not be applied (a registry with no
// room) the cause, which it unwraps to.
type RuleError struct {
	Rule   string // the rule's ID, or its resource
	Index  int    // its position in the loaded slice
	Field  string
	Value  any
	Reason string
	Err    error // the cause, if any
}

// Error names the rule, field and value; long names and values are cut, so
// the message stays short whatever the input.
func (e *RuleError) Error() string {
	return fmt.Sprintf("flow: rule %s (#%d): %s %s, got %s", names.Abbrev(e.Rule), e.Index, e.Field, e.Reason, names.Value(e.Value))
}

// ErrInvalidRule matches every RuleError with errors.Is.
var ErrInvalidRule = errors.New("flow: invalid rule")

// Is makes errors.Is(err, ErrInvalidRule) true.
func (e *RuleError) Is(target error) bool { return target == ErrInvalidRule }

// Unwrap returns the cause, if any.
func (e *RuleError) Unwrap() error { return e.Err }

// errorf returns a RuleError for rule i.
func (r *Rule) errorf(i int, field string, value any, reason string, args ...any) *RuleError {
	if len(args) > 0 {
		reason = fmt.Sprintf(reason, args...)
	}
	return &RuleError{Rule: r.Name(), Index: i, Field: field, Value: value, Reason: reason}
}

// validate checks a rule with defaults applied.
func (r *Rule) validate(i int) error {
	bad := func(field string, value any, reason string) error { return r.errorf(i, field, value, reason) }
	switch {
	case r.Resource == "":
		return bad("Resource", `""`, "must not be empty")
	case len(r.Resource) > stat.MaxNameLen:
		return bad("Resource", names.Abbrev(r.Resource), fmt.Sprintf("must be at most %d bytes", stat.MaxNameLen))
	case len(r.ID) > stat.MaxNameLen:
		return bad("ID", names.Abbrev(r.ID), fmt.Sprintf("must be at most %d bytes", stat.MaxNameLen))
	case len(r.RelatedResource) > stat.MaxNameLen:
		return bad("RelatedResource", names.Abbrev(r.RelatedResource), fmt.Sprintf("must be at most %d bytes", stat.MaxNameLen))
	case math.IsNaN(r.Threshold) || math.IsInf(r.Threshold, 0) || r.Threshold < 0:
		return bad("Threshold", r.Threshold, "must be a finite number >= 0")
	case r.Threshold > MaxThreshold:
		return bad("Threshold", r.Threshold, fmt.Sprintf("must be at most MaxThreshold (%g)", float64(MaxThreshold)))
	case r.Metric > Concurrency:
		return bad("Metric", r.Metric, "must be QPS or Concurrency")
	case r.Behavior > GCRA:
		return bad("Behavior", r.Behavior, "must be Reject, WarmUp, Throttle, WarmUpThrottle or GCRA")
	case r.Behavior != GCRA && r.Burst != 0:
		return bad("Burst", r.Burst, "is for GCRA rules (leave it zero otherwise)")
	case r.Behavior == GCRA && (r.Burst < 1 || r.Burst > MaxBurst):
		return bad("Burst", r.Burst, fmt.Sprintf("must be in [1, %d]", MaxBurst))
	case r.Behavior == GCRA && (r.PerKey || r.RelatedResource != "" || r.DryRun):
		return bad("Behavior", r.Behavior, "GCRA is for plain local or Global rules (not PerKey, related or DryRun)")
	case r.Behavior == GCRA && r.Threshold > 0 && r.Threshold < minPacedRate:
		return bad("Threshold", r.Threshold, "must be 0 or at least 0.001 (one request per 1000 s) for GCRA")
	case r.Behavior == GCRA && r.StatInterval != DefaultStatInterval:
		return bad("StatInterval", r.StatInterval, "must be 1s (or left zero) for GCRA rules, which have no window")
	case r.Metric == Concurrency && r.Behavior != Reject:
		return bad("Behavior", r.Behavior, "must be Reject for a Concurrency rule")
	case r.Metric == Concurrency && r.StatInterval != 0:
		return bad("StatInterval", r.StatInterval, "must be 0 for a Concurrency rule")
	case r.Metric == QPS && (r.StatInterval < time.Millisecond || r.StatInterval%time.Millisecond != 0):
		return bad("StatInterval", r.StatInterval, "must be a positive whole number of milliseconds")
	case r.StatInterval > time.Hour:
		return bad("StatInterval", r.StatInterval, "must be at most 1h")
	case r.MaxQueueing < 0 || r.MaxQueueing > time.Hour:
		return bad("MaxQueueing", r.MaxQueueing, "must be in [0, 1h]")
	case (r.Behavior == Throttle || r.Behavior == WarmUpThrottle) && r.Threshold > 0 && r.Threshold < minPacedRate:
		return bad("Threshold", r.Threshold, "must be 0 or at least 0.001 (one request per 1000 s) for "+r.Behavior.String())
	case r.RelatedResource == r.Resource:
		return bad("RelatedResource", r.RelatedResource, "must differ from Resource")
	case r.Metric == Concurrency && r.Global:
		return bad("Global", r.Global, "is not supported for Concurrency rules")
	case r.Fallback > FallbackClosed:
		return bad("Fallback", r.Fallback, "must be Local, Open or Closed")
	case r.Global && r.Fallback == FallbackLocal && (math.IsNaN(r.LocalShare) || r.LocalShare <= 0 || r.LocalShare > 1):
		return bad("LocalShare", r.LocalShare, "must be in (0, 1]")
	case r.Global && r.RelatedResource != "":
		return bad("RelatedResource", r.RelatedResource, "cannot be combined with Global")
	case r.DryRun && (r.Metric != QPS || r.Behavior != Reject || r.PerKey || r.Global || r.RelatedResource != ""):
		return bad("DryRun", r.DryRun, "is for QPS rules with Behavior Reject on their own resource's rate (not PerKey, Global or related)")
	case r.SpanExact && (r.Metric != QPS || r.Behavior != Reject || r.PerKey || r.RelatedResource != "" || r.DryRun):
		return bad("SpanExact", r.SpanExact, "is for QPS rules with Behavior Reject on their own resource's rate (not PerKey, related or DryRun)")
	case r.Global && r.Behavior != Reject && r.Behavior != GCRA:
		return bad("Behavior", r.Behavior, "must be Reject or GCRA for a Global rule")
	case r.Behavior == GCRA && r.Threshold > 0 && float64(r.Burst)/r.Threshold > maxGCRARefill.Seconds():
		return bad("Burst", r.Burst, fmt.Sprintf("takes %.4g s to refill at Threshold %g, more than a GCRA rule allows (%v)", float64(r.Burst)/r.Threshold, r.Threshold, maxGCRARefill))
	case r.Global && r.Behavior == GCRA && r.Fallback == FallbackLocal && r.Threshold > 0 && r.Threshold*r.LocalShare < minPacedRate:
		return bad("LocalShare", r.LocalShare, fmt.Sprintf("leaves a local rate of %g/s, below 0.001 (one request per 1000 s), for a GCRA rule of Threshold %g", r.Threshold*r.LocalShare, r.Threshold))
	case r.RelatedResource != "" && (r.Metric != QPS || r.Behavior != Reject):
		return bad("RelatedResource", r.RelatedResource, "needs a QPS rule with Behavior Reject")
	case r.Metric == QPS && (r.Behavior == Throttle || r.Behavior == WarmUpThrottle || r.RelatedResource != "") && r.StatInterval != DefaultStatInterval:
		// Pacing has no window, and a related rule reads the other
		// resource's rate over its second window.
		what := r.Behavior.String() + " rules"
		if r.RelatedResource != "" {
			what = "a related-resource rule"
		}
		return bad("StatInterval", r.StatInterval, "must be 1s (or left zero) for "+what)
	}
	if r.PerKey {
		if err := r.validatePerKey(i); err != nil {
			return err
		}
	}
	if r.Behavior == WarmUp || r.Behavior == WarmUpThrottle {
		switch {
		case r.WarmUpPeriod <= 0:
			return bad("WarmUpPeriod", r.WarmUpPeriod, "must be > 0 for "+r.Behavior.String())
		case r.WarmUpPeriod > maxWarmUpPeriod:
			return bad("WarmUpPeriod", r.WarmUpPeriod, "must be at most 24h")
		case math.IsNaN(r.ColdFactor) || r.ColdFactor <= 1 || r.ColdFactor > maxColdFactor:
			return bad("ColdFactor", r.ColdFactor, "must be > 1 and at most 1e6")
		case warmUpTokens(r) > maxWarmUpTokens:
			return bad("ColdFactor", r.ColdFactor, fmt.Sprintf("is too close to 1 for this WarmUpPeriod and Threshold: the warm-up model would hold %.3g tokens, more than %g", warmUpTokens(r), float64(maxWarmUpTokens)))
		}
	}
	return r.validateUnused(i)
}

// validateUnused refuses a value in a field that does nothing for the
// rule's metric and behaviour: it is a misconfiguration (a MaxQueueing meant
// for a Throttle rule set on a Reject one), better caught at load. Fields
// that withDefaults fills in are set only where they apply.
func (r *Rule) validateUnused(i int) error {
	warm := r.Behavior == WarmUp || r.Behavior == WarmUpThrottle
	for _, f := range [...]struct {
		name  string
		value any
		set   bool
		used  bool
		where string
	}{
		{"WarmUpPeriod", r.WarmUpPeriod, r.WarmUpPeriod != 0, warm, "WarmUp and WarmUpThrottle rules"},
		{"ColdFactor", r.ColdFactor, r.ColdFactor != 0, warm, "WarmUp and WarmUpThrottle rules"},
		{"MaxQueueing", r.MaxQueueing, r.MaxQueueing != 0, r.Behavior == Throttle || r.Behavior == WarmUpThrottle, "Throttle and WarmUpThrottle rules"},
		{"Fallback", r.Fallback, r.Fallback != FallbackLocal, r.Global, "Global rules"},
		{"LocalShare", r.LocalShare, r.LocalShare != 0, r.Global && r.Fallback == FallbackLocal, "Global rules with Fallback Local"},
		{"MaxKeys", r.MaxKeys, r.MaxKeys != 0, r.PerKey, "PerKey rules"},
		{"Keys", len(r.Keys), len(r.Keys) != 0, r.PerKey, "PerKey rules"},
	} {
		if f.set && !f.used {
			return r.errorf(i, f.name, f.value, "is used only by "+f.where+" and must be left zero here")
		}
	}
	return nil
}

// validatePerKey checks what a PerKey rule adds.
func (r *Rule) validatePerKey(i int) error {
	bad := func(field string, value any, reason string) error { return r.errorf(i, field, value, reason) }
	switch {
	case r.Behavior == WarmUp || r.Behavior == WarmUpThrottle:
		return bad("Behavior", r.Behavior, "must be Reject or Throttle for a PerKey rule")
	case r.RelatedResource != "":
		return bad("RelatedResource", r.RelatedResource, "cannot be combined with PerKey")
	case r.MaxKeys < 1 || r.MaxKeys > MaxMaxKeys:
		return bad("MaxKeys", r.MaxKeys, fmt.Sprintf("must be in [1, %d]", MaxMaxKeys))
	case len(r.Keys) > maxKeyLimits:
		return bad("Keys", len(r.Keys), fmt.Sprintf("must list at most %d keys", maxKeyLimits))
	}
	if err := r.validateKeyThreshold(i, "Threshold", r.Threshold); err != nil {
		return err
	}
	seen := make(map[string]bool, len(r.Keys))
	for k, kl := range r.Keys {
		field := fmt.Sprintf("Keys[%d]", k)
		switch {
		case kl.Key == "":
			return bad(field+".Key", `""`, "must not be empty")
		case len(kl.Key) > MaxKeyLen:
			return bad(field+".Key", names.Abbrev(kl.Key), fmt.Sprintf("must be at most %d bytes", MaxKeyLen))
		case seen[kl.Key]:
			return bad(field+".Key", names.Abbrev(kl.Key), "is listed twice")
		case math.IsNaN(kl.Threshold) || math.IsInf(kl.Threshold, 0) || kl.Threshold < 0 || kl.Threshold > MaxThreshold:
			return bad(field+".Threshold", kl.Threshold, fmt.Sprintf("must be a finite number in [0, %g]", float64(MaxThreshold)))
		}
		seen[kl.Key] = true
		if err := r.validateKeyThreshold(i, field+".Threshold", kl.Threshold); err != nil {
			return err
		}
	}
	return nil
}

// validateKeyThreshold checks a per-key threshold against what a key's
// compact state holds.
func (r *Rule) validateKeyThreshold(i int, field string, t float64) error {
	switch {
	case r.Metric == QPS && r.Behavior == Reject && perWindow(t, r.StatInterval) > MaxKeyWindowCount:
		return r.errorf(i, field, t, "admits %d per window, more than a key's window holds (MaxKeyWindowCount, %d)", perWindow(t, r.StatInterval), int64(MaxKeyWindowCount))
	case r.Behavior == Throttle && t > 0 && t < minPacedRate:
		return r.errorf(i, field, t, "must be 0 or at least 0.001 (one request per 1000 s) for Throttle")
	}
	return nil
}
