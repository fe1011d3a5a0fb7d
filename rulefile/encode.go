package rulefile

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/leapflow/leapflow/flow"
)

func asYAML(err error, target *yaml.Error) bool { return errors.As(err, target) }

// Format writes rules in the normal form (see the package doc) as YAML. It
// reads its own output back and fails rather than write a file that would
// not give the same rules.
func Format(rules []flow.Rule) ([]byte, error) {
	var b strings.Builder
	if len(rules) == 0 {
		b.WriteString("rules: []\n")
	} else {
		b.WriteString("rules:\n")
	}
	for _, r := range rules {
		writeRule(&b, r)
	}
	out := []byte(b.String())
	back, err := Parse("the normal form", out)
	if err != nil {
		return nil, fmt.Errorf("rulefile: the normal form does not read back: %w", err)
	}
	for i := range rules {
		if !sameRule(back[i], rules[i]) {
			return nil, fmt.Errorf("rulefile: rule #%d does not read back the same from the normal form", i)
		}
	}
	return out, nil
}

// sameRule compares rules as the engine loads them (defaults filled in),
// NaN thresholds equal to themselves.
func sameRule(a, b flow.Rule) bool {
	return fmt.Sprintf("%#v", a.WithDefaults()) == fmt.Sprintf("%#v", b.WithDefaults())
}

// writeRule writes one rule, leaving out what the engine fills in by
// default.
func writeRule(b *strings.Builder, r flow.Rule) {
	first := true
	field := func(key, value string) {
		if first {
			b.WriteString("  - ")
			first = false
		} else {
			b.WriteString("    ")
		}
		if value == "" {
			b.WriteString(key + ":\n")
			return
		}
		b.WriteString(key + ": " + value + "\n")
	}
	d := r.WithDefaults()
	blank := flow.Rule{Resource: r.Resource, Metric: r.Metric, Behavior: r.Behavior, Global: r.Global,
		Fallback: r.Fallback, PerKey: r.PerKey}.WithDefaults()
	if r.ID != "" {
		field("id", quote(r.ID))
	}
	field("resource", quote(r.Resource))
	if r.Metric != flow.QPS {
		field("metric", r.Metric.String())
	}
	field("threshold", num(r.Threshold))
	if d.StatInterval != blank.StatInterval {
		field("statInterval", dur(d.StatInterval))
	}
	if r.Behavior != flow.Reject {
		field("behavior", r.Behavior.String())
	}
	if r.WarmUpPeriod != 0 {
		field("warmUpPeriod", dur(r.WarmUpPeriod))
	}
	if d.ColdFactor != blank.ColdFactor {
		field("coldFactor", num(d.ColdFactor))
	}
	if r.MaxQueueing != 0 {
		field("maxQueueing", dur(r.MaxQueueing))
	}
	if d.Burst != blank.Burst {
		field("burst", strconv.Itoa(d.Burst))
	}
	if r.RelatedResource != "" {
		field("relatedResource", quote(r.RelatedResource))
	}
	if r.Global {
		field("global", "true")
	}
	if r.Fallback != flow.FallbackLocal {
		field("fallback", r.Fallback.String())
	}
	if d.LocalShare != blank.LocalShare {
		field("localShare", num(d.LocalShare))
	}
	if r.PerKey {
		field("perKey", "true")
	}
	if d.MaxKeys != blank.MaxKeys {
		field("maxKeys", strconv.Itoa(d.MaxKeys))
	}
	if len(r.Keys) > 0 {
		field("keys", "")
		for _, k := range r.Keys {
			b.WriteString("      - key: " + quote(k.Key) + "\n        threshold: " + num(k.Threshold) + "\n")
		}
	}
	if r.DryRun {
		field("dryRun", "true")
	}
	if r.SpanExact {
		field("spanExact", "true")
	}
}

// plain matches strings YAML reads back as themselves unquoted (and that
// are no other type): names such as "GET /items/{id}" stay readable.
var plain = regexp.MustCompile(`^[A-Za-z_/][A-Za-z0-9_./{}$@()-]*( [A-Za-z0-9_./{}$@()-]+)*$`)

// quote writes s plain when that reads back as the same string, else
// double-quoted.
func quote(s string) string {
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "on", "off", "null", "y", "n":
		return strconv.Quote(s)
	}
	if plain.MatchString(s) {
		return s
	}
	return strconv.Quote(s)
}

// num writes a number in full: whole numbers without a point, others in
// decimal (never an exponent).
func num(f float64) string {
	switch {
	case math.IsNaN(f):
		return ".nan"
	case math.IsInf(f, 1):
		return ".inf"
	case math.IsInf(f, -1):
		return "-.inf"
	}
	return strconv.FormatFloat(f, 'f', -1, 64)
}

func dur(d time.Duration) string { return d.String() }
