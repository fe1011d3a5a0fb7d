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
func Format(rules []flow.Rule) ([]byte, error) { return format(rules, nil) }

// format writes rules with a file's comments (nil: none) and reads them
// back.
func format(rules []flow.Rule, c *fileComments) ([]byte, error) {
	var b strings.Builder
	writeLines(&b, c.headLines(), "")
	if len(rules) == 0 {
		b.WriteString("rules: []\n")
	} else {
		b.WriteString("rules:\n")
	}
	for i, r := range rules {
		writeRule(&b, ruleFields(r), c.of(i))
	}
	writeLines(&b, c.tailLines(), "")
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

// field is a key of a rule in the normal form and its value as written
// ("" for keys, whose list follows on lines of its own).
type field struct{ key, value string }

// ruleFields are the keys the normal form writes for r, in order: those
// that differ from what the engine fills in by default.
func ruleFields(r flow.Rule) []field {
	var fs []field
	add := func(key, value string) { fs = append(fs, field{key, value}) }
	d := r.WithDefaults()
	blank := flow.Rule{Resource: r.Resource, Metric: r.Metric, Behavior: r.Behavior, Global: r.Global,
		Fallback: r.Fallback, PerKey: r.PerKey, Breaker: r.Breaker, RetryTimeout: r.RetryTimeout}.WithDefaults()
	if r.ID != "" {
		add("id", quote(r.ID))
	}
	add("resource", quote(r.Resource))
	if r.Metric != flow.QPS {
		add("metric", r.Metric.String())
	}
	add("threshold", num(r.Threshold))
	if d.StatInterval != blank.StatInterval {
		add("statInterval", dur(d.StatInterval))
	}
	if r.Behavior != flow.Reject {
		add("behavior", r.Behavior.String())
	}
	if r.WarmUpPeriod != 0 {
		add("warmUpPeriod", dur(r.WarmUpPeriod))
	}
	if d.ColdFactor != blank.ColdFactor {
		add("coldFactor", num(d.ColdFactor))
	}
	if r.MaxQueueing != 0 {
		add("maxQueueing", dur(r.MaxQueueing))
	}
	if d.Burst != blank.Burst {
		add("burst", strconv.Itoa(d.Burst))
	}
	if r.RelatedResource != "" {
		add("relatedResource", quote(r.RelatedResource))
	}
	if r.Global {
		add("global", "true")
	}
	if r.Fallback != flow.FallbackLocal {
		add("fallback", r.Fallback.String())
	}
	if d.LocalShare != blank.LocalShare {
		add("localShare", num(d.LocalShare))
	}
	if r.PerKey {
		add("perKey", "true")
	}
	if d.MaxKeys != blank.MaxKeys {
		add("maxKeys", strconv.Itoa(d.MaxKeys))
	}
	if len(r.Keys) > 0 {
		var b strings.Builder
		for _, k := range r.Keys {
			b.WriteString("\n      - key: " + quote(k.Key) + "\n        threshold: " + num(k.Threshold))
		}
		add("keys", b.String())
	}
	if r.DryRun {
		add("dryRun", "true")
	}
	if r.SpanExact {
		add("spanExact", "true")
	}
	if r.Breaker != flow.NotBreaker {
		add("breaker", r.Breaker.String())
	}
	if r.System != flow.NotSystem {
		add("system", r.System.String())
	}
	if r.MaxRT != 0 {
		add("maxRT", dur(r.MaxRT))
	}
	if r.Breaker != flow.NotBreaker {
		if d.MinRequests != blank.MinRequests {
			add("minRequests", strconv.Itoa(d.MinRequests))
		}
		add("retryTimeout", dur(r.RetryTimeout))
		if d.ProbeTimeout != d.RetryTimeout {
			add("probeTimeout", dur(d.ProbeTimeout))
		}
		if d.Buckets != blank.Buckets {
			add("buckets", strconv.Itoa(d.Buckets))
		}
	}
	return fs
}

// writeRule writes one rule's fields, each with its comments (c may be
// nil): those of the rule and of keys the normal form leaves out go
// before the rule.
func writeRule(b *strings.Builder, fs []field, c *ruleComments) {
	written := map[string]bool{}
	for _, f := range fs {
		written[f.key] = true
	}
	first := ""
	if len(fs) > 0 {
		first = fs[0].key
	}
	c.writeHead(b, first, written)
	for i, f := range fs {
		indent := "    "
		if i > 0 {
			writeLines(b, c.fieldHead(f.key), indent)
		}
		if i == 0 {
			indent = "  - "
		}
		sep := ": "
		if strings.HasPrefix(f.value, "\n") {
			sep = ":"
		}
		line := indent + f.key + sep + f.value
		if at := strings.IndexByte(line, '\n'); at >= 0 && c.fieldLine(f.key) != "" {
			line = line[:at] + " " + c.fieldLine(f.key) + line[at:]
		} else if c.fieldLine(f.key) != "" {
			line += " " + c.fieldLine(f.key)
		}
		b.WriteString(line + "\n")
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
