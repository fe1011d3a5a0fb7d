package rulefile

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
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
