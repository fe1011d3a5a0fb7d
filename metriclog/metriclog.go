// Package metriclog writes an engine's completed seconds to a file, one
// line per resource per second, in Sentinel's metric-log field set, and
// reads such files back:
//
//	1764558000000|2026-12-01 03:00:00|GET /items/{id}|120|7|119|2|14|0|3
//
// The fields, separated by '|': the second's wall-clock start in Unix
// milliseconds and as "2006-01-02 15:04:05" in UTC; the resource; pass,
// block, success and exception counts; the mean response time of the
// completed requests in whole milliseconds (0 when none completed);
// occupied passes (priority borrowing); the most requests in flight a
// Concurrency rule counted. On a resource with circuit breakers
// (flow.Rule.Breaker) a field "breaker:STATE:N" follows: the state of its
// breakers when the line was written (Closed, Open or HalfOpen; of
// several, the one that refuses most) and N, how many times they opened
// since the resource's previous line. A last field, "partial", marks
// the second still running when the writer closed. In resource names '%',
// '|', CR and LF are written as %25, %7C, %0D and %0A, so every line
// splits into its fields; Read undoes it.
//
// Lines are written by one goroutine, fed by the engine's feed (flow.Feed,
// seconds a window after they end), and rotated by size with
// gopkg.in/natefinch/lumberjack.v2: the file is renamed with a timestamp
// (name-2006-01-02T15-04-05.000.ext) when the next write would pass
// WithMaxSize, and the oldest backups beyond WithMaxBackups are removed.
//
// The disk never holds up the engine or the feed's other subscribers (the
// dashboard, Prometheus): Entry never touches it, and a delivery that
// finds 64 still waiting for a stalled disk is dropped, counted in
// Stats.LostSeconds and Stats.LostLines. A write that fails (a full disk,
// a folder made read-only or deleted) is counted the same way and
// reported to WithOnError; the next delivery opens the file again (the
// folder made again if it went), after taking back what a failed write
// wrote of its lines, so writing resumes on its own once the disk
// recovers. A file
// deleted while open is noticed at the next write and made again.
package metriclog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/atomic"
	"gopkg.in/natefinch/lumberjack.v2"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/internal/breakers"
	"github.com/leapflow/leapflow/stat"
)

// Option shapes a Writer (see NewWriter).
type Option func(*config)

// config is a Writer's options, defaults filled in.
type config struct {
	maxSize, maxBackups int
	onError             func(error)
}

// WithOnError calls fn with every error writing the file (from the
// writer's goroutine, never a request's; it must not block for long).
func WithOnError(fn func(error)) Option { return func(c *config) { c.onError = fn } }

// WithMaxSize sets the size in megabytes a file reaches before it is
// rotated (default 50; at least 1).
func WithMaxSize(mb int) Option { return func(c *config) { c.maxSize = mb } }

// WithMaxBackups sets how many rotated files are kept (default 6; at least
// 1, or -1 for all).
func WithMaxBackups(n int) Option { return func(c *config) { c.maxBackups = n } }

// newConfig applies opts over the defaults and validates the result.
func newConfig(opts []Option) (config, error) {
	c := config{maxSize: 50, maxBackups: 6}
	for _, o := range opts {
		o(&c)
	}
	switch {
	case c.maxSize < 1:
		return c, fmt.Errorf("metriclog: WithMaxSize must be >= 1 (megabytes), got %d", c.maxSize)
	case c.maxBackups < 1 && c.maxBackups != -1:
		return c, fmt.Errorf("metriclog: WithMaxBackups must be >= 1, or -1 for all, got %d", c.maxBackups)
	}
	return c, nil
}

