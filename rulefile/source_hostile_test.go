package rulefile

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// BUG 10: a rule file that is a symlink (not a ConfigMap ..data swap) is
// read through the link, but edits of its target are never seen: events
// name the target, which the filter drops (same directory) or which is not
// watched at all (another directory).
func TestSourceHostileSymlinkTargetEdited(t *testing.T) {
	for _, elsewhere := range []bool{false, true} {
		dir := t.TempDir()
		tdir := dir
		if elsewhere {
			tdir = t.TempDir()
		}
		target := filepath.Join(tdir, "rules.prod.yaml")
		require.NoError(t, os.WriteFile(target, []byte(rulesOf("1")), 0o644))
		require.NoError(t, os.Symlink(target, filepath.Join(dir, "rules.yaml")))
		eng, s, _ := watch(t, filepath.Join(dir, "rules.yaml"))
		settled(t, s, 1, "start")
		require.NoError(t, os.WriteFile(target, []byte(rulesOf("2")), 0o644))
		require.Eventually(t, func() bool { return s.Reloads() == 2 }, 10*time.Second, 10*time.Millisecond, "target elsewhere: %v", elsewhere)
		assert.Equal(t, 2.0, threshold(t, eng), "target elsewhere: %v", elsewhere)
	}
}

// BUG 11: once the watched directory is removed (or was missing at
// Start), the source is dead for good: re-creating it is never seen, and
// LastError still says only that the file is missing.
func TestSourceHostileWatchedDirectoryRecreated(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "conf")
	require.NoError(t, os.Mkdir(dir, 0o755))
	path := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("1")), 0o644))
	eng, s, _ := watch(t, path)
	settled(t, s, 1, "start")
	require.NoError(t, os.RemoveAll(dir))
	require.Eventually(t, func() bool { return s.LastError() != nil }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("2")), 0o644))
	require.Eventually(t, func() bool { return s.Reloads() == 2 }, 10*time.Second, 10*time.Millisecond, "last error: %v", s.LastError())
	assert.Equal(t, 2.0, threshold(t, eng))
}

func TestSourceHostileWatchedDirectoryMissingAtStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "conf")
	path := filepath.Join(dir, "rules.yaml")
	eng, err := flow.New()
	require.NoError(t, err)
	src := NewFileSource(path)
	src.Debounce = debounce
	s := Start(eng, src, Options{})
	defer s.Stop()
	require.Eventually(t, func() bool { return s.LastError() != nil }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("2")), 0o644))
	require.Eventually(t, func() bool { return len(eng.Rules()) == 1 }, 10*time.Second, 10*time.Millisecond, "last error: %v", s.LastError())
}

// BUG 12: a directory source whose rule files are all removed (an rm
// before a cp in a deploy) clears every rule, though a missing or empty
// file keeps them and "clearing every rule takes an explicit rules: []".
func TestSourceHostileEmptiedDirectoryClearsEveryRule(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rulesOf("1")), 0o644))
	eng, s, _ := watch(t, dir)
	settled(t, s, 1, "start")
	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	require.Eventually(t, func() bool { return s.LastError() != nil }, 10*time.Second, 10*time.Millisecond)
	assert.Len(t, eng.Rules(), 1, "the rules in force stay")
}

// BUG 13: when the kernel's event queue overflows (fsnotify's
// ErrEventOverflow) the source reports the error but never reads the file
// again: the edit whose event was dropped is never applied, and LastError
// stays the overflow.
func TestSourceHostileOverflowLosesTheLastEdit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("1")), 0o644))
	eng, err := flow.New()
	require.NoError(t, err)
	src := NewFileSource(path)
	src.Debounce = 10 * time.Millisecond
	release, blocked := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s := Start(eng, src, Options{OnError: func(error) { once.Do(func() { close(blocked); <-release }) }})
	defer s.Stop()
	require.Eventually(t, func() bool { return s.Reloads() == 1 }, 5*time.Second, time.Millisecond)
	// A bad write; the sync is held in OnError (any slow update will do).
	require.NoError(t, os.WriteFile(path, []byte("rules:\n  - resource: api\n    treshold: 1\n"), 0o644))
	<-blocked
	for i := range 20000 { // other files' churn fills the kernel queue
		f := filepath.Join(dir, fmt.Sprintf("x%d.txt", i))
		require.NoError(t, os.WriteFile(f, nil, 0o644))
		require.NoError(t, os.Remove(f))
	}
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("9")), 0o644))
	close(release)
	require.Eventually(t, func() bool { return eng.Rules()[0].Threshold == 9 && s.LastError() == nil }, 10*time.Second, 10*time.Millisecond,
		"the final content is applied and the error cleared (last error: %v)", s.LastError())
}
