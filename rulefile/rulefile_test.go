package rulefile

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// TestNormalFormIsGolden: every behaviour reads, and formats to the
// golden normal form, which reads back to the same rules and formats to
// itself.
func TestNormalFormIsGolden(t *testing.T) {
	rules, err := ReadFile("testdata/all.yaml")
	require.NoError(t, err)
	require.Len(t, rules, 14)
	out, err := Format(rules)
	require.NoError(t, err)
	golden := filepath.Join("testdata", "all.golden.yaml")
	if *update {
		require.NoError(t, os.WriteFile(golden, out, 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	assert.Equal(t, string(want), string(out))
	back, err := Check(golden, out)
	require.NoError(t, err)
	assert.Equal(t, rules, back)
	again, err := Format(back)
	require.NoError(t, err)
	assert.Equal(t, string(out), string(again), "the normal form formats to itself")
}

// TestDefaultsAreLeftOut: what the engine fills in is not written, and a
// rule written with its defaults spelt out formats like one without.
func TestDefaultsAreLeftOut(t *testing.T) {
	spelt := []flow.Rule{{Resource: "a", Threshold: 5, StatInterval: time.Second, Metric: flow.QPS, Behavior: flow.Reject}}
	bare := []flow.Rule{{Resource: "a", Threshold: 5}}
	a, err := Format(spelt)
	require.NoError(t, err)
	b, err := Format(bare)
	require.NoError(t, err)
	assert.Equal(t, "rules:\n  - resource: a\n    threshold: 5\n", string(a))
	assert.Equal(t, string(a), string(b))
	out, err := Format(nil)
	require.NoError(t, err)
	rules, err := Parse("empty", out)
	require.NoError(t, err, "no rules formats to a file that clears them: %s", out)
	assert.Empty(t, rules)
}

// TestJSONReadsLikeYAML: a JSON rule file gives the same rules, and its
// errors have lines too.
func TestJSONReadsLikeYAML(t *testing.T) {
	y, err := Check("a.yaml", []byte("rules:\n  - id: x\n    resource: a\n    threshold: 5\n    behavior: Throttle\n    maxQueueing: 200ms\n"))
	require.NoError(t, err)
	j, err := Check("a.json", []byte(`{"rules": [{"id": "x", "resource": "a", "threshold": 5, "behavior": "Throttle", "maxQueueing": "200ms"}]}`))
	require.NoError(t, err)
	assert.Equal(t, y, j)
	_, err = Check("a.json", []byte("{\"rules\": [\n  {\"resource\": \"a\",\n   \"treshold\": 5}]}"))
	assert.EqualError(t, err, `a.json:3:4: rule #0: unknown field "treshold"`)
}

// TestErrorsNameFileLineRuleAndKey: each kind of bad input is an error at
// its line and column, naming the rule and key.
func TestErrorsNameFileLineRuleAndKey(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"rules:\n  - resource: a\n    treshold: 5\n", `f.yaml:3:5: rule #0: unknown field "treshold"`},
		{"rules:\n  - resource: a\n", `f.yaml:2:13: rule "a": threshold is required (0 blocks everything)`},
		{"rules:\n  - resource: a\n    threshold: five\n", `f.yaml:3:16: rule "a": threshold: "five" is not a number`},
		{"rules:\n  - resource: a\n    threshold: 5\n    metric: QPX\n", `f.yaml:4:13: rule "a": unknown metric "QPX" (valid: QPS, Concurrency)`},
		{"rules:\n  - resource: a\n    threshold: 5\n    behavior: Slow\n", `f.yaml:4:15: rule "a": unknown behavior "Slow" (valid: Reject, WarmUp, Throttle, WarmUpThrottle, GCRA)`},
		{"rules:\n  - resource: a\n    threshold: 5\n    global: true\n    fallback: Maybe\n", `f.yaml:5:15: rule "a": unknown fallback "Maybe" (valid: Local, Open, Closed)`},
		{"rules:\n  - resource: a\n    threshold: 5\n    statInterval: 5x\n", `f.yaml:4:19: rule "a": statInterval: "5x" is not a duration (such as 500ms, 1m30s)`},
		{"rules:\n  - resource: a\n    threshold: -1\n", `f.yaml:3:16: rule "a": threshold must be a finite number >= 0, got -1`},
		{"rules:\n  - id: w\n    resource: b\n    threshold: 5\n    behavior: WarmUp\n", `f.yaml:2:7: rule "w": warmUpPeriod must be > 0 for WarmUp, got 0s`},
		{"rules:\n  - resource: a\n    threshold: 5\n    perKey: true\n    keys:\n      - key: k\n", `f.yaml:6:12: rule "a": keys[0]: key and threshold are required`},
		{"rules:\n  - resource: a\n    threshold: 5\n    global: maybe\n", `f.yaml:4:13: rule "a": global: "maybe" is not true or false`},
		{"", `f.yaml: the file is empty: write "rules: []" to clear every rule`},
		{"# only a comment\n", `f.yaml: the file is empty: write "rules: []" to clear every rule`},
		{"other: 1\n", `f.yaml:1:1: unknown field "other" (a rule file has only rules)`},
		{"rules: [\n", `f.yaml:1:8: sequence end token ']' not found`},
	} {
		_, err := Check("f.yaml", []byte(tc.in))
		assert.EqualError(t, err, tc.want, "%q", tc.in)
	}
}

// TestReadDirMerges: a directory's rule files merge in name order; an ID
// defined twice names both files; other files are left alone.
func TestReadDirMerges(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
	}
	write("b.yaml", "rules:\n  - id: two\n    resource: b\n    threshold: 2\n")
	write("a.json", `{"rules": [{"id": "one", "resource": "a", "threshold": 1}]}`)
	write("notes.txt", "not rules")
	write(".hidden.yaml", "junk")
	rules, err := ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, rules, 2)
	assert.Equal(t, "one", rules[0].ID)
	assert.Equal(t, "two", rules[1].ID)
	write("c.yml", "rules:\n  - id: one\n    resource: c\n    threshold: 3\n")
	_, err = ReadDir(dir)
	assert.ErrorContains(t, err, `rule "one": the ID is defined in `+filepath.Join(dir, "a.json")+" too")
}

