package rulefile

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
)

// Source is where an engine's rules come from: a file or a Kubernetes
// ConfigMap's mounted file here, etcd in module etcdflow; docs/sources.md
// shows how to write others (Consul, Nacos, Apollo). Run calls update with the rules
// the source holds, at once and then each time they change (or with the
// error that kept it from reading them), until ctx ends. One source owns
// an engine's rule set: each update replaces every rule, so two sources on
// one engine would undo each other.
type Source interface {
	Run(ctx context.Context, update func(rules []flow.Rule, err error))
}

// Option shapes a Sync (see Start).
type Option func(*config)

// config is a Sync's options, defaults filled in.
type config struct {
	onError func(error)
	logger  *slog.Logger
}

// WithOnError tells fn each update that failed (a bad file, rules the
// engine refused); the rules in force stay. Errors are also logged (see
// WithLogger). fn runs on the source's goroutine: it must return (Stop
// waits for it); a panic in it is logged.
func WithOnError(fn func(error)) Option { return func(c *config) { c.onError = fn } }

// WithLogger sets the logger of failed updates, at warn (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.logger = l } }

// Sync keeps an engine's rules those of a source.
type Sync struct {
	reloads atomic.Int64
	mu      sync.Mutex
	lastErr error
	cancel  context.CancelFunc
	done    chan struct{}
}

// Start applies src's rules to eng, now and on every change, until Stop.
// A change is applied whole (flow.Engine.LoadRules) or not at all.
func Start(eng *flow.Engine, src Source, options ...Option) *Sync {
	opts := config{logger: slog.Default()}
	for _, o := range options {
		o(&opts)
	}
	if opts.logger == nil {
		opts.logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sync{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		src.Run(ctx, func(rules []flow.Rule, err error) {
			if err == nil {
				err = eng.LoadRules(rules)
			}
			defer func() {
				if v := recover(); v != nil {
					opts.logger.Error("leapflow: the rule source's WithOnError function panicked", "panic", v)
				}
			}()
			s.mu.Lock()
			s.lastErr = err
			s.mu.Unlock()
			if err != nil {
				opts.logger.Warn("leapflow: rules not reloaded; the rules in force stay", "err", err)
				if opts.onError != nil {
					opts.onError(err)
				}
				return
			}
			s.reloads.Inc()
		})
	}()
	return s
}

// Reloads returns how many rule sets were applied.
func (s *Sync) Reloads() int64 { return s.reloads.Load() }

// LastError returns the error of the latest update, nil if it was applied.
func (s *Sync) LastError() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// Stop stops following the source and waits for it.
func (s *Sync) Stop() {
	s.cancel()
	<-s.done
}

// FileSource is a rule file (or a directory of them) followed with
// fsnotify. It watches the file's directory, not the file, and filters by
// name: a watch on the file itself dies when an editor replaces it by a
// rename, or when it is deleted and made again. Events are debounced: a
// burst (an editor's write, rename and chmod; a Kubernetes ConfigMap's
// ..data symlink swap) ends in one read, and a read whose content is what
// was applied last applies nothing. A file that is missing, empty, cut
// short or bad is an error: the rules in force stay (clearing every rule
// takes an explicit "rules: []").
type FileSource struct {
	path string
	// debounce is how long events must stop before the file is read.
	debounce time.Duration
	// after is time.AfterFunc, replaced in tests.
	after func(time.Duration, func()) interface{ Stop() bool }
}

// FileOption shapes a FileSource (see NewFileSource).
type FileOption func(*FileSource)

// WithDebounce sets how long file events must stop before the file is
// read (default 100 ms; at least 1 ms, shorter is taken as 1 ms).
func WithDebounce(d time.Duration) FileOption {
	return func(f *FileSource) { f.debounce = max(d, time.Millisecond) }
}

// NewFileSource returns the source of the rule file or directory at path.
func NewFileSource(path string, opts ...FileOption) *FileSource {
	f := &FileSource{path: path, debounce: 100 * time.Millisecond}
	for _, o := range opts {
		o(f)
	}
	return f
}

// Run implements Source.
func (f *FileSource) Run(ctx context.Context, update func([]flow.Rule, error)) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		update(nil, fmt.Errorf("rulefile: watching %s: %w", f.path, err))
		return
	}
	defer w.Close()
	dir, name := f.watched()
	debounce := f.debounce
	after := f.after
	if after == nil {
		after = func(d time.Duration, fn func()) interface{ Stop() bool } { return time.AfterFunc(d, fn) }
	}
	fire := make(chan struct{}, 1)
	signal := func() {
		select {
		case fire <- struct{}{}:
		default:
		}
	}
	// The directory is watched while it exists; when it is missing (not
	// made yet, or removed), a retry (every 4 debounce periods, at most a
	// second) watches it again.
	retryEvery := min(max(4*debounce, 100*time.Millisecond), time.Second)
	watching := false
	var retry interface{ Stop() bool }
	watch := func() bool {
		if watching {
			return true
		}
		if err := w.Add(dir); err != nil {
			retry = after(retryEvery, signal)
			return false
		}
		watching = true
		return true
	}
	// A file that is a symlink to another directory (not a ConfigMap's
	// ..data) has its target's directory watched too.
	var target string
	follow := func() {
		if name == "" {
			return
		}
		t, err := filepath.EvalSymlinks(f.path)
		if err != nil || t == target {
			return
		}
		if target != "" && filepath.Dir(target) != dir {
			_ = w.Remove(filepath.Dir(target))
		}
		target = t
		if td := filepath.Dir(t); td != dir {
			_ = w.Add(td)
		}
	}
	var applied [32]byte
	missing := false // reported once while the directory stays missing
	read := func() {
		if !watch() {
			applied = [32]byte{}
			if !missing {
				missing = true
				update(nil, fmt.Errorf("rulefile: watching %s: the directory is missing: the rules in force stay", dir))
			}
			return
		}
		missing = false
		follow()
		rules, sum, err := f.read()
		if err == nil && sum == applied {
			return // what is in force already
		}
		if err == nil {
			applied = sum
		} else {
			applied = [32]byte{} // after an error, the same content is news again
		}
		update(rules, err)
	}
	read()
	var timer interface{ Stop() bool }
	var burst time.Time // when the events being debounced began
	stop := func(t interface{ Stop() bool }) {
		if t != nil {
			t.Stop()
		}
	}
	for {
		select {
		case <-ctx.Done():
			stop(timer)
			stop(retry)
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if filepath.Clean(ev.Name) == filepath.Clean(dir) && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				watching = false // the watch went with the directory
			}
			if !relevant(ev.Name, name) && (target == "" || ev.Name != target) && watching {
				continue
			}
			// Debounced, but a storm of events cannot put the read off
			// for more than ten debounce periods.
			stop(timer)
			if burst.IsZero() {
				burst = time.Now()
			}
			if time.Since(burst) > 10*debounce {
				burst = time.Time{}
				signal()
				continue
			}
			timer = after(debounce, signal)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			// Events may have been lost (a queue overflow): say so, then
			// read the file again.
			update(nil, fmt.Errorf("rulefile: watching %s: %w", dir, err))
			applied = [32]byte{}
			stop(timer)
			timer = after(debounce, signal)
		case <-fire:
			burst = time.Time{}
			read()
		}
	}
}

