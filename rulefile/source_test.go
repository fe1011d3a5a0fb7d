package rulefile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const debounce = 150 * time.Millisecond

// rulesOf is a file with one rule on api at threshold.
func rulesOf(threshold string) string {
	return "rules:\n  - id: api\n    resource: api\n    threshold: " + threshold + "\n"
}

// watch starts following path on a fresh engine under live traffic.
func watch(t *testing.T, path string) (*flow.Engine, *Sync, *[]error) {
	t.Helper()
	eng, err := flow.New()
	require.NoError(t, err)
	var mu sync.Mutex
	var errs []error
	src := NewFileSource(path, WithDebounce(debounce))
	s := Start(eng, src, WithOnError(func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
	}))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // live traffic
		defer wg.Done()
		for ctx.Err() == nil {
			if en, err := eng.Entry("api"); err == nil {
				en.Exit(nil)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		s.Stop()
	})
	return eng, s, &errs
}

// settled waits until the sync has applied want rule sets, then a while
// longer, and checks the count stays there: one reload per change. The
// wait is real time (3 debounces, 450 ms), as an exception to the 100 ms
// rule: the kernel's file events arrive when they do, and no fake clock
// can say that no more are coming (TestDebounceOnAnInjectedClock checks
// the debounce itself on a fake one).
func settled(t *testing.T, s *Sync, want int64, step string) {
	t.Helper()
	require.Eventually(t, func() bool { return s.Reloads() >= want }, 5*time.Second, 10*time.Millisecond, step)
	time.Sleep(3 * debounce)
	require.Equal(t, want, s.Reloads(), "%s: exactly one reload", step)
}

func threshold(t *testing.T, eng *flow.Engine) float64 {
	t.Helper()
	rules := eng.Rules()
	require.Len(t, rules, 1)
	return rules[0].Threshold
}

// TestFileSourceFollowsEveryKindOfEdit: writes in place, an editor's
// rename over, delete and re-create, truncate then write, a bad file then
// a good one, an empty file and an explicit empty list: each ends in
// exactly one reload of the final content, and a bad file keeps the rules
// in force.
func TestFileSourceFollowsEveryKindOfEdit(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("1")), 0o644))
	eng, s, errs := watch(t, path)
	settled(t, s, 1, "start")
	assert.Equal(t, 1.0, threshold(t, eng))

	require.NoError(t, os.WriteFile(path, []byte(rulesOf("2")), 0o644))
	settled(t, s, 2, "write in place")
	assert.Equal(t, 2.0, threshold(t, eng))

	// vim: the old file moves to a backup, a new one is written, the backup goes.
	require.NoError(t, os.Rename(path, path+"~"))
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("3")), 0o644))
	require.NoError(t, os.Remove(path+"~"))
	settled(t, s, 3, "vim-style rename")
	assert.Equal(t, 3.0, threshold(t, eng))

	// An editor writing a temporary file and renaming it over.
	tmp := filepath.Join(dir, ".rules.yaml.tmp")
	require.NoError(t, os.WriteFile(tmp, []byte(rulesOf("4")), 0o644))
	require.NoError(t, os.Rename(tmp, path))
	settled(t, s, 4, "rename over")
	assert.Equal(t, 4.0, threshold(t, eng))

	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("5")), 0o644))
	settled(t, s, 5, "delete and re-create")
	assert.Equal(t, 5.0, threshold(t, eng))

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	_, err = f.WriteString(rulesOf("6"))
	require.NoError(t, err)
	require.NoError(t, f.Close())
	settled(t, s, 6, "truncate then write")
	assert.Equal(t, 6.0, threshold(t, eng))

	require.NoError(t, os.WriteFile(path, []byte(rulesOf("6")), 0o644))
	settled(t, s, 6, "the same content again")

	require.NoError(t, os.WriteFile(path, []byte("rules:\n  - resource: api\n    treshold: 7\n"), 0o644))
	require.Eventually(t, func() bool { return s.LastError() != nil }, 5*time.Second, 10*time.Millisecond)
	settled(t, s, 6, "a bad file")
	assert.Equal(t, 6.0, threshold(t, eng), "the rules in force stay")
	assert.ErrorContains(t, s.LastError(), `rules.yaml:3:5: rule #0: unknown field "treshold"`)
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("7")), 0o644))
	settled(t, s, 7, "good again")
	assert.Equal(t, 7.0, threshold(t, eng))
	assert.NoError(t, s.LastError())

	require.NoError(t, os.WriteFile(path, nil, 0o644))
	require.Eventually(t, func() bool { return s.LastError() != nil }, 5*time.Second, 10*time.Millisecond)
	settled(t, s, 7, "an empty file")
	assert.Equal(t, 7.0, threshold(t, eng))
	require.NoError(t, os.WriteFile(path, []byte("rules: []\n"), 0o644))
	settled(t, s, 8, "an explicit empty list")
	assert.Empty(t, eng.Rules())
	assert.Len(t, *errs, 2, "each failed update was reported")
}