// Writer appends an engine's completed seconds to a file.
type Writer struct {
	eng    *flow.Engine
	feed   *flow.Feed
	cancel func()
	lines  chan batch
	// opened is, by resource, how many times its breakers had opened when
	// its last line was queued (read on the feed's goroutine only).
	opened  map[string]int64
	done    chan struct{}
	path    string
	out     sink // the file, through lumberjack (tests fail it on purpose)
	onError func(error)
	err     error // the first write error, read after done
	once    sync.Once
	// closing makes the feed's last deliveries wait for room instead of
	// being dropped: Close loses nothing a working disk can take.
	closing atomic.Bool
	// broken is set after a failed write: the next one opens the file
	// again, after ending a line the failure may have cut.
	broken bool
	// mark is the file's size before the last write, tried its length:
	// what a failed write wrote past mark is taken back.
	mark, tried                      int64
	written, lost, lostSecs, errored atomic.Int64
}

// batch is a delivery of the feed, with the breaker field of each
// resource that has breakers.
type batch struct {
	secs     []stat.Second
	breakers map[string]breakerField
}

// breakerField is a line's breaker field: the state of the resource's
// breakers, and how many times they opened since its previous line.
type breakerField struct {
	state  flow.BreakerState
	opened int64
}

// sink is where the lines go: a lumberjack.Logger.
type sink interface {
	Write(p []byte) (int, error)
	Close() error
}

// Stats counts what a Writer wrote and lost.
type Stats struct {
	Lines int64 // lines written
	// LostLines and LostSeconds count the lines, and the deliveries (a
	// second of every resource that counted in it), that a failed write
	// or a stalled disk lost.
	LostLines, LostSeconds int64
	Errors                 int64 // failed writes
}

// Stats returns the counts so far.
func (w *Writer) Stats() Stats {
	return Stats{Lines: w.written.Load(), LostLines: w.lost.Load(), LostSeconds: w.lostSecs.Load(), Errors: w.errored.Load()}
}

// loggers keeps one lumberjack.Logger per file path and options for the
// process: lumberjack v2.2.1 starts a goroutine for each Logger on its
// first write and never stops it, so writers opened again on one path
// reuse it (at most one such goroutine per path and options).
// A Logger's options are read by its goroutine without a lock, so they are
// never changed: other options on one path get a Logger of their own.
var (
	loggersMu sync.Mutex
	loggers   = map[loggerKey]*lumberjack.Logger{}
)

type loggerKey struct {
	path                string
	maxSize, maxBackups int
}

func loggerFor(path string, o config) (*lumberjack.Logger, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("metriclog: path %q: %w", path, err)
	}
	k := loggerKey{abs, o.maxSize, max(o.maxBackups, 0)} // lumberjack's 0 keeps all
	loggersMu.Lock()
	defer loggersMu.Unlock()
	l := loggers[k]
	if l == nil {
		l = &lumberjack.Logger{Filename: abs, MaxSize: k.maxSize, MaxBackups: k.maxBackups}
		loggers[k] = l
	}
	return l, nil
}

// NewWriter starts writing eng's completed seconds to path (its folder is
// made if needed), appending to what is there. It subscribes to the
// engine's feed and starts it. It returns an error naming the option and
// value when one is bad.
func NewWriter(eng *flow.Engine, path string, opts ...Option) (*Writer, error) {
	if path == "" {
		return nil, errors.New("metriclog: path is empty")
	}
	o, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	l, err := loggerFor(path, o)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(l.Filename), 0o755); err != nil {
		return nil, fmt.Errorf("metriclog: %w", err)
	}
	if err := endLine(l.Filename); err != nil {
		return nil, fmt.Errorf("metriclog: %w", err)
	}
	w := &Writer{eng: eng, feed: eng.Feed(), lines: make(chan batch, 64), done: make(chan struct{}), path: l.Filename, out: l,
		onError: o.onError, opened: map[string]int64{}}
	go w.run()
	w.cancel = w.feed.Subscribe(w.take)
	w.feed.Start()
	return w, nil
}

// take queues a delivery of the feed for the writer, or drops and counts
// it when 64 wait for a stalled disk (but while closing).
func (w *Writer) take(b []stat.Second) {
	if len(b) == 0 {
		return
	}
	c := batch{secs: append([]stat.Second(nil), b...), breakers: w.breakers(b)} // the feed reuses b
	if w.closing.Load() {
		w.lines <- c
		return
	}
	select {
	case w.lines <- c:
	default:
		w.lost.Add(int64(len(c.secs)))
		w.lostSecs.Inc()
	}
}

