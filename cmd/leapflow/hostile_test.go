package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// BUG 16: fmt -w rewrites files it read "fine" into files that lose rules,
// rename resources, do not parse, or crash check.
func TestHostileFmtWriteNeverDestroys(t *testing.T) {
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
