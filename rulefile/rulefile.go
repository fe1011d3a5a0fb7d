// Package rulefile reads and writes leapflow rules as YAML or JSON files:
//
//	rules:
//	  - id: checkout-qps
//	    resource: checkout
//	    threshold: 500
//	  - resource: report
//	    metric: Concurrency
//	    threshold: 4
//
// Every field of flow.Rule has a key: id, resource, metric (QPS,
// Concurrency), threshold, statInterval, behavior (Reject, WarmUp,
// Throttle, WarmUpThrottle), warmUpPeriod, coldFactor, maxQueueing,
// relatedResource, global, fallback (Local, Open, Closed), localShare,
// perKey, maxKeys, keys (a list of key and threshold) and dryRun. Durations are Go
// duration strings ("500ms", "1m30s"). threshold is required: a rule
// without one is an error, never a threshold of 0 (which blocks
// everything).
//
// Decoding is strict: an unknown key (a typo such as "treshold"), a wrong
// type or an unknown enum name is an error naming the file, line and
// column, the rule and the key. JSON files are read by the same YAML
// decoder (JSON is YAML), so their errors have lines too. The rules are
// then validated by the engine's own checks (flow.Engine.CheckRules), whose
// errors are placed at the rule's key too.
//
// Format writes rules in a normal form: the keys in the order above, and
// only those that differ from what the engine fills in by default, so a
// normal file reads back to the same rules and formats to itself.
package rulefile

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/names"
)

// fileRule is flow.Rule as a file holds it. Enums and durations are read
// as strings and converted by rule, so their errors are placed at their
// keys.
type fileRule struct {
	ID              string     `yaml:"id,omitempty"`
	Resource        string     `yaml:"resource"`
	Metric          string     `yaml:"metric,omitempty"`
	Threshold       *number    `yaml:"threshold"`
	StatInterval    string     `yaml:"statInterval,omitempty"`
	Behavior        string     `yaml:"behavior,omitempty"`
	WarmUpPeriod    string     `yaml:"warmUpPeriod,omitempty"`
	ColdFactor      number     `yaml:"coldFactor,omitempty"`
	MaxQueueing     string     `yaml:"maxQueueing,omitempty"`
	RelatedResource string     `yaml:"relatedResource,omitempty"`
	Global          bool       `yaml:"global,omitempty"`
	Fallback        string     `yaml:"fallback,omitempty"`
	LocalShare      number     `yaml:"localShare,omitempty"`
	PerKey          bool       `yaml:"perKey,omitempty"`
	MaxKeys         int        `yaml:"maxKeys,omitempty"`
	Keys            []keyLimit `yaml:"keys,omitempty"`
	DryRun          bool       `yaml:"dryRun,omitempty"`
}

type keyLimit struct {
	Key       string  `yaml:"key"`
	Threshold *number `yaml:"threshold"`
}

// number is a float64 that writes as an integer when it is one ("500",
// not "500.0").
type number float64

// MarshalYAML implements yaml.InterfaceMarshaler.
func (n number) MarshalYAML() (any, error) {
	if f := float64(n); f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return int64(f), nil
	}
	return float64(n), nil
}

type file struct {
	Rules *[]fileRule `yaml:"rules"`
}