// TestTheDocumentedFileIsValid: docs/rules.yaml, the README's example,
// reads and holds every behaviour.
func TestTheDocumentedFileIsValid(t *testing.T) {
	rules, err := ReadFile(filepath.Join("..", "docs", "rules.yaml"))
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, r := range rules {
		seen[r.Behavior.String()] = true
		seen[r.Metric.String()] = true
		if r.PerKey {
			seen["PerKey"] = true
		}
		if r.Global {
			seen["Global"] = true
		}
		if r.DryRun {
			seen["DryRun"] = true
		}
		if r.RelatedResource != "" {
			seen["Related"] = true
		}
	}
	for _, kind := range []string{"Reject", "WarmUp", "Throttle", "WarmUpThrottle", "GCRA", "QPS", "Concurrency", "PerKey", "Global", "DryRun", "Related"} {
		assert.True(t, seen[kind], kind)
	}
}

// TestEachFieldDecodes: every key lands in its flow.Rule field.
func TestEachFieldDecodes(t *testing.T) {
	base := "rules:\n  - resource: a\n    threshold: 5\n"
	want := flow.Rule{Resource: "a", Threshold: 5}
	for _, tc := range []struct {
		extra string
		set   func(*flow.Rule)
	}{
		{"    id: x\n", func(r *flow.Rule) { r.ID = "x" }},
		{"    metric: Concurrency\n", func(r *flow.Rule) { r.Metric = flow.Concurrency }},
		{"    statInterval: 250ms\n", func(r *flow.Rule) { r.StatInterval = 250 * time.Millisecond }},
		{"    behavior: WarmUp\n    warmUpPeriod: 1m30s\n    coldFactor: 2.5\n", func(r *flow.Rule) {
			r.Behavior, r.WarmUpPeriod, r.ColdFactor = flow.WarmUp, 90*time.Second, 2.5
		}},
		{"    behavior: Throttle\n    maxQueueing: 20ms\n", func(r *flow.Rule) { r.Behavior, r.MaxQueueing = flow.Throttle, 20*time.Millisecond }},
		{"    relatedResource: b\n", func(r *flow.Rule) { r.RelatedResource = "b" }},
		{"    global: true\n    fallback: Closed\n", func(r *flow.Rule) { r.Global, r.Fallback = true, flow.FallbackClosed }},
		{"    global: true\n    localShare: 0.5\n", func(r *flow.Rule) { r.Global, r.LocalShare = true, 0.5 }},
		{"    perKey: true\n    maxKeys: 10\n    keys:\n      - key: k\n        threshold: 7\n", func(r *flow.Rule) {
			r.PerKey, r.MaxKeys, r.Keys = true, 10, []flow.KeyLimit{{Key: "k", Threshold: 7}}
		}},
		{"    dryRun: true\n", func(r *flow.Rule) { r.DryRun = true }},
		{"    spanExact: true\n", func(r *flow.Rule) { r.SpanExact = true }},
		{"    behavior: GCRA\n    burst: 20\n", func(r *flow.Rule) { r.Behavior, r.Burst = flow.GCRA, 20 }},
	} {
		rules, err := Parse("f.yaml", []byte(base+tc.extra))
		require.NoError(t, err, tc.extra)
		w := want
		tc.set(&w)
		assert.Equal(t, []flow.Rule{w}, rules, tc.extra)
	}
}

