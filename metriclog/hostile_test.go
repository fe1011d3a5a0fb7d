package metriclog

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat/stattest"
)

// A delivery larger than the writer's 64 KiB buffer reaches lumberjack in
// 64 KiB chunks cut at any byte; when the file is rotated between two
// chunks, a line is split across two files: the old one ends without a
// newline (Read skips it as a crash remnant) and the new one starts with
// the rest, which does not parse, so ReadFiles fails and every later line
// is unreadable.
func TestHostileRotationSplitsLines(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	const resources = 3600
	eng := engine(t, clock, resources+10)
	path := filepath.Join(t.TempDir(), "m.log")
	w, err := NewWriter(eng, path, Options{MaxSize: 1, MaxBackups: -1})
	require.NoError(t, err)
	want := 0
	for s := 11; s <= 16; s++ {
		clock.Set(time.Duration(s)*time.Second + time.Millisecond)
		for i := range resources {
			enter(t, eng, fmt.Sprintf("resource-with-a-longish-name-%05d", i), 1, nil)
		}
		want += resources
		clock.Set(time.Duration(s+2) * time.Second)
		eng.Feed().Poll()
	}
	require.NoError(t, w.Close())
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(path), "*"))
	t.Logf("%d files", len(files))
	n := 0
	err = ReadFiles(path, func(Line) error { n++; return nil })
	require.NoError(t, err)
	assert.Equal(t, want, n)
}

// A line cut short by a crash is fine as the last line of a file, but the
// writer appends to the file after a restart: the next line is glued to
// the remnant, Read fails at it, and nothing after it can be read.
func TestHostileAppendAfterCrashRemnant(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock, 16)
	path := filepath.Join(t.TempDir(), "m.log")
	require.NoError(t, os.WriteFile(path, []byte("1764558000000|2026-12-01 03:00:00|api|1|0|1|0|0|0|0\n1764558001000|2026-12-01 03:0"), 0o644))
	w, err := NewWriter(eng, path, Options{})
	require.NoError(t, err)
	clock.Set(11*time.Second + time.Millisecond)
	enter(t, eng, "api", 2, nil)
	clock.Set(12*time.Second + time.Millisecond)
	enter(t, eng, "api", 3, nil)
	clock.Set(14 * time.Second)
	eng.Feed().Poll()
	require.NoError(t, w.Close())
	raw, _ := os.ReadFile(path)
	t.Logf("%q", raw)
	var got []Line
	err = ReadFilesSkipBad(path, func(l Line) error { got = append(got, l); return nil })
	require.NoError(t, err, "the lines written after the restart are readable")
	assert.Len(t, got, 3, "the remnant of the cut line is skipped, the lines after it kept")
	err = ReadFiles(path, func(Line) error { return nil })
	assert.ErrorContains(t, err, "line 2", "a strict reader names the remnant")
}

// Two writers on one engine (two files), or a writer and the engine's own
// shutdown (eng.Feed().Close(), as promflow asks): each Close closes the
// engine's feed, and the second Close of a started feed panics.
func TestHostileTwoWritersClose(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock, 16)
	dir := t.TempDir()
	w1, err := NewWriter(eng, filepath.Join(dir, "a.log"), Options{})
	require.NoError(t, err)
	w2, err := NewWriter(eng, filepath.Join(dir, "b.log"), Options{})
	require.NoError(t, err)
	require.NoError(t, w1.Close())
	assert.NotPanics(t, func() { _ = w2.Close() })
}