// Error is a problem in a rule file, placed at a line and column (0 when
// the file could not be read that far).
type Error struct {
	File         string
	Line, Column int
	Rule         string // the rule's ID or resource, or "#N" for the Nth (from 0), when known
	Msg          string
	Err          error // the cause, if any (a *flow.RuleError)
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Rule != "" {
		b.WriteString("rule " + e.Rule + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Parse reads the rules of one file's data; name is the file's name in
// errors. An empty file (or one of comments only) and a file without a
// rules key are errors: clearing every rule takes an explicit "rules: []".
func Parse(name string, data []byte) ([]flow.Rule, error) {
	if len(bytes.TrimSpace(stripComments(data))) == 0 {
		return nil, &Error{File: name, Msg: `the file is empty: write "rules: []" to clear every rule`}
	}
	var f file
	if err := yaml.UnmarshalWithOptions(data, &f, yaml.DisallowUnknownField(), yaml.Strict()); err != nil {
		return nil, yamlError(name, data, err)
	}
	if f.Rules == nil {
		return nil, &Error{File: name, Line: 1, Msg: `no "rules" key: write "rules: []" to clear every rule`}
	}
	rules := make([]flow.Rule, len(*f.Rules))
	for i, fr := range *f.Rules {
		r, err := fr.rule()
		if err != nil {
			return nil, placed(name, data, i, fr.name(i), err.key, err.msg, nil)
		}
		rules[i] = r
	}
	return rules, nil
}

// stripComments blanks every line that holds only a comment.
func stripComments(data []byte) []byte {
	var out []byte
	for _, line := range bytes.Split(data, []byte("\n")) {
		if t := bytes.TrimSpace(line); len(t) > 0 && t[0] != '#' {
			out = append(out, t...)
		}
	}
	return out
}

type fieldErr struct{ key, msg string }

// rule checks what only the file knows (required keys, names, durations)
// and makes the flow.Rule.
func (fr *fileRule) rule() (flow.Rule, *fieldErr) {
	if fr.Threshold == nil {
		return flow.Rule{}, &fieldErr{"threshold", "threshold is required (0 blocks everything)"}
	}
	r := flow.Rule{
		ID: fr.ID, Resource: fr.Resource, Threshold: float64(*fr.Threshold), ColdFactor: float64(fr.ColdFactor),
		RelatedResource: fr.RelatedResource, Global: fr.Global, LocalShare: float64(fr.LocalShare),
		PerKey: fr.PerKey, MaxKeys: fr.MaxKeys, DryRun: fr.DryRun,
	}
	for _, e := range []struct {
		key, text string
		into      interface{ UnmarshalText([]byte) error }
	}{{"metric", fr.Metric, &r.Metric}, {"behavior", fr.Behavior, &r.Behavior}, {"fallback", fr.Fallback, &r.Fallback}} {
		if e.text == "" {
			continue
		}
		if err := e.into.UnmarshalText([]byte(e.text)); err != nil {
			return flow.Rule{}, &fieldErr{e.key, strings.TrimPrefix(err.Error(), "flow: ")}
		}
	}
	for _, d := range []struct {
		key, text string
		into      *time.Duration
	}{{"statInterval", fr.StatInterval, &r.StatInterval}, {"warmUpPeriod", fr.WarmUpPeriod, &r.WarmUpPeriod},
		{"maxQueueing", fr.MaxQueueing, &r.MaxQueueing}} {
		if d.text == "" {
			continue
		}
		v, err := time.ParseDuration(d.text)
		if err != nil {
			return flow.Rule{}, &fieldErr{d.key, fmt.Sprintf("%s: %q is not a duration (such as 500ms, 1m30s)", d.key, d.text)}
		}
		*d.into = v
	}
	for j, k := range fr.Keys {
		if k.Threshold == nil {
			return flow.Rule{}, &fieldErr{fmt.Sprintf("keys[%d].threshold", j), "threshold is required"}
		}
		r.Keys = append(r.Keys, flow.KeyLimit{Key: k.Key, Threshold: float64(*k.Threshold)})
	}
	return r, nil
}

func (fr *fileRule) name(i int) string {
	switch {
	case fr.ID != "":
		return fmt.Sprintf("%q", fr.ID)
	case fr.Resource != "":
		return fmt.Sprintf("%q", fr.Resource)
	}
	return fmt.Sprintf("#%d", i)
}

// yamlError places a decoding error.
func yamlError(name string, data []byte, err error) error {
	e := &Error{File: name, Msg: err.Error()}
	var ye yaml.Error
	if errors.As(err, &ye) {
		e.Msg = ye.GetMessage()
		if tok := ye.GetToken(); tok != nil && tok.Position != nil {
			e.Line, e.Column = tok.Position.Line, tok.Position.Column
			if i, ok := ruleAt(data, e.Line); ok {
				e.Rule = fmt.Sprintf("#%d", i)
			}
			var te *yaml.TypeError
			if errors.As(err, &te) {
				e.Msg = typeMessage(data, e.Line, tok.Value, e.Msg)
			}
		}
	}
	return e
}

// typeMessage says what a value of the wrong type should have been, in the
// file's words rather than Go's: `threshold: "five" is not a number`.
func typeMessage(data []byte, line int, value, msg string) string {
	want := "of another type"
	for goType, word := range map[string]string{"rulefile.number": "a number", "string": "a string", "bool": "true or false",
		"int": "an integer", "[]rulefile.fileRule": "a list of rules", "[]rulefile.keyLimit": "a list of keys",
		"rulefile.fileRule": "a rule (a mapping)", "rulefile.keyLimit": "a key (a mapping)"} {
		if strings.HasSuffix(msg, "of type "+goType) {
			want = word
		}
	}
	key := "value"
	if lines := strings.Split(string(data), "\n"); line-1 < len(lines) {
		text := strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(lines[line-1]), "-{"))
		if k, _, ok := strings.Cut(text, ":"); ok {
			key = strings.Trim(strings.TrimSpace(k), `"'`)
		}
	}
	return fmt.Sprintf("%s: %q is not %s", key, value, want)
}

// ruleAt returns the index of the rule whose item holds line.
func ruleAt(data []byte, line int) (int, bool) {
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return 0, false
	}
	found := -1
	for i := 0; ; i++ {
		n := nodeAt(f, fmt.Sprintf("$.rules[%d]", i))
		if n == nil {
			break
		}
		if n.GetToken().Position.Line <= line {
			found = i
		}
	}
	return found, found >= 0
}

