package rulefile

import (
	"bytes"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"github.com/leapflow/leapflow/flow"
)

// Bounds on what a rule file may hold: beyond them a small file could cost
// the parser without bound.
const (
	// MaxFileSize is the largest rule file read (8 MiB).
	MaxFileSize = 8 << 20
	// maxDepth bounds the nesting of [ and { in a file.
	maxDepth = 64
)

// bom is UTF-8's byte-order mark, skipped before a file's first line.
var bom = []byte("\xef\xbb\xbf")

// rawRule is a rule as the file spells it, each key's position kept for
// errors.
type rawRule struct {
	fields map[string]ast.Node
	order  []string
	keys   []rawKey
	at     *token.Position // the rule's item
	lines  map[string]int  // the line of each key
	cols   map[string]int  // and its column
	start  int             // the line the rule starts on (its "-")
}

type rawKey struct {
	key, threshold ast.Node
	at             *token.Position
}

// The keys of a rule, in the order the normal form writes them.
var ruleKeys = []string{"id", "resource", "metric", "threshold", "statInterval", "behavior", "warmUpPeriod",
	"coldFactor", "maxQueueing", "burst", "relatedResource", "global", "fallback", "localShare", "perKey", "maxKeys", "keys", "dryRun", "spanExact",
	"breaker", "system", "maxRT", "minRequests", "retryTimeout", "probeTimeout", "buckets"}

// decoder turns a file's syntax tree into rules, with errors placed.
type decoder struct{ name string }

func (d *decoder) errAt(n ast.Node, rule, format string, args ...any) *Error {
	e := &Error{File: d.name, Rule: rule, Msg: fmt.Sprintf(format, args...)}
	if n != nil {
		if tok := n.GetToken(); tok != nil && tok.Position != nil {
			e.Line, e.Column = tok.Position.Line, tok.Position.Column
		}
	}
	return e
}

// parse reads data into raw rules. See Parse.
func (d *decoder) parse(data []byte) ([]rawRule, error) {
	data = bytes.TrimPrefix(data, bom)
	switch {
	case len(data) > MaxFileSize:
		return nil, &Error{File: d.name, Msg: fmt.Sprintf("the file is %d bytes, more than %d", len(data), MaxFileSize)}
	case len(bytes.TrimSpace(stripComments(data))) == 0:
		return nil, &Error{File: d.name, Msg: `the file is empty: write "rules: []" to clear every rule`}
	}
	if line, ok := tooDeep(data); !ok {
		return nil, &Error{File: d.name, Line: line, Msg: fmt.Sprintf("nested deeper than %d levels", maxDepth)}
	}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, d.syntax(err)
	}
	if len(f.Docs) != 1 {
		return nil, d.errAt(f.Docs[min(1, len(f.Docs)-1)], "", "%d documents: a rule file holds one (no ---)", len(f.Docs))
	}
	top, err := d.pairs(f.Docs[0].Body, "", "the file")
	if err != nil {
		return nil, err
	}
	var rules ast.Node
	for _, p := range top {
		if p.key != "rules" {
			return nil, d.errAt(p.keyNode, "", "unknown field %q (a rule file has only rules)", p.key)
		}
		rules = p.value
	}
	if rules == nil {
		return nil, &Error{File: d.name, Line: 1, Msg: `no "rules" key: write "rules: []" to clear every rule`}
	}
	seq, ok := rules.(*ast.SequenceNode)
	if !ok {
		if err := refuse(d, rules, ""); err != nil {
			return nil, err
		}
		return nil, d.errAt(rules, "", "rules must be a list of rules (rules: [] clears every rule)")
	}
	out := make([]rawRule, len(seq.Values))
	for i, item := range seq.Values {
		rule := fmt.Sprintf("#%d", i)
		pairs, err := d.pairs(item, rule, "a rule")
		if err != nil {
			return nil, err
		}
		r := rawRule{fields: map[string]ast.Node{}, lines: map[string]int{}, cols: map[string]int{}, at: item.GetToken().Position}
		r.start = r.at.Line
		if !seq.IsFlowStyle && i < len(seq.Entries) && seq.Entries[i].Start != nil { // its "-" (in a flow list, the comma before it)
			r.start = seq.Entries[i].Start.Position.Line
		}
		for _, p := range pairs {
			if !known(p.key) {
				return nil, d.errAt(p.keyNode, rule, "unknown field %q", p.key)
			}
			r.fields[p.key] = p.value
			r.lines[p.key] = p.keyNode.GetToken().Position.Line
			r.cols[p.key] = p.keyNode.GetToken().Position.Column
			r.order = append(r.order, p.key)
		}
		if ks, ok := r.fields["keys"]; ok {
			if r.keys, err = d.keyList(ks, rule); err != nil {
				return nil, err
			}
		}
		out[i] = r
	}
	return out, nil
}