// breakers returns the breaker fields of the resources of b that have
// breakers (nil: none has), read from the engine now.
func (w *Writer) breakers(b []stat.Second) map[string]breakerField {
	all := w.eng.Breakers()
	if len(all) == 0 {
		return nil
	}
	now := map[string]breakerField{}
	for _, br := range all {
		f, seen := now[br.Rule.Resource]
		if !seen || breakers.Worse(br.State, f.state) {
			f.state = br.State
		}
		f.opened += br.Transitions[flow.BreakerOpen]
		now[br.Rule.Resource] = f
	}
	out := map[string]breakerField{}
	for i := range b {
		res := b[i].Resource
		f, ok := now[res]
		if _, done := out[res]; done || !ok {
			continue
		}
		total := f.opened
		if was := w.opened[res]; total >= was {
			f.opened -= was
		} // else a reload replaced the breakers: they count afresh
		w.opened[res] = total
		out[res] = f
	}
	for res := range w.opened {
		if _, ok := now[res]; !ok {
			delete(w.opened, res) // its breakers went
		}
	}
	return out
}

// run writes each delivery. Writes to the file hold whole lines only (at
// most 64 KiB of them), so a rotation, which lumberjack makes before a
// write that would not fit, never splits a line.
func (w *Writer) run() {
	defer close(w.done)
	const chunk = 64 << 10
	var buf, line []byte
	var lines int64
	ok := true
	write := func() {
		if len(buf) == 0 {
			return
		}
		if err := w.write(buf); err != nil {
			ok = false
			w.errored.Inc()
			if w.err == nil {
				w.err = err
			}
			if w.onError != nil {
				w.onError(err)
			}
			w.lost.Add(lines)
		} else {
			w.written.Add(lines)
		}
		buf, lines = buf[:0], 0
	}
	last := map[string]int{}
	for b := range w.lines {
		ok = true
		clear(last)
		for i := range b.secs {
			if _, has := b.breakers[b.secs[i].Resource]; has {
				last[b.secs[i].Resource] = i
			}
		}
		for i := range b.secs {
			s := &b.secs[i]
			f, hasBreakers := b.breakers[s.Resource]
			if hasBreakers && last[s.Resource] != i {
				f.opened = 0 // the resource's last line of the batch says them
			}
			line = appendLine(line[:0], s, f, hasBreakers)
			if len(buf)+len(line) > chunk {
				write()
			}
			buf = append(buf, line...)
			lines++
		}
		write()
		if !ok {
			w.lostSecs.Inc()
		}
	}
}

// write writes whole lines to the file: after a failed write it opens the
// file again first, taking back what the failure wrote (or, if it cannot,
// ending the line it cut); a file deleted underneath (its folder too) is
// made again.
func (w *Writer) write(b []byte) error {
	st, err := os.Stat(w.path)
	if errors.Is(err, os.ErrNotExist) || w.broken {
		_ = w.out.Close() // the next write opens the file (lumberjack makes its folder)
		if w.broken && err == nil && st.Size() > w.mark && st.Size() <= w.mark+w.tried {
			// Take back what the failed write wrote of its lines.
			_ = os.Truncate(w.path, w.mark)
		}
		if err := endLine(w.path); err != nil {
			return fmt.Errorf("metriclog: %w", err)
		}
		st, err = os.Stat(w.path)
	}
	w.mark, w.tried = 0, int64(len(b))
	if err == nil {
		w.mark = st.Size()
	}
	n, err := w.out.Write(b)
	w.broken = err != nil
	if err == nil && n < len(b) {
		w.broken = true
		err = io.ErrShortWrite
	}
	if err != nil {
		return fmt.Errorf("metriclog: %w", err)
	}
	return nil
}

