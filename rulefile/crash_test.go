package rulefile

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// A FileSource survives any rule file: what Parse cannot read is an error
// (Sync.LastError), never a panic on the Sync goroutine that would end the
// whole process. The file here ("threshold: 1e3") is read in a child
// process, which must exit cleanly.
func TestFileSourceSurvivesAnyFile(t *testing.T) {
	if dir := os.Getenv("ADV_CRASH_DIR"); dir != "" {
		path := filepath.Join(dir, "rules.yaml")
		eng, _ := flow.New()
		s := Start(eng, NewFileSource(path))
		defer s.Stop()
		// Until the sync has read the file (a panic there ends the
		// process before this returns).
		for deadline := time.Now().Add(5 * time.Second); s.Reloads() == 0 && s.LastError() == nil && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		return
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("rules:\n  - resource: api\n    threshold: 1e3\n"), 0o644))
	cmd := exec.Command(os.Args[0], "-test.run=^TestFileSourceSurvivesAnyFile$")
	cmd.Env = append(os.Environ(), "ADV_CRASH_DIR="+dir)
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "the process survives a bad rule file:\n%.600s", out)
}

// Formatting any file Check accepts never panics, and what it writes
// reads back to the same rules with every comment, and formats to itself.
func FuzzFormatKeepsRulesAndComments(f *testing.F) {
	doc, err := os.ReadFile("../docs/rules.yaml")
	require.NoError(f, err)
	for _, s := range []string{string(doc),
		"rules: [] # none\n",
		"# only\nrules:\n- {resource: a, threshold: 1} # flow\n",
		"rules:\n  - resource: \"a # b\" # c\n    threshold: 2 #d\n",
		"rules:\n  - # x\n    resource: a\n    threshold: 1\n    keys:\n    - {key: k, threshold: 2} # y\n    perKey: true\n",
		"{\"rules\": [{\"resource\": \"a\", \"threshold\": 1e3,},],}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		rules, err := Check("f.yaml", data)
		if err != nil {
			return
		}
		out, err := formatData("f.yaml", data)
		if err != nil {
			if len(commentTexts(data)) == 0 {
				t.Fatalf("a file without comments does not format: %v\n%q", err, data)
			}
			return // refused rather than lose a comment
		}
		back, err := Check("out.yaml", out)
		if err != nil {
			t.Fatalf("the normal form does not check: %v\n%q\n%s", err, data, out)
		}
		if len(back) != len(rules) {
			t.Fatalf("%d rules became %d", len(rules), len(back))
		}
		if !slices.Equal(commentTexts(out), commentTexts(data)) {
			t.Fatalf("comments lost or changed:\n%q\n%s", data, out)
		}
		again, err := formatData("out.yaml", out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("the normal form does not format to itself (%v):\n%s\n%s", err, out, again)
		}
	})
}