func nodeAt(f *ast.File, path string) ast.Node {
	p, err := yaml.PathString(path)
	if err != nil {
		return nil
	}
	n, err := p.FilterFile(f)
	if err != nil || n == nil {
		return nil
	}
	return n
}

// placed is an error at rule i's key (or the rule itself when the key is
// not in the file).
func placed(name string, data []byte, i int, rule, key, msg string, cause error) error {
	e := &Error{File: name, Rule: rule, Msg: msg, Err: cause}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return e
	}
	// The key itself, or the nearest of its parents the file has.
	path := fmt.Sprintf("$.rules[%d]", i)
	if key != "" {
		path += "." + key
	}
	var n ast.Node
	for n == nil && path != "$" {
		if n = nodeAt(f, path); n == nil {
			cut := strings.LastIndexAny(path, ".[")
			if cut < 0 {
				break
			}
			path = path[:cut]
		}
	}
	if n != nil {
		if p := n.GetToken().Position; p != nil {
			e.Line, e.Column = p.Line, p.Column
		}
	}
	return e
}

// keyOf is the file key of a flow.Rule field.
func keyOf(field string) string {
	if field == "" {
		return ""
	}
	if field == "ID" {
		return "id"
	}
	r := []rune(field)
	r[0] = unicode.ToLower(r[0])
	return string(r)
}

// failing is a token source for checking rules without Redis.
type failing struct{}

func (failing) Acquire(context.Context, flow.GlobalRequest) (bool, error) {
	return false, errors.New("rulefile: no token source")
}