// Close closes the engine's feed, which delivers every second not
// delivered yet (the current one partial), writes them, and closes the
// file: nothing counted before Close is lost. It returns the first write
// error, if any.
func (w *Writer) Close() error {
	w.once.Do(func() {
		w.closing.Store(true)
		w.feed.Close()
		w.cancel()
		close(w.lines)
		<-w.done
		if err := w.out.Close(); err != nil && w.err == nil {
			w.err = err
		}
	})
	return w.err
}

// endLine ends a file a crash left in the middle of a line, so the lines
// appended after it read.
func endLine(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return err
	}
	last := make([]byte, 1)
	if _, err := f.ReadAt(last, st.Size()-1); err != nil {
		return err
	}
	if last[0] != '\n' {
		_, err = f.WriteAt([]byte("\n"), st.Size())
	}
	return err
}

// AppendLine appends s's line (with its newline) to dst.
func AppendLine(dst []byte, s *stat.Second) []byte { return appendLine(dst, s, breakerField{}, false) }

// appendLine is AppendLine with the breaker field f, when hasBreakers.
func appendLine(dst []byte, s *stat.Second, f breakerField, hasBreakers bool) []byte {
	t := s.Time.UTC()
	dst = strconv.AppendInt(dst, t.UnixMilli(), 10)
	dst = append(dst, '|')
	dst = t.AppendFormat(dst, time.DateTime)
	dst = append(dst, '|')
	dst = appendEscaped(dst, s.Resource)
	var rt int64
	if s.Success > 0 {
		rt = int64(s.RT/time.Millisecond) / s.Success
	}
	for _, v := range [...]int64{s.Pass, s.Block, s.Success, s.Exception, rt, s.Occupied, s.MaxConcurrency} {
		dst = append(dst, '|')
		dst = strconv.AppendInt(dst, v, 10)
	}
	if hasBreakers {
		dst = append(dst, "|breaker:"...)
		dst = append(dst, f.state.String()...)
		dst = append(dst, ':')
		dst = strconv.AppendInt(dst, f.opened, 10)
	}
	if s.Partial {
		dst = append(dst, "|partial"...)
	}
	return append(dst, '\n')
}