// TestFileSourceFollowsAConfigMap: a Kubernetes ConfigMap volume updates
// by swapping its ..data symlink; the file's own link never changes.
func TestFileSourceFollowsAConfigMap(t *testing.T) {
	dir := t.TempDir()
	version := func(name, threshold string) {
		require.NoError(t, os.Mkdir(filepath.Join(dir, name), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name, "rules.yaml"), []byte(rulesOf(threshold)), 0o644))
	}
	version("..v1", "1")
	require.NoError(t, os.Symlink("..v1", filepath.Join(dir, "..data")))
	require.NoError(t, os.Symlink(filepath.Join("..data", "rules.yaml"), filepath.Join(dir, "rules.yaml")))
	eng, s, _ := watch(t, filepath.Join(dir, "rules.yaml"))
	settled(t, s, 1, "start")
	version("..v2", "2")
	require.NoError(t, os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
	require.NoError(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "..v1")))
	settled(t, s, 2, "symlink swap")
	assert.Equal(t, 2.0, threshold(t, eng))
}

// TestDirectorySource: a directory's files merge; an ID defined twice is
// an error that keeps the rules.
func TestDirectorySource(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rulesOf("1")), 0o644))
	eng, s, _ := watch(t, dir)
	settled(t, s, 1, "start")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b.json"), []byte(`{"rules": [{"id": "b", "resource": "b", "threshold": 2}]}`), 0o644))
	settled(t, s, 2, "a second file")
	assert.Len(t, eng.Rules(), 2)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "c.yaml"), []byte(rulesOf("3")), 0o644))
	require.Eventually(t, func() bool { return s.LastError() != nil }, 5*time.Second, 10*time.Millisecond)
	assert.ErrorContains(t, s.LastError(), "defined in")
	assert.Len(t, eng.Rules(), 2)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644))
	settled(t, s, 2, "other files are not rules")
}

// TestMemorySource: the in-memory source applies each Set; a rule set the
// engine refuses is reported and changes nothing.
func TestMemorySource(t *testing.T) {
	eng, err := flow.New()
	require.NoError(t, err)
	src := NewMemorySource([]flow.Rule{{Resource: "a", Threshold: 1}})
	reported := make(chan error, 4)
	s := Start(eng, src, WithOnError(func(err error) { reported <- err }))
	defer s.Stop()
	require.Eventually(t, func() bool { return s.Reloads() == 1 }, time.Second, time.Millisecond)
	src.Set([]flow.Rule{{Resource: "a", Threshold: -1}})
	var re *flow.RuleError
	assert.True(t, errors.As(<-reported, &re))
	assert.ErrorAs(t, s.LastError(), &re)
	assert.Equal(t, 1.0, eng.Rules()[0].Threshold)
	src.Set([]flow.Rule{{Resource: "a", Threshold: 3}})
	require.Eventually(t, func() bool { return s.Reloads() == 2 }, time.Second, time.Millisecond)
	assert.NoError(t, s.LastError())
}

