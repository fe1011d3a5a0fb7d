package flow

import "fmt"

// The enums marshal as their names ("QPS", "Throttle", "Local") through
// encoding.TextMarshaler, so rules read and write as text in JSON and
// YAML; unmarshalling an unknown name is an error listing the valid ones.

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
