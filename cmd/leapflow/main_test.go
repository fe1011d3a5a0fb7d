package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func runCmd(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestCheck: a good file prints its normal form and exits 0; a bad one
// prints file:line:column and exits 1; usage errors exit 2.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, []byte("rules:\n  - resource: api\n    threshold: 100\n    statInterval: 1s\n"), 0o644))
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("rules:\n  - resource: api\n    treshold: 100\n"), 0o644))

	code, out, errOut := runCmd("check", good)
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "# "+good+": 1 rules, valid\nrules:\n  - resource: api\n    threshold: 100\n", out)

	code, _, errOut = runCmd("check", good, bad)
	assert.Equal(t, 1, code)
	assert.Equal(t, bad+`:3:5: rule #0: unknown field "treshold"`+"\n", errOut)

	code, _, errOut = runCmd("check", filepath.Join(dir, "missing.yaml"))
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no such file")

	code, _, errOut = runCmd("check", dir)
	assert.Equal(t, 1, code, "the directory holds the bad file too")
	assert.Contains(t, errOut, "bad.yaml:3:5")

	for _, args := range [][]string{{}, {"check"}, {"lint", good}, {"fmt"}, {"fmt", "-x", good}} {
		code, _, errOut := runCmd(args...)
		assert.Equal(t, 2, code, "%v", args)
		assert.NotEmpty(t, errOut)
	}
}

// TestFmt: fmt prints the normal form, and -w rewrites the file with it.
func TestFmt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.yaml")
	require.NoError(t, os.WriteFile(path, []byte("rules:\n- {resource: api, threshold: 5.0, behavior: Reject}\n"), 0o644))
	code, out, errOut := runCmd("fmt", path)
	require.Equal(t, 0, code, errOut)
	normal := "rules:\n  - resource: api\n    threshold: 5\n"
	assert.Equal(t, normal, out)
	code, _, _ = runCmd("fmt", "-w", path)
	require.Equal(t, 0, code)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, normal, string(got))
}

// fmt -w never rewrites a file it read into one that loses rules, renames
// resources, does not parse, or fails check.
func TestFmtWriteNeverDestroys(t *testing.T) {
	for _, tc := range []struct{ name, body string }{
		{"second document dropped", "rules:\n  - resource: a\n    threshold: 5\n---\nrules:\n  - resource: b\n    threshold: 6\n"},
		{"unparseable output", "rules:\n  - resource: \"? a\"\n    threshold: 5\n"},
		{"resource renamed", "rules:\n  - resource: \".nan\"\n    threshold: 5\n"},
		{"resource renamed (tab)", "rules:\n  - resource: \"a\\tb\"\n    threshold: 5\n"},
		{"check panics afterwards", "rules:\n  - resource: a\n    threshold: 5\n    global: true\n    localShare: 0.00001\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "r.yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.body), 0o644))
			code, before, errOut := runCmd("check", path)
			if code != 0 {
				// A file check refuses: fmt -w refuses it too and leaves it.
				code, _, _ = runCmd("fmt", "-w", path)
				assert.Equal(t, 1, code)
				written, _ := os.ReadFile(path)
				assert.Equal(t, tc.body, string(written))
				return
			}
			code, _, errOut = runCmd("fmt", "-w", path)
			require.Equal(t, 0, code, errOut)
			written, _ := os.ReadFile(path)
			if strings.Contains(tc.body, "resource: b") {
				assert.Contains(t, string(written), "resource: b", "fmt -w deleted the second document")
			}
			defer func() {
				if v := recover(); v != nil {
					t.Errorf("check of the rewritten file %q panicked: %v", written, v)
				}
			}()
			code, after, errOut := runCmd("check", path)
			assert.Equal(t, 0, code, "rewritten as %q: %s", written, errOut)
			assert.Equal(t, before, after, "rewritten as %q", written)
		})
	}
}

