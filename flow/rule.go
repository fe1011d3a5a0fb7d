package flow

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/internal/window"
	"github.com/leapflow/leapflow/stat"
)

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
	// flight for Concurrency, from 0 (blocks everything) to 10^12.
	// Per window, a QPS rule admits Threshold * StatInterval / 1s, which
	// must be a whole number for a window rule (Reject, WarmUp: 0.5/s over
	// 1 s is refused, 0.5/s over 2 s admits 1 per 2 s; the error says how
	// to write it); Throttle and GCRA rules take any rate.
	Threshold float64
	// StatInterval is the window a QPS rule counts in (default 1 s; a
	// positive whole number of milliseconds, at most 24 h). Rules on 1 s share the
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
	// 100,000, at most 2^24; left zero otherwise). Keys
	// listed in Keys are tracked beside them, never evicted.
	MaxKeys int
	// Keys gives specific keys of a PerKey rule their own thresholds (a
	// premium tenant at ten times the rule's, a known abuser at 0).
	Keys []KeyLimit
	// Burst is a GCRA rule's bucket: the most requests admitted at once
	// after an idle spell (default 1, at most 2^30; left zero
	// otherwise). In any span of length L a GCRA rule admits at most
	// Burst + Threshold x L; a Global one across all instances together,
	// while its source answers.
	Burst int
	// DryRun makes the rule count what it would block without blocking
	// anything (a shadow mode, to roll a new limit out safely): it checks
	// each request the resource's other rules admitted as if it were in
	// force, on state of its own (its window, key table, GCRA cell, queue;
	// a Global rule asks its token source under its own ID, a call out per
	// request the resource admits, on that request's path), and counts
	// those it would have blocked (Engine.DryRuns). A Concurrency rule
	// checks the resource's in-flight count; a Throttle rule queues up to
	// its MaxQueueing, no further, and nothing waits. Every kind but
	// PerKey Concurrency (a key's count needs each request's Exit).
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
	// their own resource's rate (not PerKey or related).
	// Span-exact rules of one resource and StatInterval admit together,
	// in a window of their own, beside the resource's plain rules. A
	// Global rule may be span-exact: the Redis source counts the extra
	// bucket on the server (see the global package), and its local
	// fallback window is span-exact too.
	SpanExact bool
	// Breaker makes the rule a circuit breaker on its resource (default
	// NotBreaker). Closed, it admits, and counts each admitted request's
	// completion (at Exit: failed when Exit's error is not nil; slow when
	// it took longer than MaxRT) in a window of its own of StatInterval in
	// Buckets buckets. When a completion fails (ErrorRatio, ErrorCount)
	// or is slow (SlowRatio) and the window holds at least MinRequests
	// completions, of which the bad ones reach Threshold (a share in
	// [0, 1] for the ratios, a whole count >= 1 for ErrorCount), it opens:
	// it refuses every request (ReasonBreaker) for RetryTimeout. Then it
	// admits exactly one request, the probe, however many arrive at once,
	// and refuses the others; the probe's completion closes it (good, its
	// window starting afresh) or opens it again (bad). A probe that has
	// not completed after ProbeTimeout gives its place to the next
	// request. Metric QPS and Behavior Reject only; not Global, PerKey,
	// related, span-exact or dry run. A resource's breakers decide after
	// its other rules admitted a request (and before its Global rules),
	// so a request another rule refuses is never the probe.
	Breaker BreakerStrategy
	// MaxRT is the longest a request may take before a SlowRatio breaker
	// counts it slow (required there: > 0, at most an hour).
	MaxRT time.Duration
	// MinRequests is the fewest completions a breaker's window must hold
	// before it may open (required for SlowRatio and ErrorRatio, default 1
	// for ErrorCount; at most 10^6).
	MinRequests int
	// RetryTimeout is how long an open breaker refuses every request
	// before it admits a probe (required for a breaker: > 0, at most an
	// hour). A refusal's RetryAfter is the time until the next probe.
	RetryTimeout time.Duration
	// ProbeTimeout is how long a breaker's probe holds its place before
	// the next request may be the probe (default RetryTimeout; at most an
	// hour).
	ProbeTimeout time.Duration
	// Buckets is the number of buckets of a breaker's window (default 10,
	// at most 100; StatInterval must be a whole number of milliseconds
	// per bucket).
	Buckets int
	// System makes the rule an overload check on its resource, read from
	// the resource's own statistics (default NotSystem): a resource that
	// takes a process's inbound requests (see the package doc's "System
	// rules") is refused (ReasonSystem) by
	//   - SystemCPU while the CPU usage (WithCPU) is over Threshold, a
	//     share in (0, 1);
	//   - SystemBBR while the CPU usage is over Threshold, or was in the
	//     last second, and more requests are in flight than the resource
	//     has shown it completes: its most completions per second in a
	//     bucket of its second window times its least RT, at least 1 ms
	//     (Sentinel's and Kratos' BBR check);
	//   - SystemRT while the average RT over its second window is over
	//     MaxRT.
	// The verdict is refreshed by the first request after it is due
	// (every 1 ms; while a BBR rule sheds, every quarter of the least RT,
	// and 1/32 of it while its verdict refuses), so the rules cost the
	// other requests two loads. They read completions: Allow on a
	// resource with a SystemBBR or SystemRT rule returns ErrNeedsExit. In
	// flight and QPS limits on the same resource are Concurrency and QPS
	// rules. Metric QPS and Behavior Reject only; not Global, PerKey,
	// related, span-exact, dry-run or breaker rules.
	System SystemCheck
}

