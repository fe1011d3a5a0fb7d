package metriclog

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// lumberjack's mill goroutine outlives its Logger (one per path: see
// loggerFor); the default clock's ticker lives as long as the process.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("gopkg.in/natefinch/lumberjack%2ev2.(*Logger).millRun"),
		goleak.IgnoreTopFunction("github.com/leapflow/leapflow/internal/clocks.(*Coarse).run"))
}

func engine(t *testing.T, clock *stattest.Clock, max int) *flow.Engine {
	t.Helper()
	e, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(max))
	require.NoError(t, err)
	return e
}

func readAll(t *testing.T, path string) []Line {
	t.Helper()
	var lines []Line
	require.NoError(t, ReadFiles(path, func(l Line) error {
		lines = append(lines, l)
		return nil
	}))
	return lines
}

func enter(t *testing.T, e *flow.Engine, res string, n int, err error) {
	t.Helper()
	for range n {
		en, eerr := e.Entry(res)
		require.NoError(t, eerr)
		en.Exit(err)
	}
}

// TestWriteAndReadBack: each completed second is one line with the exact
// counts; Close writes the rest, the running second marked partial; a
// hostile resource name reads back as it was.
func TestWriteAndReadBack(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, 16)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "api", Threshold: 3}}))
	path := filepath.Join(t.TempDir(), "logs", "metrics.log")
	w, err := NewWriter(eng, path)
	require.NoError(t, err)
	hostile := "a|b\nc%7C\r"
	clock.Set(time.Second + 100*time.Millisecond)
	enter(t, eng, "api", 3, nil)
	_, err = eng.Entry("api")
	require.ErrorIs(t, err, flow.ErrBlocked)
	enter(t, eng, hostile, 2, os.ErrClosed)
	clock.Set(2*time.Second + 500*time.Millisecond)
	enter(t, eng, "api", 1, nil)
	clock.Set(3*time.Second + 100*time.Millisecond)
	eng.Feed().Poll() // second 1 is out
	clock.Set(3*time.Second + 200*time.Millisecond)
	enter(t, eng, "api", 2, nil)
	require.NoError(t, w.Close())
	require.NoError(t, w.Close(), "idempotent")

	lines := readAll(t, path)
	got := map[string]Line{}
	for _, l := range lines {
		got[l.Resource+"@"+strconv.FormatInt(l.Time.Unix()%10, 10)] = l
	}
	require.Len(t, lines, 4, "%v", lines)
	first := lines[0].Time
	assert.Equal(t, first, first.Truncate(time.Second))
	api1 := got["api@"+strconv.FormatInt(first.Unix()%10, 10)]
	assert.Equal(t, int64(3), api1.Pass)
	assert.Equal(t, int64(1), api1.Block)
	assert.Equal(t, int64(3), api1.Success)
	h := got[hostile+"@"+strconv.FormatInt(first.Unix()%10, 10)]
	assert.Equal(t, hostile, h.Resource)
	assert.Equal(t, int64(2), h.Exception)
	last := lines[len(lines)-1]
	assert.True(t, last.Partial)
	assert.Equal(t, int64(2), last.Pass)
	assert.Equal(t, first.Add(2*time.Second), last.Time)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, 4, strings.Count(string(raw), "\n"), "one line per second, newlines in names escaped")
}

// TestRotationKeepsEveryLine: past MaxSize the file rotates; reading the
// backups and the file gives back every line, in order.
func TestRotationKeepsEveryLine(t *testing.T) {
	clock := stattest.NewClock(0)
	const resources, seconds = 500, 50
	eng := engine(t, clock, resources)
	path := filepath.Join(t.TempDir(), "metrics.log")
	w, err := NewWriter(eng, path, WithMaxSize(1), WithMaxBackups(100))
	require.NoError(t, err)
	name := strings.Repeat("r", 40)
	for s := 1; s <= seconds; s++ {
		clock.Set(time.Duration(s) * time.Second)
		for i := range resources {
			enter(t, eng, name+strconv.Itoa(i), 1, nil)
		}
		eng.Feed().Poll()
	}
	require.NoError(t, w.Close())
	lines := readAll(t, path)
	require.Len(t, lines, resources*seconds)
	for i := 1; i < len(lines); i++ {
		require.False(t, lines[i].Time.Before(lines[i-1].Time), "in order: line %d %v after %v", i, lines[i].Time, lines[i-1].Time)
	}
	files, err := filepath.Glob(filepath.Join(filepath.Dir(path), "metrics-*.log"))
	require.NoError(t, err)
	assert.NotEmpty(t, files, "rotated at 1 MB")
}

