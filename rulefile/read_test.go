package rulefile

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// Rule files are read through a limit: what is not a regular file once
// symlinks are followed (a device, a FIFO) is refused before it is read,
// naming the path; a file over MaxFileSize is refused by its size; a
// ConfigMap-style symlink to a regular file reads as the file.
func TestRuleFilesAreReadThroughALimit(t *testing.T) {
	dir := t.TempDir()
	zero := filepath.Join(dir, "zero.yaml")
	require.NoError(t, os.Symlink("/dev/zero", zero))
	_, err := ReadFile(zero)
	require.Error(t, err)
	assert.Contains(t, err.Error(), zero)
	assert.Contains(t, err.Error(), "not a regular file")

	fifo := filepath.Join(dir, "fifo.yaml")
	require.NoError(t, syscall.Mkfifo(fifo, 0o600))
	done := make(chan error, 1)
	go func() { _, err := ReadFile(fifo); done <- err }()
	select {
	case err := <-done:
		assert.ErrorContains(t, err, "not a regular file")
	case <-time.After(5 * time.Second):
		t.Error("reading a FIFO blocked")
	}

	huge := filepath.Join(dir, "huge.yaml")
	f, err := os.Create(huge)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(100<<20)) // sparse: 100 MB that take no disk
	require.NoError(t, f.Close())
	_, err = ReadFile(huge)
	assert.ErrorContains(t, err, "more than 8388608")

	real := filepath.Join(dir, "..data", "rules.yaml")
	require.NoError(t, os.MkdirAll(filepath.Dir(real), 0o755))
	require.NoError(t, os.WriteFile(real, []byte("rules:\n  - resource: api\n    threshold: 5\n"), 0o644))
	link := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.Symlink(real, link))
	rules, err := ReadFile(link)
	require.NoError(t, err)
	require.Len(t, rules, 1)
}

// A watched rule file replaced by a symlink to /dev/zero, or by a huge
// file, leaves the rules in force and reports the error naming the path.
func TestWatchedFileTurnedHostileKeepsTheRules(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte("rules:\n  - resource: api\n    threshold: 5\n"), 0o644))
	eng, err := flow.New()
	require.NoError(t, err)
	errs := make(chan error, 8)
	s := Start(eng, NewFileSource(path, WithDebounce(10*time.Millisecond)), WithOnError(func(err error) { errs <- err }))
	defer s.Stop()
	require.Eventually(t, func() bool { return s.Reloads() == 1 }, 5*time.Second, time.Millisecond)
	for _, hostile := range []func(){
		func() { require.NoError(t, os.Remove(path)); require.NoError(t, os.Symlink("/dev/zero", path)) },
		func() {
			require.NoError(t, os.Remove(path))
			f, err := os.Create(path)
			require.NoError(t, err)
			require.NoError(t, f.Truncate(100<<20))
			require.NoError(t, f.Close())
		},
	} {
		hostile()
		select {
		case err := <-errs:
			assert.Contains(t, err.Error(), path)
		case <-time.After(5 * time.Second):
			t.Fatal("no error reported")
		}
		require.Len(t, eng.Rules(), 1, "the rules in force stay")
	}
}