// check refuses a 100 MB file and /dev/zero with a clear message and a
// non-zero exit, without reading them: the process's peak RSS stays within
// 30 MB of a check of a small file (run as children, measured by their
// rusage; the command's own size, with serve's gRPC and protobuf types,
// is the baseline).
func TestCheckRefusesHugeAndEndlessFilesCheaply(t *testing.T) {
	if p := os.Getenv("LEAPFLOW_CHECK_CHILD"); p != "" {
		os.Exit(run([]string{"check", p}, io.Discard, os.Stderr))
	}
	dir := t.TempDir()
	huge := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(huge)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(100<<20))
	require.NoError(t, f.Close())
	child := func(path string) (*exec.Cmd, []byte, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestCheckRefusesHugeAndEndlessFilesCheaply$")
		cmd.Env = append(os.Environ(), "LEAPFLOW_CHECK_CHILD="+path)
		out, err := cmd.CombinedOutput()
		return cmd, out, err
	}
	small := filepath.Join(dir, "small.yaml")
	require.NoError(t, os.WriteFile(small, []byte("rules:\n  - resource: a\n    threshold: 1\n"), 0o644))
	cmd, out, err := child(small)
	require.NoError(t, err, "%s", out)
	base, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	for path, want := range map[string]string{huge: "more than 8388608", "/dev/zero": "not a regular file (a device)"} {
		cmd, out, err := child(path)
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "%s: exits non-zero\n%s", path, out)
		assert.Contains(t, string(out), want, path)
		if ru, ok2 := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok && ok2 {
			t.Logf("%s: peak RSS %d KiB, a small file's %d KiB", path, ru.Maxrss, base.Maxrss)
			assert.Less(t, ru.Maxrss, base.Maxrss+30<<10, "%s: peak RSS in KiB", path) // Linux reports KiB
		}
	}
}

// fmt keeps every comment of a file, each beside the rule or key it was
// written beside, and formats its own output to itself: the commented
// example file keeps all its comment lines, in order.
func TestFmtKeepsComments(t *testing.T) {
	src, err := os.ReadFile("../../docs/rules.yaml")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, src, 0o644))
	code, out, errOut := runCmd("fmt", path)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, commentLines(string(src)), commentLines(out))

	code, _, errOut = runCmd("fmt", "-w", path)
	require.Equal(t, 0, code, errOut)
	code, again, errOut := runCmd("fmt", path)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, out, again, "the normal form formats to itself")
	code, before, _ := runCmd("check", "../../docs/rules.yaml")
	require.Equal(t, 0, code)
	code, after, _ := runCmd("check", path)
	require.Equal(t, 0, code)
	assert.Equal(t, strings.SplitN(before, "\n", 2)[1], strings.SplitN(after, "\n", 2)[1], "the same rules")
}

// commentLines are the comments of a YAML text, in order.
func commentLines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "#") {
			out = append(out, t)
		} else if i := strings.Index(l, " #"); i >= 0 {
			out = append(out, strings.TrimSpace(l[i:]))
		}
	}
	return out
}

// fmt takes a directory as check does: it formats each of its rule files
// (printing each one's name first), and -w rewrites each but the .json
// ones (the normal form is YAML).
func TestFmtTakesDirectories(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.json")
	require.NoError(t, os.WriteFile(a, []byte("rules:\n# a's rule\n- {resource: a, threshold: 5.0}\n"), 0o644))
	require.NoError(t, os.WriteFile(b, []byte(`{"rules": [{"resource": "b", "threshold": 1e3}]}`), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not rules"), 0o644))
	code, out, errOut := runCmd("fmt", dir)
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "# "+a+"\nrules:\n  # a's rule\n  - resource: a\n    threshold: 5\n"+
		"# "+b+"\nrules:\n  - resource: b\n    threshold: 1000\n", out)

	code, _, errOut = runCmd("fmt", "-w", dir)
	assert.Equal(t, 1, code, "a .json file is not rewritten as YAML")
	assert.Contains(t, errOut, b+": not rewritten: the normal form is YAML")
	got, _ := os.ReadFile(a)
	assert.Equal(t, "rules:\n  # a's rule\n  - resource: a\n    threshold: 5\n", string(got))
	got, _ = os.ReadFile(b)
	assert.Equal(t, `{"rules": [{"resource": "b", "threshold": 1e3}]}`, string(got))

	code, _, errOut = runCmd("fmt", t.TempDir())
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "no rule files")
}