// TestReopenedWritersShareOneMill: writers opened again and again on one
// path leave at most one lumberjack goroutine behind.
func TestReopenedWritersShareOneMill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	for range 5 {
		clock := stattest.NewClock(0)
		eng := engine(t, clock, 4)
		w, err := NewWriter(eng, path)
		require.NoError(t, err)
		clock.Set(time.Second)
		enter(t, eng, "x", 1, nil)
		require.NoError(t, w.Close())
	}
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	assert.LessOrEqual(t, strings.Count(stacks, "lumberjack.(*Logger).millRun"), 1)
	assert.Len(t, readAll(t, path), 5)
}

// TestParseErrors: a bad line names its field and value, and its number.
func TestParseErrors(t *testing.T) {
	for line, want := range map[string]string{
		"1|2026-12-01 00:00:00|r|1|2|3|4|5|6":                        "9 fields",
		"x|2026-12-01 00:00:00|r|1|2|3|4|5|6|7":                      "field timestamp",
		"1|2026-12-01 00:00:00|r|1|b|3|4|5|6|7":                      "field block",
		"1|2026-12-01 00:00:00|%zz|1|2|3|4|5|6|7":                    "field resource",
		"1|2026-12-01 00:00:00|r|1|2|3|4|5|6|7|odd":                  "field breaker",
		"1|2026-12-01 00:00:00|r|1|2|3|4|5|6|7|breaker:Ajar:1":       "state \"Ajar\"",
		"1|2026-12-01 00:00:00|r|1|2|3|4|5|6|7|breaker:Open:-1":      "field breaker",
		"1|2026-12-01 00:00:00|r|1|2|3|4|5|6|7|breaker:Open:1|x|y":   "13 fields",
		"1|2026-12-01 00:00:00|r|1|2|3|4|5|6|breaker:Open:1|partial": "field concurrency",
	} {
		_, err := ParseLine(line)
		require.Error(t, err, line)
		assert.Contains(t, err.Error(), want, line)
	}
	err := Read(strings.NewReader("1|2026-12-01 00:00:00|r|1|2|3|4|5|6|7\nbad\n"), func(Line) error { return nil })
	assert.ErrorContains(t, err, "line 2")
	var n int
	require.NoError(t, Read(strings.NewReader("1|2026-12-01 00:00:00|r|1|2|3|4|5|6|7\n1|2026-12"), func(Line) error { n++; return nil }))
	assert.Equal(t, 1, n, "a last line cut short is skipped")

	s := stat.Second{Resource: "r", Time: time.UnixMilli(1_764_558_000_000), Pass: 1, Success: 4, RT: 10 * time.Millisecond}
	l, err := ParseLine(strings.TrimSuffix(string(AppendLine(nil, &s)), "\n"))
	require.NoError(t, err)
	assert.Equal(t, Line{Time: s.Time.UTC(), Resource: "r", Pass: 1, Success: 4, AvgRT: 2 * time.Millisecond}, l)
	l, err = ParseLine("1|2026-12-01 00:00:00|r|1|2|3|4|5|6|7|breaker:HalfOpen:2|partial")
	require.NoError(t, err)
	assert.Equal(t, [3]any{"HalfOpen", int64(2), true}, [3]any{l.Breaker, l.BreakerOpened, l.Partial})
}