// KeyLimit is a specific key's threshold in a PerKey rule. A Key longer
// than 256 bytes (at most 1024) is loaded, matched and shown as a request's
// key of that length stands (see WithKey): its start and a hash.
type KeyLimit struct {
	Key       string
	Threshold float64
}

// maxBurst is the largest Burst a GCRA rule accepts.
const maxBurst = 1 << 30

// maxGCRARefill is the longest a GCRA rule's bucket may take to refill
// (Burst / Threshold): a local rule keeps it in int64 nanoseconds (Burst
// times the cost of a token, which would wrap past 292 years), and the
// Redis token source in nanoseconds that must stay exact in a Lua number
// (2^53 ns is 104 days, and a decision adds up to twice this).
const maxGCRARefill = 30 * 24 * time.Hour

// maxThreshold is the largest Threshold a rule accepts: a trillion a second
// (or in flight) is beyond any real limit. A window's count must also fit
// what a bucket counts (window.MaxCount, about 9e15): an hour of it does
// (3.6e15), a day holds at most about 1e11 a second (validate).
const maxThreshold = 1e12

// minPacedRate is the smallest non-zero Threshold of a throttling rule: one
// request per 1000 s. Slower paces are a misconfiguration, and their costs
// near the top of int64.
const minPacedRate = 1e-3

// defaultStatInterval is the window of a QPS rule with no StatInterval.
const defaultStatInterval = time.Second

// maxStatInterval is the longest window: a day (a day's limit, per key
// too). A window of a day has the buckets of any other (the engine's
// sample count; a PerKey rule's 4, of 6 h each).
const maxStatInterval = 24 * time.Hour

// defaultColdFactor is the cold factor of a warm-up rule with none.
const defaultColdFactor = 3.0

// Name returns the rule's ID, or its resource when it has none: how errors
// and middleware name it.
func (r *Rule) Name() string {
	if r.ID != "" {
		return r.ID
	}
	return r.Resource
}

// WithDefaults returns r with its zero-valued optional fields filled in, as
// the engine loads it (which also writes a listed key over 256 bytes as its
// start and a hash: see KeyLimit).
func (r Rule) WithDefaults() Rule { return r.withDefaults() }

// withDefaults returns r with its zero-valued optional fields filled in.
func (r Rule) withDefaults() Rule {
	if r.Metric == QPS && r.StatInterval == 0 {
		r.StatInterval = defaultStatInterval
	}
	if (r.Behavior == WarmUp || r.Behavior == WarmUpThrottle) && r.ColdFactor == 0 {
		r.ColdFactor = defaultColdFactor
	}
	if r.Global && r.Fallback == FallbackLocal && r.LocalShare == 0 {
		r.LocalShare = 1
	}
	if r.PerKey && r.MaxKeys == 0 {
		r.MaxKeys = defaultMaxKeys
	}
	if r.Behavior == GCRA && r.Burst == 0 {
		r.Burst = 1
	}
	if len(r.Keys) > 0 {
		r.Keys = append([]KeyLimit(nil), r.Keys...) // the caller's slice stays theirs
	}
	if r.Breaker != NotBreaker {
		r.withBreakerDefaults()
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
	if e.Index < 0 {
		// The rule set as a whole.
		return fmt.Sprintf("flow: the rule set: %s %s", e.Field, e.Reason)
	}
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

// validate checks a rule with defaults applied: the fields every rule
// has, then each kind's (kinds), then that no field is set where it does
// nothing.
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
	case r.Threshold > maxThreshold:
		return bad("Threshold", r.Threshold, fmt.Sprintf("must be at most maxThreshold (%g)", float64(maxThreshold)))
	case r.Metric > Concurrency:
		return bad("Metric", r.Metric, "must be QPS or Concurrency")
	case r.Behavior > GCRA:
		return bad("Behavior", r.Behavior, "must be Reject, WarmUp, Throttle, WarmUpThrottle or GCRA")
	case r.Metric == QPS && (r.StatInterval < time.Millisecond || r.StatInterval%time.Millisecond != 0):
		return bad("StatInterval", r.StatInterval, "must be a positive whole number of milliseconds")
	case r.StatInterval > maxStatInterval:
		return bad("StatInterval", r.StatInterval, "must be at most 24h")
	case r.Metric == QPS && r.Threshold*r.StatInterval.Seconds() > window.MaxCount:
		return bad("Threshold", r.Threshold, fmt.Sprintf("admits %g per StatInterval of %v, more than a window counts (%d)", r.Threshold*r.StatInterval.Seconds(), r.StatInterval, int64(window.MaxCount)))
	case r.MaxQueueing < 0 || r.MaxQueueing > time.Hour:
		return bad("MaxQueueing", r.MaxQueueing, "must be in [0, 1h]")
	case r.Fallback > FallbackClosed:
		return bad("Fallback", r.Fallback, "must be Local, Open or Closed")
	}
	if err := r.validateWhole(i, "Threshold", r.Threshold); err != nil {
		return err
	}
	for _, k := range kinds {
		if k.validate != nil {
			if err := k.validate(r, i); err != nil {
				return err
			}
		}
	}
	return r.validateUnused(i)
}

