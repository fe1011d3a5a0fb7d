package rulefile

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

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

// BUG 1: a number written with an exponent, a quoted number, a !!str tag,
// or a tagged null/map for rules panics inside Parse (go-yaml's
// "scientific notation" path returns a float64 that reflect cannot set
// into rulefile.number).
func TestHostileParseNeverPanics(t *testing.T) {
	for _, in := range []string{
		"rules:\n  - resource: a\n    threshold: 1e3\n",
		"rules:\n  - resource: a\n    threshold: 1e12\n", // MaxThreshold itself
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

// BUG 2: Format writes what does not read back to the same rules: an
// exponent that then panics, names that YAML reads as numbers or
// indicators, tabs and carriage returns.
func TestHostileFormatRoundTrips(t *testing.T) {
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

// BUG 3: a plain scalar that looks like a number is decoded as one and
// printed back into a string field: key 00123 (a tenant, a zip code)
// becomes "83", 1.50 becomes "1.5", .nan becomes "NaN".
func TestHostileNumericLookingNamesKeepTheirText(t *testing.T) {
	rules, err := Check("f", []byte("rules:\n  - id: 1.50\n    resource: 0x1F\n    threshold: 5\n    perKey: true\n    keys:\n      - key: 00123\n        threshold: 1\n"))
	if err != nil {
		return // refusing unquoted numbers is a fix too
	}
	assert.Equal(t, "00123", rules[0].Keys[0].Key)
	assert.Equal(t, "0x1F", rules[0].Resource)
	assert.Equal(t, "1.50", rules[0].ID)
}

// BUG 4: every document after the first is silently dropped.
func TestHostileSecondDocumentIsNotIgnored(t *testing.T) {
	rules, err := Check("f", []byte("rules:\n  - resource: a\n    threshold: 5\n---\nrules:\n  - resource: b\n    threshold: 6\n"))
	if err == nil {
		assert.Len(t, rules, 2, "the second document's rules were dropped without an error")
	}
}

// BUG 5: a fractional maxKeys is truncated; under 1 it becomes 0 and then
// the default of 100000.
func TestHostileFractionalMaxKeysIsAnError(t *testing.T) {
	for _, v := range []string{"0.5", "5.5"} {
		rules, err := Check("f", []byte("rules:\n  - resource: a\n    threshold: 5\n    perKey: true\n    maxKeys: "+v+"\n"))
		assert.Error(t, err, "maxKeys: %s read as %v", v, rules)
	}
}

// BUG 6: an explicit 0 silently becomes the default: localShare: 0 means
// the whole threshold locally, coldFactor: 0 is 3, maxKeys: 0 is 100000,
// statInterval: 0 is 1s.
func TestHostileExplicitZeroIsNotADefault(t *testing.T) {
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

// BUG 7: a type error in flow style (every JSON file) names the first key
// of the line, not the key of the value.
func TestHostileTypeErrorNamesTheRightKeyInJSON(t *testing.T) {
	_, err := Check("f.json", []byte(`{"rules": [{"resource": "a", "threshold": "five"}]}`))
	assert.ErrorContains(t, err, `threshold: "five" is not a number`)
	_, err = Check("f.json", []byte("{\"rules\": [\n {\"resource\": \"a\", \"global\": 5, \"threshold\": 1}]}"))
	assert.ErrorContains(t, err, `global: "5" is not true or false`)
}

// BUG 8: which unknown key is reported is random (map order).
func TestHostileUnknownKeyErrorIsDeterministic(t *testing.T) {
	seen := map[string]bool{}
	for range 50 {
		_, err := Check("f", []byte("rules:\n  - resource: a\n    threshold: 5\n    aaa: 1\n    bbb: 2\n    ccc: 3\n"))
		seen[err.Error()] = true
	}
	assert.Len(t, seen, 1, "%v", seen)
}

// BUG 9: merge keys over aliases expand exponentially: a 430-byte file
// takes seconds (538 bytes: 54 s), stalling a FileSource (and Stop).
func TestHostileMergeKeyBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("rules:\n  - &r0 {resource: a, threshold: 1}\n")
	for i := 1; i < 8; i++ {
		fmt.Fprintf(&b, "  - &r%d {<<: [*r%d, *r%d, *r%d, *r%d, *r%d, *r%d, *r%d, *r%d]}\n", i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	start := time.Now()
	_, _ = Check("f", []byte(b.String()))
	assert.Less(t, time.Since(start), 500*time.Millisecond, "%d bytes", b.Len())
}