// The line of a resource with circuit breakers carries their state when
// written and how many times they opened since its previous line; other
// resources' lines have no breaker field.
func TestBreakerFieldSaysStateAndOpenings(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, 16)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "dep", Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: 1500 * time.Millisecond}}))
	path := filepath.Join(t.TempDir(), "metrics.log")
	w, err := NewWriter(eng, path)
	require.NoError(t, err)
	clock.Set(100 * time.Millisecond)
	enter(t, eng, "plain", 1, nil)
	enter(t, eng, "dep", 1, errors.New("down")) // opens it
	_, err = eng.Entry("dep")
	require.ErrorIs(t, err, flow.ErrBlocked)
	clock.Set(2100 * time.Millisecond)
	eng.Feed().Poll()                           // second 0 is out: dep open, opened once
	enter(t, eng, "dep", 1, errors.New("down")) // the probe fails: open again
	clock.Set(3600 * time.Millisecond)
	enter(t, eng, "dep", 1, nil) // the probe closes it
	clock.Set(5 * time.Second)
	require.NoError(t, w.Close())

	var dep []Line
	for _, l := range readAll(t, path) {
		switch l.Resource {
		case "plain":
			assert.Empty(t, l.Breaker)
		case "dep":
			dep = append(dep, l)
		}
	}
	require.Len(t, dep, 3, "%v", dep)
	assert.Equal(t, [2]any{"Open", int64(1)}, [2]any{dep[0].Breaker, dep[0].BreakerOpened})
	// Seconds 2 and 3 go out together: the state when written, the
	// opening (by the failed probe) on the resource's last line of them.
	assert.Equal(t, [2]any{"Closed", int64(0)}, [2]any{dep[1].Breaker, dep[1].BreakerOpened})
	assert.Equal(t, [2]any{"Closed", int64(1)}, [2]any{dep[2].Breaker, dep[2].BreakerOpened})
}

// A delivery larger than the writer's buffer is written whole lines at a
// time: a rotation between two writes never splits a line across two files,
// and ReadFiles reads every line.
func TestRotationNeverSplitsALine(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	const resources = 3600
	eng := engine(t, clock, resources+10)
	path := filepath.Join(t.TempDir(), "m.log")
	w, err := NewWriter(eng, path, WithMaxSize(1), WithMaxBackups(-1))
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

// A line cut short by a crash is fine as the last line of a file; the
// writer, appending after a restart, starts on a new line, so the remnant
// is skipped and every line after it reads.
func TestAppendAfterACrashRemnantStartsANewLine(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock, 16)
	path := filepath.Join(t.TempDir(), "m.log")
	require.NoError(t, os.WriteFile(path, []byte("1764558000000|2026-12-01 03:00:00|api|1|0|1|0|0|0|0\n1764558001000|2026-12-01 03:0"), 0o644))
	w, err := NewWriter(eng, path)
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
// shutdown (eng.Feed().Close(), as promflow asks): each may close the
// engine's feed.
func TestTwoWritersMayCloseTheFeed(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng := engine(t, clock, 16)
	dir := t.TempDir()
	w1, err := NewWriter(eng, filepath.Join(dir, "a.log"))
	require.NoError(t, err)
	w2, err := NewWriter(eng, filepath.Join(dir, "b.log"))
	require.NoError(t, err)
	require.NoError(t, w1.Close())
	assert.NotPanics(t, func() { _ = w2.Close() })
}

// A bad option is an error naming it and its value, and starts nothing.
func TestNewWriterRejectsBadOptions(t *testing.T) {
	eng, err := flow.New(flow.WithClock(stattest.NewClock(0)))
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "m.log")
	for _, tc := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithMaxSize(0)}, "WithMaxSize must be >= 1 (megabytes), got 0"},
		{[]Option{WithMaxBackups(0)}, "WithMaxBackups must be >= 1, or -1 for all, got 0"},
		{[]Option{WithMaxBackups(-2)}, "got -2"},
	} {
		_, err := NewWriter(eng, path, tc.opts...)
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
	_, err = NewWriter(eng, "")
	assert.ErrorContains(t, err, "path is empty")
	_, err = os.Stat(path)
	assert.True(t, os.IsNotExist(err), "nothing written")
}

// TestEveryPassReachesTheLog: a writer made in the middle of a second, on
// a resource a rule made before it, writes every pass from the first
// request to Close: the lines' passes sum to the requests'.
func TestEveryPassReachesTheLog(t *testing.T) {
	clock := stattest.NewClock(5*time.Second + 300*time.Millisecond)
	eng := engine(t, clock, 16)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "api", Threshold: 1000}}))
	path := filepath.Join(t.TempDir(), "metrics.log")
	w, err := NewWriter(eng, path)
	require.NoError(t, err)
	want := int64(0)
	for i, at := range []time.Duration{300, 700, 1200, 2600, 3900} {
		clock.Set(5*time.Second + at*time.Millisecond)
		enter(t, eng, "api", i+1, nil)
		want += int64(i + 1)
		eng.Feed().Poll()
	}
	require.NoError(t, w.Close())
	var got int64
	for _, l := range readAll(t, path) {
		got += l.Pass
	}
	assert.Equal(t, want, got)
}