func known(key string) bool {
	for _, k := range ruleKeys {
		if k == key {
			return true
		}
	}
	return false
}

func (d *decoder) keyList(n ast.Node, rule string) ([]rawKey, error) {
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		if err := refuse(d, n, rule); err != nil {
			return nil, err
		}
		return nil, d.errAt(n, rule, "keys must be a list of key and threshold")
	}
	var out []rawKey
	for _, item := range seq.Values {
		pairs, err := d.pairs(item, rule, "a key")
		if err != nil {
			return nil, err
		}
		k := rawKey{at: item.GetToken().Position}
		for _, p := range pairs {
			switch p.key {
			case "key":
				k.key = p.value
			case "threshold":
				k.threshold = p.value
			default:
				return nil, d.errAt(p.keyNode, rule, "unknown field %q in keys (key, threshold)", p.key)
			}
		}
		out = append(out, k)
	}
	return out, nil
}

type pair struct {
	key            string
	keyNode, value ast.Node
}

// pairs returns a mapping's pairs in document order, refusing duplicate
// keys and what the files do not use (anchors, aliases, merge keys,
// tags).
func (d *decoder) pairs(n ast.Node, rule, what string) ([]pair, error) {
	if err := refuse(d, n, rule); err != nil {
		return nil, err
	}
	var values []*ast.MappingValueNode
	switch m := n.(type) {
	case *ast.MappingNode:
		values = m.Values
	case *ast.MappingValueNode:
		values = []*ast.MappingValueNode{m}
	default:
		return nil, d.errAt(n, rule, "%s must be a mapping of keys to values", what)
	}
	var out []pair
	seen := map[string]bool{}
	for _, v := range values {
		if err := refuse(d, v.Key, rule); err != nil {
			return nil, err
		}
		if err := refuse(d, v.Value, rule); err != nil {
			return nil, err
		}
		key, ok := v.Key.(*ast.StringNode)
		if !ok {
			return nil, d.errAt(v.Key, rule, "a key must be a name")
		}
		if seen[key.Value] {
			return nil, d.errAt(v.Key, rule, "%q appears twice", key.Value)
		}
		seen[key.Value] = true
		out = append(out, pair{key: key.Value, keyNode: v.Key, value: v.Value})
	}
	return out, nil
}

// refuse refuses what rule files do not use: anchors and aliases (a small
// file could expand without bound), merge keys and tags.
func refuse(d *decoder, n ast.Node, rule string) error {
	switch n.(type) {
	case *ast.AnchorNode, *ast.AliasNode, *ast.MergeKeyNode:
		return d.errAt(n, rule, "anchors, aliases and merge keys are not supported in rule files")
	case *ast.TagNode:
		return d.errAt(n, rule, "tags (!!...) are not supported in rule files")
	}
	return nil
}