// noPanic runs Check, turning a panic into a test failure.
func noPanic(t *testing.T, in string) (rules []flow.Rule, err error) {
	t.Helper()
	defer func() {
		if v := recover(); v != nil {
			t.Errorf("Check(%q) panicked: %v", in, v)
		}
	}()
	return Check("f.yaml", []byte(in))
}

// Parse never panics on what YAML allows: a number written with an
// exponent, a quoted number, a !!str tag, a tagged null or map for rules.
// Each is read or refused with an error.
func TestParseNeverPanics(t *testing.T) {
	for _, in := range []string{
		"rules:\n  - resource: a\n    threshold: 1e3\n",
		"rules:\n  - resource: a\n    threshold: 1e12\n", // the largest threshold itself
		"rules:\n  - resource: a\n    threshold: \"5\"\n",
		"rules:\n  - resource: a\n    threshold: !!str 5\n",
		"rules:\n  - resource: a\n    threshold: 5\n    global: true\n    localShare: 1e-05\n",
		`{"rules": [{"resource": "a", "threshold": 5e-400}]}`,
		"rules: !!null\n",
		"rules: !!map {}\n",
	} {
		noPanic(t, in)
	}
}

// What Format writes reads back to the same rules: exponents, names that
// YAML would read as numbers or indicators, tabs and carriage returns.
func TestFormatRoundTrips(t *testing.T) {
	for _, r := range []flow.Rule{
		{Resource: "a", Threshold: 5, Global: true, LocalShare: 0.00001},
		{Resource: "a", Threshold: 0.000001},
		{Resource: ".nan", Threshold: 1},
		{Resource: ".inf", Threshold: 1},
		{Resource: "? a", Threshold: 1},
		{Resource: "a\tb", Threshold: 1},
		{Resource: "a\rb", Threshold: 1},
	} {
		out, err := Format([]flow.Rule{r})
		require.NoError(t, err)
		func() {
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("%q: reading Format's output %q panicked: %v", r.Resource, out, v)
				}
			}()
			back, err := Parse("f", out)
			if assert.NoError(t, err, "Format wrote %q", out) && assert.Len(t, back, 1) {
				assert.Equal(t, r.Resource, back[0].Resource, "Format wrote %q", out)
			}
		}()
	}
}

// A plain scalar that looks like a number keeps its text in a string field:
// key 00123 (a tenant, a zip code) stays 00123, 1.50 stays 1.50, .nan stays
// .nan.
func TestNumericLookingNamesKeepTheirText(t *testing.T) {
	rules, err := Check("f", []byte("rules:\n  - id: 1.50\n    resource: 0x1F\n    threshold: 5\n    perKey: true\n    keys:\n      - key: 00123\n        threshold: 1\n"))
	if err != nil {
		return // refusing unquoted numbers is a fix too
	}
	assert.Equal(t, "00123", rules[0].Keys[0].Key)
	assert.Equal(t, "0x1F", rules[0].Resource)
	assert.Equal(t, "1.50", rules[0].ID)
}

// Every document of a file is read: the rules of a second document are not
// dropped.
func TestSecondDocumentIsNotIgnored(t *testing.T) {
	rules, err := Check("f", []byte("rules:\n  - resource: a\n    threshold: 5\n---\nrules:\n  - resource: b\n    threshold: 6\n"))
	if err == nil {
		assert.Len(t, rules, 2, "the second document's rules were dropped without an error")
	}
}

