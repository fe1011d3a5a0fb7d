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