// validateWhole checks that threshold t of a window rule (QPS, Reject or
// WarmUp, on its own resource's rate) is a whole number of requests per
// window: a window admits whole requests, so 0.5/s over 1 s would admit
// nothing and 2.5/s over 1 s only 2. The error says how to write it.
func (r *Rule) validateWhole(i int, field string, t float64) error {
	if r.Metric != QPS || r.Behavior != Reject && r.Behavior != WarmUp || r.RelatedResource != "" || r.Breaker != NotBreaker || r.System != NotSystem || wholePerWindow(t, r.StatInterval) {
		return nil
	}
	per := t * r.StatInterval.Seconds()
	how := "write it as a rate with Behavior GCRA or Throttle"
	// The shortest window in whole seconds, up to an hour, that holds a
	// whole count.
	for s := int64(1); s <= 3600; s++ {
		if d := time.Duration(s) * time.Second; d > r.StatInterval && wholePerWindow(t, d) {
			how = fmt.Sprintf("write it over a longer window, such as StatInterval %v (%d per %v), or as a rate with Behavior GCRA or Throttle", d, perWindow(t, d), d)
			break
		}
	}
	return r.errorf(i, field, t, fmt.Sprintf("is %g requests per StatInterval of %v, and a window admits whole requests (it would admit %d): %s", per, r.StatInterval, perWindow(t, r.StatInterval), how))
}

// oneSecond is the check of the kinds that have no window of their own
// (pacing, GCRA) or read another's second window (related): StatInterval
// must be left at its default.
func (r *Rule) oneSecond(i int, what string) error {
	if r.StatInterval != defaultStatInterval {
		return r.errorf(i, "StatInterval", r.StatInterval, "must be 1s (or left zero) for "+what)
	}
	return nil
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
		{"MaxRT", r.MaxRT, r.MaxRT != 0, r.Breaker == SlowRatio || r.System == SystemRT, "SlowRatio breaker and SystemRT rules"},
		{"MinRequests", r.MinRequests, r.MinRequests != 0, r.Breaker != NotBreaker, "breaker rules"},
		{"RetryTimeout", r.RetryTimeout, r.RetryTimeout != 0, r.Breaker != NotBreaker, "breaker rules"},
		{"ProbeTimeout", r.ProbeTimeout, r.ProbeTimeout != 0, r.Breaker != NotBreaker, "breaker rules"},
		{"Buckets", r.Buckets, r.Buckets != 0, r.Breaker != NotBreaker, "breaker rules"},
	} {
		if f.set && !f.used {
			return r.errorf(i, f.name, f.value, "is used only by "+f.where+" and must be left zero here")
		}
	}
	return nil
}

// String describes the rule in a few words, as the dashboard shows it:
// "api: QPS 100/s Reject", "QPS 50/s Reject span-exact over 2s",
// "Concurrency 8 in flight", "QPS 10/s Reject per key global". Each kind
// says its part.
func (r Rule) String() string {
	var b strings.Builder
	if r.ID != "" {
		b.WriteString(r.ID + ": ")
	}
	if r.System != NotSystem { // no metric: its threshold is a CPU usage
		b.WriteString(strings.TrimPrefix(kindOf(&r).describe(&r), " "))
		return b.String()
	}
	b.WriteString(r.Metric.String() + " " + strconv.FormatFloat(r.Threshold, 'g', -1, 64))
	b.WriteString(kindOf(&r).describe(&r))
	return b.String()
}

// describeRate is a rate rule's part of its description: the behaviour
// and what shapes it.
func describeRate(r *Rule) string {
	s := "/s " + r.Behavior.String()
	if r.SpanExact {
		s += " span-exact"
	}
	if r.StatInterval != 0 && r.StatInterval != defaultStatInterval {
		s += " over " + r.StatInterval.String()
	}
	if r.WarmUpPeriod != 0 {
		s += " warming " + r.WarmUpPeriod.String()
	}
	if r.MaxQueueing != 0 {
		s += " queueing " + r.MaxQueueing.String()
	}
	if r.Burst > 1 {
		s += " burst " + strconv.Itoa(r.Burst)
	}
	return s
}