// Check parses data and validates the rules as an engine would load them
// (flow.Engine.CheckRules, on an engine with a token source, so global
// rules are checked too). The error of a rule the engine refuses is placed
// at its key.
func Check(name string, data []byte) ([]flow.Rule, error) {
	rules, err := Parse(name, data)
	if err != nil {
		return nil, err
	}
	eng, err := flow.New(flow.WithTokenSource(failing{}), flow.WithMaxResources(max(len(rules), 1)))
	if err != nil {
		return nil, err
	}
	if _, err := eng.CheckRules(rules); err != nil {
		var re *flow.RuleError
		if errors.As(err, &re) {
			return nil, placed(name, data, re.Index, fmt.Sprintf("%q", re.Rule), keyOf(re.Field),
				fmt.Sprintf("%s %s, got %s", keyOf(re.Field), re.Reason, names.Value(re.Value)), err)
		}
		return nil, &Error{File: name, Msg: err.Error(), Err: err}
	}
	return rules, nil
}

// ReadFile reads and checks one rule file.
func ReadFile(path string) ([]flow.Rule, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Check(path, data)
}

// Exts are the file names a directory's rule files end in.
var Exts = []string{".yaml", ".yml", ".json"}

// ReadDir reads every rule file of dir (by Exts, in name order, hidden
// files left out) and merges their rules; a rule ID defined in two files
// is an error naming both.
func ReadDir(dir string) ([]flow.Rule, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && !strings.HasPrefix(n, ".") && hasExt(n) {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var all []flow.Rule
	seen := map[string]string{}
	for _, n := range names {
		path := filepath.Join(dir, n)
		rules, err := ReadFile(path)
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			if r.ID == "" {
				continue
			}
			if other, dup := seen[r.ID]; dup {
				return nil, &Error{File: path, Rule: fmt.Sprintf("%q", r.ID), Msg: "the ID is defined in " + other + " too"}
			}
			seen[r.ID] = path
		}
		all = append(all, rules...)
	}
	return all, nil
}

func hasExt(name string) bool {
	for _, x := range Exts {
		if strings.HasSuffix(name, x) {
			return true
		}
	}
	return false
}

// Format writes rules in the normal form (see the package doc) as YAML.
func Format(rules []flow.Rule) ([]byte, error) {
	out := file{Rules: new([]fileRule)}
	for _, r := range rules {
		*out.Rules = append(*out.Rules, normal(r))
	}
	return yaml.MarshalWithOptions(out, yaml.IndentSequence(true))
}

// normal is r with what the engine fills in by default left out.
func normal(r flow.Rule) fileRule {
	d := r.WithDefaults()
	th := number(r.Threshold)
	text := func(m interface{ MarshalText() ([]byte, error) }, zero bool) string {
		if zero {
			return ""
		}
		b, _ := m.MarshalText()
		return string(b)
	}
	dur := func(v time.Duration) string {
		if v == 0 {
			return ""
		}
		return v.String()
	}
	fr := fileRule{ID: r.ID, Resource: r.Resource, Threshold: &th,
		Metric: text(r.Metric, r.Metric == flow.QPS), Behavior: text(r.Behavior, r.Behavior == flow.Reject),
		Fallback:     text(r.Fallback, r.Fallback == flow.FallbackLocal),
		WarmUpPeriod: dur(r.WarmUpPeriod), MaxQueueing: dur(r.MaxQueueing), RelatedResource: r.RelatedResource,
		Global: r.Global, PerKey: r.PerKey, DryRun: r.DryRun}
	blank := flow.Rule{Resource: r.Resource, Metric: r.Metric, Behavior: r.Behavior, Global: r.Global,
		Fallback: r.Fallback, PerKey: r.PerKey}.WithDefaults()
	if d.StatInterval != blank.StatInterval {
		fr.StatInterval = dur(d.StatInterval)
	}
	if d.ColdFactor != blank.ColdFactor {
		fr.ColdFactor = number(d.ColdFactor)
	}
	if d.LocalShare != blank.LocalShare {
		fr.LocalShare = number(d.LocalShare)
	}
	if d.MaxKeys != blank.MaxKeys {
		fr.MaxKeys = d.MaxKeys
	}
	for _, k := range r.Keys {
		t := number(k.Threshold)
		fr.Keys = append(fr.Keys, keyLimit{Key: k.Key, Threshold: &t})
	}
	return fr
}
