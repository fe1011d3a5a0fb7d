package flow

import "fmt"

// The enums marshal as their names ("QPS", "Throttle", "Local") through
// encoding.TextMarshaler, so rules read and write as text in JSON and
// YAML; unmarshalling an unknown name is an error listing the valid ones.

// Metric is what a rule limits.
type Metric uint8

const (
	// QPS limits admissions per second, counted in a sliding window.
	QPS Metric = iota
	// Concurrency limits requests in flight (entered, not yet exited).
	Concurrency
)

// String returns the metric's name as rule files write it ("QPS",
// "Concurrency").
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
	// once. Its state is the theoretical arrival time of the next
	// request, moved by compare-and-swap (the generic cell rate
	// algorithm), exact at any concurrency. When the burst allows, each P
	// leases short runs of that time (at most 50 µs of tokens, and an
	// eighth of Burst over all Ps) so that cores do not take turns at one
	// word: a caller alone gets exactly x/time/rate's decisions, and under
	// contention what other Ps' runs hold unused (at most that eighth) is
	// withheld from a P until it passes. A Global GCRA rule keeps the
	// time in the shared store instead (see Rule.Global).
	GCRA
)

// String returns the behavior's name as rule files write it ("Reject",
// "WarmUp", ...).
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

// String returns the fallback's name as rule files write it ("Local",
// "Open", "Closed").
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

// BreakerStrategy makes a rule a circuit breaker, and says what trips it
// (see Rule.Breaker).
type BreakerStrategy uint8

const (
	// NotBreaker: the rule is not a circuit breaker (the default).
	NotBreaker BreakerStrategy = iota
	// SlowRatio opens when the share of requests slower than MaxRT among
	// the completions in the breaker's window reaches Threshold.
	SlowRatio
	// ErrorRatio opens when the share of failed requests reaches it.
	ErrorRatio
	// ErrorCount opens when the failed requests in the window reach it.
	ErrorCount
)

// String returns the strategy's name as rule files write it ("SlowRatio",
// "ErrorRatio", "ErrorCount"; "None" for NotBreaker).
func (s BreakerStrategy) String() string {
	switch s {
	case NotBreaker:
		return "None"
	case SlowRatio:
		return "SlowRatio"
	case ErrorRatio:
		return "ErrorRatio"
	case ErrorCount:
		return "ErrorCount"
	}
	return fmt.Sprintf("BreakerStrategy(%d)", uint8(s))
}

// BreakerState is a circuit breaker's state.
type BreakerState uint8

const (
	// BreakerClosed admits every request and counts their completions.
	BreakerClosed BreakerState = iota
	// BreakerOpen refuses every request until its RetryTimeout has passed.
	BreakerOpen
	// BreakerHalfOpen has admitted its one probe, and refuses every other
	// request until the probe completes (or its ProbeTimeout passes).
	BreakerHalfOpen
)

// String returns the state's name ("Closed", "Open", "HalfOpen").
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "Closed"
	case BreakerOpen:
		return "Open"
	case BreakerHalfOpen:
		return "HalfOpen"
	}
	return fmt.Sprintf("BreakerState(%d)", uint8(s))
}

// SystemCheck makes a rule a system rule, and says what it checks (see
// Rule.System).
type SystemCheck uint8

const (
	// NotSystem: the rule is not a system rule (the default).
	NotSystem SystemCheck = iota
	// SystemCPU refuses while the CPU usage is over Threshold.
	SystemCPU
	// SystemRT refuses while the resource's average RT is over MaxRT.
	SystemRT
	// SystemBBR refuses, while the CPU usage is over Threshold (or was in
	// the last second), requests past what the resource has shown it
	// completes in flight.
	SystemBBR
)

// String returns the check's name as rule files write it ("SystemCPU",
// "SystemRT", "SystemBBR"; "None" for NotSystem).
func (s SystemCheck) String() string {
	switch s {
	case NotSystem:
		return "None"
	case SystemCPU:
		return "SystemCPU"
	case SystemRT:
		return "SystemRT"
	case SystemBBR:
		return "SystemBBR"
	}
	return fmt.Sprintf("SystemCheck(%d)", uint8(s))
}

var (
	systemNames   = []SystemCheck{NotSystem, SystemCPU, SystemRT, SystemBBR}
	breakerNames  = []BreakerStrategy{NotBreaker, SlowRatio, ErrorRatio, ErrorCount}
	metricNames   = []Metric{QPS, Concurrency}
	behaviorNames = []Behavior{Reject, WarmUp, Throttle, WarmUpThrottle, GCRA}
	fallbackNames = []Fallback{FallbackLocal, FallbackOpen, FallbackClosed}
)

// parseEnum finds text among the names of values.
func parseEnum[T fmt.Stringer](kind string, values []T, text []byte) (T, error) {
	for _, v := range values {
		if v.String() == string(text) {
			return v, nil
		}
	}
	var zero T
	valid := ""
	for i, v := range values {
		if i > 0 {
			valid += ", "
		}
		valid += v.String()
	}
	return zero, fmt.Errorf("flow: unknown %s %q (valid: %s)", kind, text, valid)
}

// checkEnum refuses to marshal a value with no name.
func checkEnum[T comparable](kind string, values []T, v T, name string) ([]byte, error) {
	for _, x := range values {
		if x == v {
			return []byte(name), nil
		}
	}
	return nil, fmt.Errorf("flow: %s %s has no name", kind, name)
}

// MarshalText implements encoding.TextMarshaler.
func (m Metric) MarshalText() ([]byte, error) { return checkEnum("metric", metricNames, m, m.String()) }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *Metric) UnmarshalText(text []byte) (err error) {
	*m, err = parseEnum("metric", metricNames, text)
	return err
}

// MarshalText implements encoding.TextMarshaler.
func (b Behavior) MarshalText() ([]byte, error) {
	return checkEnum("behavior", behaviorNames, b, b.String())
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (b *Behavior) UnmarshalText(text []byte) (err error) {
	*b, err = parseEnum("behavior", behaviorNames, text)
	return err
}

// MarshalText implements encoding.TextMarshaler.
func (f Fallback) MarshalText() ([]byte, error) {
	return checkEnum("fallback", fallbackNames, f, f.String())
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (f *Fallback) UnmarshalText(text []byte) (err error) {
	*f, err = parseEnum("fallback", fallbackNames, text)
	return err
}

// MarshalText implements encoding.TextMarshaler.
func (s BreakerStrategy) MarshalText() ([]byte, error) {
	return checkEnum("breaker strategy", breakerNames, s, s.String())
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *BreakerStrategy) UnmarshalText(text []byte) (err error) {
	*s, err = parseEnum("breaker strategy", breakerNames, text)
	return err
}

// MarshalText implements encoding.TextMarshaler.
func (s SystemCheck) MarshalText() ([]byte, error) {
	return checkEnum("system check", systemNames, s, s.String())
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *SystemCheck) UnmarshalText(text []byte) (err error) {
	*s, err = parseEnum("system check", systemNames, text)
	return err
}