func appendEscaped(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '|', '\r', '\n':
			dst = append(dst, '%', "0123456789ABCDEF"[c>>4], "0123456789ABCDEF"[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// Line is one line of a metric log.
type Line struct {
	Time                                      time.Time // the second's start, UTC
	Resource                                  string
	Pass, Block, Success, Exception, Occupied int64
	// AvgRT is the mean response time, in whole milliseconds.
	AvgRT          time.Duration
	MaxConcurrency int64
	// Breaker is the state of the resource's circuit breakers when the
	// line was written ("Closed", "Open" or "HalfOpen"; "" for a resource
	// without breakers), and BreakerOpened how many times they opened
	// since its previous line.
	Breaker       string
	BreakerOpened int64
	Partial       bool
}

// ParseLine parses one line (without its newline). Its error names the
// field and value.
func ParseLine(s string) (Line, error) {
	f := strings.Split(s, "|")
	partial := len(f) > 10 && f[len(f)-1] == "partial"
	if partial {
		f = f[:len(f)-1]
	}
	var brk string
	var opened int64
	if len(f) == 11 {
		var err error
		if brk, opened, err = parseBreaker(f[10]); err != nil {
			return Line{}, err
		}
		f = f[:10]
	}
	if len(f) != 10 {
		return Line{}, fmt.Errorf("metriclog: %d fields, want 10 (then a breaker field, then partial, each if any): %q", len(f), s)
	}
	var v [8]int64
	for i, name := range [...]string{"timestamp", "pass", "block", "success", "exception", "rt", "occupied", "concurrency"} {
		field := f[0]
		if i > 0 {
			field = f[i+2]
		}
		n, err := strconv.ParseInt(field, 10, 64)
		if err != nil {
			return Line{}, fmt.Errorf("metriclog: field %s: %q is not an integer", name, field)
		}
		v[i] = n
	}
	res, err := unescape(f[2])
	if err != nil {
		return Line{}, err
	}
	return Line{
		Time: time.UnixMilli(v[0]).UTC(), Resource: res,
		Pass: v[1], Block: v[2], Success: v[3], Exception: v[4], AvgRT: time.Duration(v[5]) * time.Millisecond,
		Occupied: v[6], MaxConcurrency: v[7], Breaker: brk, BreakerOpened: opened, Partial: partial,
	}, nil
}

// parseBreaker parses a line's breaker field, "breaker:STATE:N".
func parseBreaker(field string) (state string, opened int64, err error) {
	parts := strings.Split(field, ":")
	if len(parts) != 3 || parts[0] != "breaker" {
		return "", 0, fmt.Errorf("metriclog: field breaker: %q is not breaker:STATE:N", field)
	}
	switch parts[1] {
	case "Closed", "Open", "HalfOpen":
	default:
		return "", 0, fmt.Errorf("metriclog: field breaker: state %q is not Closed, Open or HalfOpen", parts[1])
	}
	n, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || n < 0 {
		return "", 0, fmt.Errorf("metriclog: field breaker: %q is not a count", parts[2])
	}
	return parts[1], n, nil
}

func unescape(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b.WriteByte(s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", fmt.Errorf("metriclog: field resource: bad escape in %q", s)
		}
		c, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("metriclog: field resource: bad escape in %q", s)
		}
		b.WriteByte(byte(c))
		i += 2
	}
	return b.String(), nil
}

// Read calls fn with each line of r, in order, stopping at fn's error. A
// line that does not parse is an error naming its number (a last line
// without its newline, cut short by a crash, is skipped); SkipBad skips
// them all instead.
func Read(r io.Reader, fn func(Line) error) error { return read(r, false, fn) }

// SkipBad is Read that skips the lines that do not parse (the remnant of a
// line a crash cut short), for readers that want what can be read.
func SkipBad(r io.Reader, fn func(Line) error) error { return read(r, true, fn) }

func read(r io.Reader, skip bool, fn func(Line) error) error {
	br := bufio.NewReader(r)
	for n := 1; ; n++ {
		s, err := br.ReadString('\n')
		if err == io.EOF {
			return nil // a last line without newline was being written: skip it
		}
		if err != nil {
			return err
		}
		l, perr := ParseLine(strings.TrimSuffix(s, "\n"))
		if perr != nil {
			if skip {
				continue
			}
			return fmt.Errorf("line %d: %w", n, perr)
		}
		if err := fn(l); err != nil {
			return err
		}
	}
}

// ReadFiles reads the log at path with its rotated backups, oldest first:
// every line the writer kept, in the order written.
func ReadFiles(path string, fn func(Line) error) error { return readFiles(path, Read, fn) }

// ReadFilesSkipBad is ReadFiles that skips lines that do not parse.
func ReadFilesSkipBad(path string, fn func(Line) error) error { return readFiles(path, SkipBad, fn) }

func readFiles(path string, read func(io.Reader, func(Line) error) error, fn func(Line) error) error {
	ext := filepath.Ext(path)
	prefix := strings.TrimSuffix(filepath.Base(path), ext) + "-"
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("metriclog: %w", err)
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if !e.IsDir() && strings.HasPrefix(name, prefix) && strings.HasSuffix(name, ext) {
			// name-2006-01-02T15-04-05.000.ext: the timestamp sorts as text.
			if _, err := time.Parse("2006-01-02T15-04-05.000", strings.TrimSuffix(strings.TrimPrefix(name, prefix), ext)); err == nil {
				files = append(files, filepath.Join(filepath.Dir(path), name))
			}
		}
	}
	sort.Strings(files)
	files = append(files, path)
	for _, name := range files {
		f, err := os.Open(name)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("metriclog: %w", err)
		}
		err = read(f, fn)
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("metriclog: %s: %w", name, err)
		}
	}
	return nil
}