// watched returns the directory to watch and the name within it to follow
// ("" for every rule file of a directory source).
func (f *FileSource) watched() (dir, name string) {
	if st, err := os.Stat(f.path); err == nil && st.IsDir() {
		return f.path, ""
	}
	return filepath.Dir(f.path), filepath.Base(f.path)
}

// relevant reports whether an event on path concerns the source: its
// file (or, for a directory, a rule file), or a ConfigMap's ..data link.
func relevant(path, name string) bool {
	base := filepath.Base(path)
	switch {
	case strings.HasPrefix(base, ".."):
		return true // ..data, ..data_tmp, ..2026_...: a ConfigMap update
	case name == "":
		return hasExt(base) && !strings.HasPrefix(base, ".")
	}
	return base == name
}

// read reads the source's rules and a digest of what it read.
func (f *FileSource) read() ([]flow.Rule, [32]byte, error) {
	if st, err := os.Stat(f.path); err == nil && st.IsDir() {
		rules, err := ReadDir(f.path)
		if err != nil {
			return nil, [32]byte{}, err
		}
		// The merged normal form stands for the directory's content.
		out, err := Format(rules)
		return rules, sha256.Sum256(out), err
	}
	data, err := readRuleFile(f.path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("rulefile: %s is missing: the rules in force stay", f.path)
		}
		return nil, [32]byte{}, err
	}
	rules, err := Check(f.path, data)
	return rules, sha256.Sum256(data), err
}

// MemorySource is a Source held in memory: Set replaces its rules. It is
// the small form of the interface (and the tests' source).
type MemorySource struct {
	mu    sync.Mutex
	rules []flow.Rule
	set   chan struct{}
}

// NewMemorySource returns a source holding rules.
func NewMemorySource(rules []flow.Rule) *MemorySource {
	return &MemorySource{rules: rules, set: make(chan struct{}, 1)}
}

// Set replaces the source's rules.
func (m *MemorySource) Set(rules []flow.Rule) {
	m.mu.Lock()
	m.rules = rules
	m.mu.Unlock()
	select {
	case m.set <- struct{}{}:
	default:
	}
}

// Run implements Source.
func (m *MemorySource) Run(ctx context.Context, update func([]flow.Rule, error)) {
	for {
		m.mu.Lock()
		rules := m.rules
		m.mu.Unlock()
		update(rules, nil)
		select {
		case <-ctx.Done():
			return
		case <-m.set:
		}
	}
}