// A fractional maxKeys is an error naming the field, never truncated (under
// 1 it would become 0 and then the default).
func TestFractionalMaxKeysIsAnError(t *testing.T) {
	for _, v := range []string{"0.5", "5.5"} {
		rules, err := Check("f", []byte("rules:\n  - resource: a\n    threshold: 5\n    perKey: true\n    maxKeys: "+v+"\n"))
		assert.Error(t, err, "maxKeys: %s read as %v", v, rules)
	}
}

// An explicit 0 is 0 or an error, never the default: localShare,
// coldFactor, maxKeys and statInterval.
func TestExplicitZeroIsNotADefault(t *testing.T) {
	for _, in := range []string{
		"rules:\n  - resource: a\n    threshold: 5\n    global: true\n    localShare: 0\n",
		"rules:\n  - resource: a\n    threshold: 5\n    behavior: WarmUp\n    warmUpPeriod: 1s\n    coldFactor: 0\n",
		"rules:\n  - resource: a\n    threshold: 5\n    perKey: true\n    maxKeys: 0\n",
		"rules:\n  - resource: a\n    threshold: 5\n    statInterval: 0s\n",
	} {
		rules, err := Check("f", []byte(in))
		if err == nil {
			d := rules[0].WithDefaults()
			t.Errorf("%q accepted, in force as localShare=%v coldFactor=%v maxKeys=%v statInterval=%v", in, d.LocalShare, d.ColdFactor, d.MaxKeys, d.StatInterval)
		}
	}
}

// A type error in flow style (every JSON file) names the key of the value,
// not the first key of the line.
func TestTypeErrorNamesTheRightKeyInJSON(t *testing.T) {
	_, err := Check("f.json", []byte(`{"rules": [{"resource": "a", "threshold": "five"}]}`))
	assert.ErrorContains(t, err, `threshold: "five" is not a number`)
	_, err = Check("f.json", []byte("{\"rules\": [\n {\"resource\": \"a\", \"global\": 5, \"threshold\": 1}]}"))
	assert.ErrorContains(t, err, `global: "5" is not true or false`)
}

// Which unknown key is reported does not depend on map order.
func TestUnknownKeyErrorIsDeterministic(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		_, err := Check("f", []byte("rules:\n  - resource: a\n    threshold: 5\n    aaa: 1\n    bbb: 2\n    ccc: 3\n"))
		seen[err.Error()] = true
	}
	assert.Len(t, seen, 1, "%v", seen)
}

