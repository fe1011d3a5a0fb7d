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
// Throttle, WarmUpThrottle, GCRA), warmUpPeriod, coldFactor, maxQueueing, burst,
// relatedResource, global, fallback (Local, Open, Closed), localShare,
// perKey, maxKeys, keys (a list of key and threshold), dryRun,
// spanExact, for circuit breakers breaker (SlowRatio, ErrorRatio,
// ErrorCount), maxRT, minRequests, retryTimeout, probeTimeout and buckets,
// and for system rules system (SystemCPU, SystemRT, SystemBBR; maxRT for
// SystemRT, whose threshold is 0). Durations are Go
// duration strings ("500ms", "1m30s"). Numbers may be written with an
// exponent, as JSON allows (1e6, 2.5E-3), in YAML too; a whole-number
// field (maxKeys, burst) takes one only when it is whole (1e3, 1.0e3).
// A UTF-8 byte-order mark before the first line is skipped; JSON may end
// an object or a list with a comma (YAML's flow style allows it); a NUL
// byte in any string (a name, a key) is an error.
// threshold is required: a rule
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
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"unicode"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/names"
)

// Error is a problem in a rule file, placed at a line and column (0 when
// the file could not be read that far).
type Error struct {
	File         string
	Line, Column int
	Rule         string // the rule's ID or resource, or "#N" for the Nth (from 0), when known
	Msg          string
	Err          error // the cause, if any (a *flow.RuleError)
}

// Error names the file, the place in it and what is wrong.
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

// Unwrap returns the cause, if any (a *flow.RuleError for a bad rule).
func (e *Error) Unwrap() error { return e.Err }

// Parse reads the rules of one file's data; name is the file's name in
// errors. An empty file (or one of comments only) and a file without a
// rules key are errors: clearing every rule takes an explicit "rules: []".
// Files hold one YAML document, without anchors, aliases, merge keys or
// tags, nested at most 64 deep, of at most MaxFileSize bytes; values must
// be of their key's type (a name that looks like a number is quoted); an
// ID appears once.
func Parse(name string, data []byte) ([]flow.Rule, error) {
	rules, _, err := parse(name, data)
	return rules, err
}

// parse is Parse, also returning the raw rules (their keys' positions).
func parse(name string, data []byte) (rules []flow.Rule, raw []rawRule, err error) {
	defer func() {
		if v := recover(); v != nil {
			rules, raw, err = nil, nil, &Error{File: name, Msg: fmt.Sprintf("cannot be read: %v", v)}
		}
	}()
	d := &decoder{name: name}
	if raw, err = d.parse(data); err != nil {
		return nil, nil, err
	}
	rules = make([]flow.Rule, len(raw))
	ids := map[string]int{}
	for i := range raw {
		if rules[i], err = d.rule(i, &raw[i]); err != nil {
			return nil, nil, err
		}
		if id := rules[i].ID; id != "" {
			if j, dup := ids[id]; dup {
				return nil, nil, d.errAt(raw[i].fields["id"], fmt.Sprintf("%q", id), "the ID is the ID of rule #%d too", j)
			}
			ids[id] = i
		}
	}
	return rules, raw, nil
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

// idle is a CPU meter for Check's engine, so that system rules that read
// the CPU are checked too.
type idle struct{}

func (idle) CPUUsage() float64 { return 0 }

// Check parses data and validates the rules as an engine would load them
// (flow.Engine.CheckRules, on an engine with a token source and a CPU
// meter, so global and system rules are checked too). The error of a rule the engine refuses is placed
// at its key.
func Check(name string, data []byte) ([]flow.Rule, error) {
	rules, raw, err := parse(name, data)
	if err != nil {
		return nil, err
	}
	d := &decoder{name: name}
	// The engine's defaults, its resource cap too: a file that names more
	// resources than an engine holds by default fails here as it would
	// load.
	eng, err := flow.New(flow.WithTokenSource(failing{}), flow.WithCPU(idle{}))
	if err != nil {
		return nil, err
	}
	if _, err := eng.CheckRules(rules); err != nil {
		var re *flow.RuleError
		if errors.As(err, &re) && re.Index >= 0 && re.Index < len(raw) {
			e := d.errAt(raw[re.Index].fields[keyOf(re.Field)], fmt.Sprintf("%q", re.Rule),
				"%s %s, got %s", keyOf(re.Field), re.Reason, names.Value(re.Value))
			e.Err = err
			if e.Line == 0 && raw[re.Index].at != nil { // a key the file left out: the rule
				e.Line, e.Column = raw[re.Index].at.Line, raw[re.Index].at.Column
			}
			return nil, e
		}
		return nil, &Error{File: name, Msg: err.Error(), Err: err}
	}
	return rules, nil
}

// ReadFile reads and checks one rule file: a regular file (symlinks
// followed) of at most MaxFileSize bytes, read through that limit.
func ReadFile(path string) ([]flow.Rule, error) {
	data, err := readRuleFile(path)
	if err != nil {
		return nil, err
	}
	return Check(path, data)
}

// FormatFile reads and checks the rule file at path (as ReadFile) and
// returns its normal form (as Format) with the file's comments: a comment
// line stays before the rule or key it stood before, a comment ending a
// key's line ends that key's line, and comments after the rules stay at
// the end. A comment inside a keys list moves above the list, and one of
// a key the normal form leaves out (a default) moves above its rule. It
// fails rather than lose a comment.
func FormatFile(path string) ([]byte, error) {
	data, err := readRuleFile(path)
	if err != nil {
		return nil, err
	}
	return formatData(path, data)
}

// formatData is FormatFile of a file's data.
func formatData(name string, data []byte) ([]byte, error) {
	rules, err := Check(name, data)
	if err != nil {
		return nil, err
	}
	data = bytes.TrimPrefix(data, bom)
	_, raw, err := parse(name, data)
	if err != nil {
		return nil, err
	}
	c := collectComments(data, raw)
	out, err := format(rules, c)
	if err != nil {
		return nil, err
	}
	if in, kept := commentTexts(data), commentTexts(out); !slices.Equal(in, kept) {
		return nil, fmt.Errorf("rulefile: %s: the normal form would not keep its %d comments as they are", name, len(in))
	}
	return out, nil
}

// Exts are the file names a directory's rule files end in.
var Exts = []string{".yaml", ".yml", ".json"}

// Files are the rule files of dir that ReadDir reads: by Exts, in name
// order, hidden files left out. A directory without one is an error.
func Files(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && !strings.HasPrefix(n, ".") && hasExt(n) {
			paths = append(paths, filepath.Join(dir, n))
		}
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		// As an empty file: clearing every rule takes an explicit list.
		return nil, &Error{File: dir, Msg: `no rule files (.yaml, .yml, .json): write one with "rules: []" to clear every rule`}
	}
	return paths, nil
}

// ReadDir reads every rule file of dir (see Files) and merges their
// rules; a rule ID defined in two files is an error naming both.
func ReadDir(dir string) ([]flow.Rule, error) {
	paths, err := Files(dir)
	if err != nil {
		return nil, err
	}
	var all []flow.Rule
	seen := map[string]string{}
	for _, path := range paths {
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
