package rulefile

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// A rule file with "threshold: 1e3" (or "5" quoted, or 1e-05 as Format
// writes it) panics inside Parse; under a FileSource the panic is on the
// Sync goroutine and kills the whole process.
func TestFileSourceSurvivesAnyFile(t *testing.T) {
	if dir := os.Getenv("ADV_CRASH_DIR"); dir != "" {
		path := filepath.Join(dir, "rules.yaml")
		eng, _ := flow.New()
		s := Start(eng, NewFileSource(path), Options{})
		defer s.Stop()
		time.Sleep(500 * time.Millisecond)
		return
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("rules:\n  - resource: api\n    threshold: 1e3\n"), 0o644))
	cmd := exec.Command(os.Args[0], "-test.run=^TestFileSourceSurvivesAnyFile$")
	cmd.Env = append(os.Environ(), "ADV_CRASH_DIR="+dir)
	out, err := cmd.CombinedOutput()
	assert.NoError(t, err, "the process survives a bad rule file:\n%.600s", out)
}