// Merge keys over aliases never expand exponentially: a file of a few
// hundred bytes built to do so is read (or refused) at once, so a
// FileSource (and its Stop) never stalls on it.
func TestMergeKeysAreBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n  - &r0 {resource: a, threshold: 1}\n")
	for i := 1; i < 8; i++ {
		fmt.Fprintf(&b, "  - &r%d {<<: [*r%d, *r%d, *r%d, *r%d, *r%d, *r%d, *r%d, *r%d]}\n", i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	start := time.Now()
	_, _ = Check("f", []byte(b.String()))
	assert.Less(t, time.Since(start), 500*time.Millisecond, "%d bytes", b.Len())
}

// TestNumbersInExponentForm: a number written with an exponent (valid
// JSON, and YAML) reads as that number in every numeric field, in JSON
// and YAML alike; a whole-number field takes one only when it is whole; a
// quoted one is still a string, not a number.
func TestNumbersInExponentForm(t *testing.T) {
	for _, src := range []string{
		`{"rules": [{"resource": "a", "threshold": 1e6, "perKey": true, "maxKeys": 1E3}, {"resource": "b", "threshold": 2.5e1, "behavior": "WarmUp", "warmUpPeriod": "10s", "coldFactor": 4e0}]}`,
		"rules:\n  - resource: a\n    threshold: 1e6\n    perKey: true\n    maxKeys: 1E3\n  - resource: b\n    threshold: 2.5e1\n    behavior: WarmUp\n    warmUpPeriod: 10s\n    coldFactor: 4e0\n",
		"rules:\n  - resource: a\n    threshold: 1.0e+6\n    perKey: true\n    maxKeys: 1.0e3\n  - resource: b\n    threshold: .25e2\n    behavior: WarmUp\n    warmUpPeriod: 10s\n    coldFactor: 40e-1\n",
	} {
		rules, err := Check("f", []byte(src))
		require.NoError(t, err, src)
		require.Len(t, rules, 2)
		assert.Equal(t, 1e6, rules[0].Threshold, src)
		assert.Equal(t, 1000, rules[0].MaxKeys, src)
		assert.Equal(t, 25.0, rules[1].Threshold, src)
		assert.Equal(t, 4.0, rules[1].ColdFactor, src)
	}
	for _, src := range []string{
		"rules:\n  - resource: a\n    threshold: \"1e6\"\n",
		"rules:\n  - resource: a\n    threshold: 5\n    perKey: true\n    maxKeys: 1.5e0\n",
		"rules:\n  - resource: a\n    threshold: 5\n    perKey: true\n    maxKeys: 1e12\n",
		"rules:\n  - resource: a\n    threshold: 1e\n",
	} {
		_, err := Check("f", []byte(src))
		assert.Error(t, err, src)
	}
}

// TestEdgesOfTheFileFormat: a UTF-8 byte-order mark is skipped (YAML and
// JSON), a trailing comma in a JSON object or list is read as YAML's flow
// style reads it, and a NUL byte in a string is an error naming the key.
func TestEdgesOfTheFileFormat(t *testing.T) {
	for _, src := range []string{
		"\xef\xbb\xbfrules:\n  - resource: a\n    threshold: 5\n",
		"\xef\xbb\xbf{\"rules\": [{\"resource\": \"a\", \"threshold\": 5}]}",
		`{"rules": [{"resource": "a", "threshold": 5,}]}`,
		`{"rules": [{"resource": "a", "threshold": 5},]}`,
	} {
		rules, err := Check("f", []byte(src))
		require.NoError(t, err, "%q", src)
		require.Len(t, rules, 1)
		assert.Equal(t, "a", rules[0].Resource)
	}
	for _, src := range []string{
		"rules:\n  - resource: \"a\\0b\"\n    threshold: 5\n",
		"rules:\n  - resource: a\n    id: \"x\\0\"\n    threshold: 5\n",
		"rules:\n  - resource: a\n    threshold: 5\n    perKey: true\n    keys:\n      - key: \"\\0\"\n        threshold: 1\n",
	} {
		_, err := Check("f", []byte(src))
		require.Error(t, err, "%q", src)
		assert.Contains(t, err.Error(), "NUL")
	}
}

// TestCheckRefusesMoreResourcesThanAnEngineHolds: a file that names more
// resources than an engine holds by default is refused by Check, as
// loading it would be, with an error that names the cap, not a rule.
func TestCheckRefusesMoreResourcesThanAnEngineHolds(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n")
	for i := range 10_001 {
		fmt.Fprintf(&b, "  - resource: r%d\n    threshold: 5\n", i)
	}
	_, err := Check("f", []byte(b.String()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "names 10001 resources, more than the engine holds (WithMaxResources 10000)")
	assert.NotContains(t, err.Error(), `"r0"`)
}

// FormatFile keeps every comment beside what it was written beside: a
// comment line before its rule or key, a comment ending a key's line on
// that key's line, the file's head and tail where they were. One inside a
// keys list moves above the list; those of keys the normal form leaves
// out, and of a rule's "-" line, move above the rule. The result formats
// to itself.
func TestFormatFileKeepsCommentsInPlace(t *testing.T) {
	src := `# head 1

# head 2
rules: # on rules line
  # before rule 0
  - resource: a   # on resource
    # before threshold
    threshold: 5 # on threshold
    # before behavior (a default)
    behavior: Reject # on behavior
    id: "x#y" # not a comment before this one
  -   # on dash line
    resource: b
    threshold: 3
    perKey: true
    keys: # on keys
      # inside keys
      - key: vip # on key vip
        threshold: 9
    # before dryRun
    dryRun: true
# after all
  # indented tail
`
	want := `# head 1

# head 2
# on rules line
rules:
  # before rule 0
  # before behavior (a default)
  # on behavior
  - id: "x#y" # not a comment before this one
    resource: a # on resource
    # before threshold
    threshold: 5 # on threshold
  # on dash line
  - resource: b
    threshold: 3
    perKey: true
    # inside keys
    # on key vip
    keys: # on keys
      - key: vip
        threshold: 9
    # before dryRun
    dryRun: true
# after all
# indented tail
`
	path := filepath.Join(t.TempDir(), "r.yaml")
	require.NoError(t, os.WriteFile(path, []byte(src), 0o644))
	out, err := FormatFile(path)
	require.NoError(t, err)
	assert.Equal(t, want, string(out))
	require.NoError(t, os.WriteFile(path, out, 0o644))
	again, err := FormatFile(path)
	require.NoError(t, err)
	assert.Equal(t, want, string(again), "formats to itself")
}

// In a flow list (JSON's form too) a comment stays with the rule it
// stood beside, one after a line's last key ends that key's line, and one
// on a line of closing brackets or the document's end goes with what
// follows (here the end of the file).
func TestFormatFileKeepsCommentsOfFlowLists(t *testing.T) {
	for _, tc := range []struct{ src, want string }{
		{"rules: [\n  # about a\n  {resource: a, threshold: 1}, # end a\n  {resource: b, threshold: 2, dryRun: true} # c on b\n] # closing\n",
			"rules:\n  # about a\n  - resource: a\n    threshold: 1 # end a\n  - resource: b\n    threshold: 2\n    dryRun: true # c on b\n# closing\n"},
		{"rules:\n  - resource: a\n    threshold: 1\n... # end\n",
			"rules:\n  - resource: a\n    threshold: 1\n# end\n"},
	} {
		path := filepath.Join(t.TempDir(), "r.yaml")
		require.NoError(t, os.WriteFile(path, []byte(tc.src), 0o644))
		out, err := FormatFile(path)
		require.NoError(t, err)
		assert.Equal(t, tc.want, string(out), "from %q", tc.src)
	}
}

// A breaker rule reads from its keys, formats to its normal form and back;
// an unknown strategy is an error at its key listing the valid ones.
func TestBreakerRulesReadAndFormat(t *testing.T) {
	src := "rules:\n  - id: dep\n    resource: payments\n    threshold: 0.5\n    statInterval: 2s\n    breaker: SlowRatio\n    maxRT: 200ms\n" +
		"    minRequests: 20\n    retryTimeout: 10s\n    probeTimeout: 3s\n    buckets: 20\n"
	rules, err := Check("b.yaml", []byte(src))
	require.NoError(t, err)
	require.Len(t, rules, 1)
	assert.Equal(t, flow.Rule{ID: "dep", Resource: "payments", Threshold: 0.5, Breaker: flow.SlowRatio, MaxRT: 200 * time.Millisecond,
		MinRequests: 20, RetryTimeout: 10 * time.Second, ProbeTimeout: 3 * time.Second, StatInterval: 2 * time.Second, Buckets: 20}, rules[0])
	out, err := Format(rules)
	require.NoError(t, err)
	assert.Equal(t, src, string(out))

	_, err = Check("b.yaml", []byte("rules:\n  - resource: a\n    threshold: 3\n    breaker: ErrorCounts\n    retryTimeout: 1s\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `b.yaml:4:14: rule "a": unknown breaker strategy "ErrorCounts" (valid: None, SlowRatio, ErrorRatio, ErrorCount)`)
	_, err = Check("b.yaml", []byte("rules:\n  - resource: a\n    threshold: 0.5\n    breaker: ErrorRatio\n    retryTimeout: 1s\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "minRequests must be in [1, 1000000]")
}

// System rules read from their keys and format to their normal form and
// back; an unknown check is an error at its key listing the valid ones,
// and a CPU usage out of range names the threshold.
func TestSystemRulesReadAndFormat(t *testing.T) {
	src := "rules:\n  - resource: inbound\n    threshold: 1000\n" +
		"  - id: shed\n    resource: inbound\n    threshold: 0.8\n    system: SystemBBR\n" +
		"  - id: slow\n    resource: inbound\n    threshold: 0\n    system: SystemRT\n    maxRT: 250ms\n"
	rules, err := Check("s.yaml", []byte(src))
	require.NoError(t, err)
	require.Len(t, rules, 3)
	assert.Equal(t, flow.Rule{ID: "shed", Resource: "inbound", Threshold: 0.8, System: flow.SystemBBR}, rules[1])
	assert.Equal(t, flow.Rule{ID: "slow", Resource: "inbound", System: flow.SystemRT, MaxRT: 250 * time.Millisecond}, rules[2])
	out, err := Format(rules)
	require.NoError(t, err)
	assert.Equal(t, src, string(out))

	_, err = Parse("s.yaml", []byte("rules:\n  - resource: a\n    threshold: 0.8\n    system: BBR\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `s.yaml:4:13: rule "a": unknown system check "BBR" (valid: None, SystemCPU, SystemRT, SystemBBR)`)
	_, err = Check("s.yaml", []byte("rules:\n  - resource: a\n    threshold: 80\n    system: SystemCPU\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "threshold must be a CPU usage in (0, 1)")
}