// fakeTimer is a debounce timer the test fires.
type fakeTimer struct {
	mu      sync.Mutex
	fn      func()
	stopped bool
}

func (f *fakeTimer) Stop() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	was := !f.stopped
	f.stopped = true
	return was
}

// TestDebounceOnAnInjectedClock: each event restarts the debounce; only
// the last timer of a burst is live, and firing it reads the file once.
func TestDebounceOnAnInjectedClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("1")), 0o644))
	var mu sync.Mutex
	var timers []*fakeTimer
	src := NewFileSource(path)
	src.after = func(_ time.Duration, fn func()) interface{ Stop() bool } {
		ft := &fakeTimer{fn: fn}
		mu.Lock()
		defer mu.Unlock()
		timers = append(timers, ft)
		return ft
	}
	eng, err := flow.New()
	require.NoError(t, err)
	s := Start(eng, src)
	defer s.Stop()
	require.Eventually(t, func() bool { return s.Reloads() == 1 }, 5*time.Second, time.Millisecond)
	for _, th := range []string{"2", "3", "4"} {
		require.NoError(t, os.WriteFile(path, []byte(rulesOf(th)), 0o644))
		time.Sleep(20 * time.Millisecond) // the event goes through
	}
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(timers) >= 3 }, 5*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, int64(1), s.Reloads(), "nothing read before the debounce ends")
	mu.Lock()
	last := timers[len(timers)-1]
	for _, ft := range timers[:len(timers)-1] {
		assert.True(t, ft.stopped, "an earlier timer of the burst was stopped")
	}
	mu.Unlock()
	last.fn()
	require.Eventually(t, func() bool { return s.Reloads() == 2 }, 5*time.Second, time.Millisecond)
	assert.Equal(t, 4.0, eng.Rules()[0].Threshold, "the final content")
}

// A rule file that is a symlink (not a ConfigMap ..data swap) is read
// through the link, and edits of its target are seen, in the same directory
// or another one.
func TestSourceSeesEditsOfASymlinkTarget(t *testing.T) {
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

// Once the watched directory is removed, re-creating it is seen: the source
// reads the file again and LastError says what happened.
func TestSourceSeesItsDirectoryRecreated(t *testing.T) {
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

// The same for a directory missing at Start.
func TestSourceSeesItsDirectoryCreatedAfterStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "conf")
	path := filepath.Join(dir, "rules.yaml")
	eng, err := flow.New()
	require.NoError(t, err)
	src := NewFileSource(path, WithDebounce(debounce))
	s := Start(eng, src)
	defer s.Stop()
	require.Eventually(t, func() bool { return s.LastError() != nil }, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("2")), 0o644))
	require.Eventually(t, func() bool { return len(eng.Rules()) == 1 }, 10*time.Second, 10*time.Millisecond, "last error: %v", s.LastError())
}

// A directory source whose rule files are all removed (an rm before a cp in
// a deploy) keeps its rules, as a missing or empty file does: clearing
// every rule takes an explicit rules: [].
func TestSourceKeepsRulesWhenItsDirectoryEmpties(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rulesOf("1")), 0o644))
	eng, s, _ := watch(t, dir)
	settled(t, s, 1, "start")
	require.NoError(t, os.Remove(filepath.Join(dir, "a.yaml")))
	require.Eventually(t, func() bool { return s.LastError() != nil }, 10*time.Second, 10*time.Millisecond)
	assert.Len(t, eng.Rules(), 1, "the rules in force stay")
}

// When the kernel's event queue overflows (fsnotify's ErrEventOverflow) the
// source reports it and reads the file again: the edit whose event was
// dropped is applied, and LastError clears.
func TestSourceRereadsAfterAnEventOverflow(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	require.NoError(t, os.WriteFile(path, []byte(rulesOf("1")), 0o644))
	eng, err := flow.New()
	require.NoError(t, err)
	src := NewFileSource(path, WithDebounce(10*time.Millisecond))
	release, blocked := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s := Start(eng, src, WithOnError(func(error) { once.Do(func() { close(blocked); <-release }) }))
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
