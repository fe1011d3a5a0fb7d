// Package cpuusage reads the CPU usage of a process's container, for the
// system rules of package flow (flow.WithCPU, Rule.System): a Meter
// samples it in the background, and flow reads the last sample.
//
// On Linux with cgroup v2 the usage is the cgroup's: its CPU time
// (cpu.stat's usage_usec) over the CPU time its limit allows in the same
// span (cpu.max, the tightest of the cgroup's and its ancestors'; without
// a limit, every CPU the process may run on). Elsewhere, with cgroup v1
// or none, it is the host's: the share of time /proc/stat counts not idle
// over every CPU. The files are read directly, not through a library
// such as gopsutil: its CPU percentages are the host's, which a container
// under a quota cannot use, and the two reads are a few lines. Load
// average is not read: it counts the host's runnable threads whatever
// the container's limit.
//
// A Meter starts one goroutine (Start) that Close stops; the flow engine
// starts none of its own.
package cpuusage

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/atomic"
)

// DefaultInterval is how often a Meter samples by default.
const DefaultInterval = 100 * time.Millisecond

// maxFile bounds what is read of any one file.
const maxFile = 64 << 10

// Meter is a CPU usage read in the background. Its methods are safe for
// concurrent use.
type Meter struct {
	usage  atomic.Uint64 // float64 bits
	err    atomic.Pointer[error]
	r      *reader
	done   chan struct{}
	closed sync.Once
	wg     sync.WaitGroup
}

// Option configures Start.
type Option func(*config)

type config struct {
	interval time.Duration
	fsys     fs.FS
	cpus     int
	now      func() time.Time
}

// WithInterval sets how often the Meter samples (default 100 ms, at least
// 10 ms).
func WithInterval(d time.Duration) Option { return func(c *config) { c.interval = d } }

// WithFS reads the files from fsys, a file system rooted where / would be
// (tests read fixtures; the default is the machine's).
func WithFS(fsys fs.FS) Option { return func(c *config) { c.fsys = fsys } }

// Start makes a Meter and starts its sampling; Close stops it. It returns
// an error when neither cgroup v2 nor /proc/stat can be read (not Linux).
func Start(opts ...Option) (*Meter, error) {
	c := config{interval: DefaultInterval, fsys: os.DirFS("/"), cpus: runtime.NumCPU(), now: time.Now}
	for _, o := range opts {
		o(&c)
	}
	if c.interval < 10*time.Millisecond {
		return nil, fmt.Errorf("cpuusage: WithInterval must be at least 10ms, got %v", c.interval)
	}
	r, err := newReader(c.fsys, c.cpus)
	if err != nil {
		return nil, err
	}
	m := &Meter{r: r, done: make(chan struct{})}
	if _, _, err := r.sample(c.now()); err != nil {
		return nil, err
	}
	m.wg.Add(1)
	go m.run(c.interval, c.now)
	return m, nil
}

func (m *Meter) run(interval time.Duration, now func() time.Time) {
	defer m.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.done:
			return
		case <-t.C:
			m.take(now())
		}
	}
}

// take samples at now and publishes the reading, or, when the source
// cannot be read (the cgroup was removed, the process moved), 0 and the
// error: no reading rather than the last one forever.
func (m *Meter) take(now time.Time) {
	switch u, ok, err := m.r.sample(now); {
	case err != nil:
		m.usage.Store(0)
		m.err.Store(&err)
	case ok:
		m.usage.Store(math.Float64bits(u))
		m.err.Store(nil)
	}
}

// CPUUsage returns the usage over the last interval, in [0, 1]: 0 before
// the first interval ends, while the source cannot be read (Err), and on
// a nil Meter. It implements flow.CPUMeter.
func (m *Meter) CPUUsage() float64 {
	if m == nil {
		return 0
	}
	return math.Float64frombits(m.usage.Load())
}

// Err returns why the last sample could not be read, nil when it was.
func (m *Meter) Err() error {
	if m == nil {
		return nil
	}
	if e := m.err.Load(); e != nil {
		return *e
	}
	return nil
}

// Source says what the Meter reads: "cgroup v2 <dir>" or "/proc/stat"
// ("" for a nil Meter).
func (m *Meter) Source() string {
	if m == nil {
		return ""
	}
	return m.r.source()
}

// Close stops the sampling; from then CPUUsage reads 0 (a reading no
// longer taken must not keep a rule hot). It may be called more than
// once, and on a nil Meter.
func (m *Meter) Close() {
	if m == nil {
		return
	}
	m.closed.Do(func() { close(m.done) })
	m.wg.Wait()
	m.usage.Store(0)
}

// reader takes samples of one source and turns two into a usage.
type reader struct {
	fsys fs.FS
	// dir is the cgroup's directory (relative to the root), "" when
	// reading /proc/stat; cpus the CPUs its limit allows.
	dir  string
	cpus float64
	// The previous sample: when (monotonic), and the busy and total
	// counts (cgroup: µs of CPU time used; /proc/stat: busy and all
	// ticks).
	at          time.Time
	busy, all   int64
	hasPrevious bool
}

