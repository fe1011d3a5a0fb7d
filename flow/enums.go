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
	// once. It is one word of state, the theoretical arrival time of the
	// next request, moved by compare-and-swap (the generic cell rate
	// algorithm), exact at any concurrency. A Global GCRA rule keeps that
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

var (
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