// tooDeep reports the line where [ and { nest deeper than maxDepth, if
// they do (a cheap scan before the parser, whose cost grows with depth).
func tooDeep(data []byte) (int, bool) {
	depth, line := 0, 1
	var quote byte
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case c == '\n':
			line++
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '[' || c == '{':
			if depth++; depth > maxDepth {
				return line, false
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return 0, true
}

// syntax places a parser error.
func (d *decoder) syntax(err error) error {
	e := &Error{File: d.name, Msg: err.Error()}
	var ye yaml.Error
	if asYAML(err, &ye) {
		e.Msg = ye.GetMessage()
		if tok := ye.GetToken(); tok != nil && tok.Position != nil {
			e.Line, e.Column = tok.Position.Line, tok.Position.Column
		}
	}
	return e
}

// The scalar readers: each refuses another type with the key's name, so a
// number in a string field (a tenant 00123, read as 83 by YAML) must be
// quoted rather than silently changed.

func (d *decoder) str(n ast.Node, key, rule string) (string, error) {
	var s string
	switch v := n.(type) {
	case *ast.StringNode:
		s = v.Value
	case *ast.LiteralNode:
		s = v.Value.Value
	default:
		return "", d.errAt(n, rule, "%s: %s is not a string: quote it", key, text(n))
	}
	if strings.IndexByte(s, 0) >= 0 {
		// A name with a NUL byte reads differently in C tools, logs and
		// terminals than in the engine: refused, not cut short.
		return "", d.errAt(n, rule, "%s: %q holds a NUL byte (\\0), which no name may hold", key, s)
	}
	return s, nil
}

func (d *decoder) num(n ast.Node, key, rule string) (float64, error) {
	switch v := n.(type) {
	case *ast.IntegerNode:
		switch x := v.Value.(type) {
		case int64:
			return float64(x), nil
		case uint64:
			return float64(x), nil
		}
	case *ast.FloatNode:
		return v.Value, nil
	case *ast.InfinityNode:
		return v.Value, nil
	case *ast.NanNode:
		return math.NaN(), nil
	case *ast.StringNode:
		if x, ok := exponent(v); ok {
			return x, nil
		}
	}
	return 0, d.errAt(n, rule, "%s: %s is not a number", key, text(n))
}

// exponentForm is a decimal number with an exponent, as JSON writes one
// (1e6, 2.5E-3): YAML's core schema reads it as a string when it has no
// dot (1e6), so num and integer read it here.
var exponentForm = regexp.MustCompile(`^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$`)

// exponent reads an unquoted scalar in exponent form; a quoted one stays
// a string.
func exponent(v *ast.StringNode) (float64, bool) {
	tok := v.GetToken()
	if tok == nil || tok.Type != token.StringType || !exponentForm.MatchString(v.Value) {
		return 0, false
	}
	x, err := strconv.ParseFloat(v.Value, 64)
	return x, err == nil
}

func (d *decoder) integer(n ast.Node, key, rule string) (int, error) {
	if v, ok := n.(*ast.IntegerNode); ok {
		switch x := v.Value.(type) {
		case int64:
			if x >= math.MinInt32 && x <= math.MaxInt32 {
				return int(x), nil
			}
		case uint64:
			if x <= math.MaxInt32 {
				return int(x), nil
			}
		}
		return 0, d.errAt(n, rule, "%s: %s is out of range", key, text(n))
	}
	// A whole number written with an exponent or a fraction: 1e3, 1.0e3,
	// 1000.0.
	x, read := 0.0, false
	switch v := n.(type) {
	case *ast.StringNode:
		x, read = exponent(v)
	case *ast.FloatNode:
		x, read = v.Value, true
	}
	if read && x == math.Trunc(x) {
		if x >= math.MinInt32 && x <= math.MaxInt32 {
			return int(x), nil
		}
		return 0, d.errAt(n, rule, "%s: %s is out of range", key, text(n))
	}
	return 0, d.errAt(n, rule, "%s: %s is not a whole number", key, text(n))
}

func (d *decoder) boolean(n ast.Node, key, rule string) (bool, error) {
	if v, ok := n.(*ast.BoolNode); ok {
		return v.Value, nil
	}
	return false, d.errAt(n, rule, "%s: %s is not true or false", key, text(n))
}

func (d *decoder) duration(n ast.Node, key, rule string) (time.Duration, error) {
	s, err := d.str(n, key, rule)
	if err != nil {
		return 0, d.errAt(n, rule, "%s: %s is not a duration (such as 500ms, 1m30s)", key, text(n))
	}
	v, perr := time.ParseDuration(s)
	if perr != nil {
		return 0, d.errAt(n, rule, "%s: %q is not a duration (such as 500ms, 1m30s)", key, s)
	}
	return v, nil
}

// text is how a value is quoted in errors.
func text(n ast.Node) string {
	if _, ok := n.(*ast.NullNode); ok {
		return "null"
	}
	if tok := n.GetToken(); tok != nil {
		return fmt.Sprintf("%q", tok.Value)
	}
	return strings.TrimSpace(n.String())
}

// rule makes the flow.Rule of raw rule i: the file's own checks (required
// keys, types, enum names, durations, explicit zeros that would read as
// defaults).
func (d *decoder) rule(i int, r *rawRule) (flow.Rule, error) {
	var out flow.Rule
	rule := fmt.Sprintf("#%d", i)
	if n, ok := r.fields["id"]; ok {
		id, err := d.str(n, "id", rule)
		if err != nil {
			return out, err
		}
		out.ID, rule = id, fmt.Sprintf("%q", id)
	}
	if n, ok := r.fields["resource"]; ok {
		res, err := d.str(n, "resource", rule)
		if err != nil {
			return out, err
		}
		out.Resource = res
		if out.ID == "" {
			rule = fmt.Sprintf("%q", res)
		}
	}
	at := func(key string) ast.Node { return r.fields[key] }
	th, ok := r.fields["threshold"]
	if !ok {
		e := &Error{File: d.name, Rule: rule, Msg: "threshold is required (0 blocks everything)"}
		if r.at != nil {
			e.Line, e.Column = r.at.Line, r.at.Column
		}
		return out, e
	}
	var err error
	if out.Threshold, err = d.num(th, "threshold", rule); err != nil {
		return out, err
	}
	for _, key := range r.order {
		n := at(key)
		switch key {
		case "metric", "behavior", "fallback", "breaker", "system":
			s, err := d.str(n, key, rule)
			if err != nil {
				return out, err
			}
			into := map[string]interface{ UnmarshalText([]byte) error }{
				"metric": &out.Metric, "behavior": &out.Behavior, "fallback": &out.Fallback, "breaker": &out.Breaker, "system": &out.System}[key]
			if err := into.UnmarshalText([]byte(s)); err != nil {
				return out, d.errAt(n, rule, "%s", strings.TrimPrefix(err.Error(), "flow: "))
			}
		case "statInterval", "warmUpPeriod", "maxQueueing", "maxRT", "retryTimeout", "probeTimeout":
			v, err := d.duration(n, key, rule)
			if err != nil {
				return out, err
			}
			if v == 0 && key == "statInterval" {
				return out, d.errAt(n, rule, "statInterval: 0 is no window: leave the key out for the default (1s)")
			}
			if v == 0 && (key == "retryTimeout" || key == "probeTimeout") {
				return out, d.errAt(n, rule, "%s: 0 is no timeout: leave the key out for the default", key)
			}
			*map[string]*time.Duration{"statInterval": &out.StatInterval, "warmUpPeriod": &out.WarmUpPeriod, "maxQueueing": &out.MaxQueueing,
				"maxRT": &out.MaxRT, "retryTimeout": &out.RetryTimeout, "probeTimeout": &out.ProbeTimeout}[key] = v
		case "coldFactor", "localShare":
			v, err := d.num(n, key, rule)
			if err != nil {
				return out, err
			}
			if v == 0 {
				return out, d.errAt(n, rule, "%s: 0 would read as the default: leave the key out for it", key)
			}
			*map[string]*float64{"coldFactor": &out.ColdFactor, "localShare": &out.LocalShare}[key] = v
		case "maxKeys", "burst", "minRequests", "buckets":
			v, err := d.integer(n, key, rule)
			if err != nil {
				return out, err
			}
			if v == 0 {
				return out, d.errAt(n, rule, "%s: 0 would read as the default: leave the key out for it", key)
			}
			*map[string]*int{"maxKeys": &out.MaxKeys, "burst": &out.Burst, "minRequests": &out.MinRequests, "buckets": &out.Buckets}[key] = v
		case "relatedResource":
			if out.RelatedResource, err = d.str(n, key, rule); err != nil {
				return out, err
			}
		case "global", "perKey", "dryRun", "spanExact":
			v, err := d.boolean(n, key, rule)
			if err != nil {
				return out, err
			}
			*map[string]*bool{"global": &out.Global, "perKey": &out.PerKey, "dryRun": &out.DryRun, "spanExact": &out.SpanExact}[key] = v
		}
	}
	for j, k := range r.keys {
		if k.key == nil || k.threshold == nil {
			e := &Error{File: d.name, Rule: rule, Msg: fmt.Sprintf("keys[%d]: key and threshold are required", j)}
			if k.at != nil {
				e.Line, e.Column = k.at.Line, k.at.Column
			}
			return out, e
		}
		key, err := d.str(k.key, "key", rule)
		if err != nil {
			return out, err
		}
		t, err := d.num(k.threshold, "threshold", rule)
		if err != nil {
			return out, err
		}
		out.Keys = append(out.Keys, flow.KeyLimit{Key: key, Threshold: t})
	}
	return out, nil
}