// newReader finds the source: the process's cgroup v2 directory with a
// cpu.stat, else /proc/stat.
func newReader(fsys fs.FS, cpus int) (*reader, error) {
	r := &reader{fsys: fsys}
	if dir, ok := cgroupDir(fsys); ok {
		r.dir = dir
		r.cpus = float64(cpus)
		if lim, ok := cgroupLimit(fsys, dir); ok {
			r.cpus = min(r.cpus, lim)
		}
		return r, nil
	}
	if _, _, err := procStat(fsys); err != nil {
		return nil, fmt.Errorf("cpuusage: neither cgroup v2 nor /proc/stat can be read: %w", err)
	}
	return r, nil
}

func (r *reader) source() string {
	if r.dir != "" {
		return "cgroup v2 /" + r.dir
	}
	return "/proc/stat"
}

// sample reads the counts at now and returns the usage since the previous
// sample; ok is false when there is none: the first sample, or a span in
// which /proc/stat did not tick (it counts in 10 ms ticks) or a counter
// went back.
func (r *reader) sample(now time.Time) (usage float64, ok bool, err error) {
	var busy, all int64
	if r.dir != "" {
		if busy, err = usageUsec(r.fsys, r.dir); err != nil {
			return 0, false, err
		}
	} else if busy, all, err = procStat(r.fsys); err != nil {
		return 0, false, err
	}
	defer func() { r.at, r.busy, r.all, r.hasPrevious = now, busy, all, true }()
	if !r.hasPrevious {
		return 0, false, nil
	}
	dBusy, dAll := float64(busy-r.busy), float64(all-r.all)
	if r.dir != "" {
		dAll = float64(now.Sub(r.at).Microseconds()) * r.cpus // the CPU time the limit allowed
	}
	if dAll <= 0 || dBusy < 0 {
		return 0, false, nil
	}
	return min(dBusy/dAll, 1), true, nil
}

// readFile reads name from fsys through the size limit.
func readFile(fsys fs.FS, name string) (string, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFile))
	return string(b), err
}

// cgroupDir returns the directory of the process's cgroup v2 (its "0::"
// line in /proc/self/cgroup, under sys/fs/cgroup), if it has a cpu.stat;
// else the root's (a cgroup namespace shows the process at its root).
func cgroupDir(fsys fs.FS) (string, bool) {
	const root = "sys/fs/cgroup"
	self, err := readFile(fsys, "proc/self/cgroup")
	if err != nil {
		return "", false
	}
	for line := range strings.Lines(self) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "0::")
		if !ok {
			continue
		}
		for _, dir := range []string{path.Join(root, path.Clean("/" + rest)[1:]), root} {
			if _, err := usageUsec(fsys, dir); err == nil {
				return dir, true
			}
		}
	}
	return "", false
}

// cgroupLimit returns the tightest CPU limit (quota over period, in CPUs)
// of the cgroup at dir and its ancestors under sys/fs/cgroup; false when
// none has one.
func cgroupLimit(fsys fs.FS, dir string) (float64, bool) {
	best, found := math.Inf(1), false
	for d := dir; ; d = path.Dir(d) {
		if s, err := readFile(fsys, path.Join(d, "cpu.max")); err == nil {
			if f := strings.Fields(s); len(f) == 2 && f[0] != "max" {
				quota, err1 := strconv.ParseInt(f[0], 10, 64)
				period, err2 := strconv.ParseInt(f[1], 10, 64)
				if err1 == nil && err2 == nil && quota > 0 && period > 0 {
					best, found = min(best, float64(quota)/float64(period)), true
				}
			}
		}
		if d == "sys/fs/cgroup" || d == "." || d == "/" {
			return best, found
		}
	}
}

// usageUsec reads cpu.stat's usage_usec of the cgroup at dir.
func usageUsec(fsys fs.FS, dir string) (int64, error) {
	s, err := readFile(fsys, path.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(s) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "usage_usec "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, errors.New("cpuusage: cpu.stat has no usage_usec")
}

// procStat reads /proc/stat's first line: the ticks of every CPU busy
// (user, nice, system, irq, softirq, steal) and in all (those, idle and
// iowait; guest time is counted in user already).
func procStat(fsys fs.FS) (busy, all int64, err error) {
	f, err := fsys.Open("proc/stat")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, maxFile))
	if !sc.Scan() {
		return 0, 0, errors.New("cpuusage: /proc/stat is empty")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("cpuusage: /proc/stat's first line is not the cpu total: %.80q", sc.Text())
	}
	var v [7]int64
	for i := range v {
		if v[i], err = strconv.ParseInt(fields[1+i], 10, 64); err != nil || v[i] < 0 {
			return 0, 0, fmt.Errorf("cpuusage: /proc/stat: field %d: %.40q", i+1, fields[1+i])
		}
	}
	if len(fields) > 8 {
		steal, err := strconv.ParseInt(fields[8], 10, 64)
		if err == nil && steal > 0 {
			v[0] += steal // counted busy: the CPU was not the process's to use
		}
	}
	user, nice, system, idle, iowait, irq, softirq := v[0], v[1], v[2], v[3], v[4], v[5], v[6]
	busy = user + nice + system + irq + softirq
	return busy, busy + idle + iowait, nil
}
