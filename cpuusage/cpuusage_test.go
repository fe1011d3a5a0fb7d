package cpuusage

import (
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture loads testdata/name into a file system a test may change.
func fixture(t *testing.T, name string) fstest.MapFS {
	t.Helper()
	m := fstest.MapFS{}
	root := os.DirFS("testdata/" + name)
	require.NoError(t, fs.WalkDir(root, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(root, p)
		m[p] = &fstest.MapFile{Data: b}
		return err
	}))
	return m
}

// replace rewrites the line of file name that starts with prefix.
func replace(m fstest.MapFS, name, prefix, line string) {
	var out []string
	for l := range strings.Lines(string(m[name].Data)) {
		if strings.HasPrefix(l, prefix) {
			l = line + "\n"
		}
		out = append(out, l)
	}
	m[name] = &fstest.MapFile{Data: []byte(strings.Join(out, ""))}
}

// Under cgroup v2 with a quota, the usage is the cgroup's CPU time over
// what the tightest quota of it and its ancestors allows (1.5 CPUs here,
// the parent's, where the cgroup's own is max).
func TestCgroupUsageIsOverItsQuota(t *testing.T) {
	m := fixture(t, "limited")
	r, err := newReader(m, 8)
	require.NoError(t, err)
	assert.Equal(t, "cgroup v2 /sys/fs/cgroup/kubepods/app", r.source())
	assert.Equal(t, 1.5, r.cpus)
	t0 := time.Unix(1000, 0)
	_, ok, err := r.sample(t0)
	require.NoError(t, err)
	assert.False(t, ok, "one sample is no span")
	// 100 ms later, 120 ms more CPU time: 120 of the 150 the quota allows.
	replace(m, "sys/fs/cgroup/kubepods/app/cpu.stat", "usage_usec", "usage_usec 5120000")
	u, ok, err := r.sample(t0.Add(100 * time.Millisecond))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.InDelta(t, 0.8, u, 1e-9)
	// Over the quota (a burst the period allowed): at most 1.
	replace(m, "sys/fs/cgroup/kubepods/app/cpu.stat", "usage_usec", "usage_usec 5400000")
	u, _, _ = r.sample(t0.Add(200 * time.Millisecond))
	assert.Equal(t, 1.0, u)
	// A counter that went back, or no time passed: no reading (the last
	// one stands), not a negative or a zero usage.
	replace(m, "sys/fs/cgroup/kubepods/app/cpu.stat", "usage_usec", "usage_usec 10")
	_, ok, _ = r.sample(t0.Add(300 * time.Millisecond))
	assert.False(t, ok)
	_, ok, _ = r.sample(t0.Add(300 * time.Millisecond))
	assert.False(t, ok)
}

// Under cgroup v2 without a quota (the namespace's root, cpu.max "max"),
// the usage is over every CPU the process may run on.
func TestCgroupUsageWithoutQuotaIsOverItsCPUs(t *testing.T) {
	m := fixture(t, "unlimited")
	r, err := newReader(m, 4)
	require.NoError(t, err)
	assert.Equal(t, "cgroup v2 /sys/fs/cgroup", r.source())
	t0 := time.Unix(1000, 0)
	_, _, err = r.sample(t0)
	require.NoError(t, err)
	replace(m, "sys/fs/cgroup/cpu.stat", "usage_usec", "usage_usec 120100000") // 100 ms of CPU in 100 ms
	u, _, err := r.sample(t0.Add(100 * time.Millisecond))
	require.NoError(t, err)
	assert.InDelta(t, 0.25, u, 1e-9, "one CPU of four")
}

// Without cgroup v2 (v1 here, this machine's kind), the usage is the
// host's from /proc/stat: busy ticks over all, steal counted busy, iowait
// idle.
func TestProcStatUsageIsTheHosts(t *testing.T) {
	m := fixture(t, "procstat")
	r, err := newReader(m, 2)
	require.NoError(t, err)
	assert.Equal(t, "/proc/stat", r.source())
	t0 := time.Unix(1000, 0)
	_, _, err = r.sample(t0)
	require.NoError(t, err)
	_, ok, _ := r.sample(t0.Add(5 * time.Millisecond))
	assert.False(t, ok, "no tick in between: no reading")
	// +60 user, +10 system, +20 idle, +5 iowait, +5 steal: 75 busy of 100.
	replace(m, "proc/stat", "cpu ", "cpu  117480 65 22777 445158 655 0 877 5 0 0")
	u, ok, err := r.sample(t0.Add(time.Second))
	require.NoError(t, err)
	assert.True(t, ok)
	assert.InDelta(t, 0.75, u, 1e-9)
}

// Files that are not what they should be are errors, not readings: a
// /proc/stat without the cpu line, a field that is not a number, nothing
// to read at all.
func TestUnreadableSourcesAreErrors(t *testing.T) {
	m := fixture(t, "procstat")
	m["proc/stat"] = &fstest.MapFile{Data: []byte("intr 1 2 3\n")}
	_, err := newReader(m, 2)
	assert.ErrorContains(t, err, "not the cpu total")
	m["proc/stat"] = &fstest.MapFile{Data: []byte("cpu  1 2 x 4 5 6 7\n")}
	_, err = newReader(m, 2)
	assert.ErrorContains(t, err, "field 3")
	_, err = newReader(fstest.MapFS{}, 2)
	assert.ErrorContains(t, err, "neither cgroup v2 nor /proc/stat")
	// A file larger than the limit is read only up to it.
	m["proc/stat"] = &fstest.MapFile{Data: []byte("cpu  1 2 3 4 5 6 7 0 0 0\n" + strings.Repeat("x", 2*maxFile))}
	_, err = newReader(m, 2)
	assert.NoError(t, err)
	_, err = Start(WithFS(fstest.MapFS{}))
	assert.Error(t, err)
	_, err = Start(WithInterval(time.Millisecond))
	assert.ErrorContains(t, err, "WithInterval")
}

// lockedFS is a file system a test changes while a Meter reads it.
type lockedFS struct {
	mu     sync.Mutex
	m      fstest.MapFS
	broken bool // every open fails
}

func (l *lockedFS) Open(name string) (fs.File, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.broken {
		return nil, fs.ErrNotExist
	}
	b, err := fs.ReadFile(l.m, name)
	if err != nil {
		return nil, err
	}
	return fstest.MapFS{"f": &fstest.MapFile{Data: b}}.Open("f")
}

// A Meter samples in the background until Close, which stops its
// goroutine (goleak checks) and may be called twice.
func TestMeterSamplesUntilClosed(t *testing.T) {
	l := &lockedFS{m: fixture(t, "procstat")}
	meter, err := Start(WithFS(l), WithInterval(10*time.Millisecond))
	require.NoError(t, err)
	assert.Zero(t, meter.CPUUsage())
	// From here only busy ticks grow: a usage of 1.
	busy := int64(117420)
	for range 9 {
		time.Sleep(10 * time.Millisecond)
		busy += 1000
		l.mu.Lock()
		replace(l.m, "proc/stat", "cpu ", "cpu  "+strconv.FormatInt(busy, 10)+" 65 22767 445138 650 0 877 0 0 0")
		l.mu.Unlock()
		if meter.CPUUsage() > 0.99 {
			break
		}
	}
	assert.Greater(t, meter.CPUUsage(), 0.99)
	assert.Equal(t, "/proc/stat", meter.Source())
	meter.Close()
	meter.Close()
	assert.Zero(t, meter.CPUUsage(), "closed: no reading")
	var none *Meter
	none.Close()
	assert.Empty(t, none.Source())
}

// A Meter whose source can no longer be read reads 0, with the error,
// rather than its last reading forever; read again, it reads again.
func TestMeterWithoutItsSourceReadsZero(t *testing.T) {
	// The meter's steps, taken by hand on a clock of the test's (Start's
	// goroutine takes the same steps on a ticker).
	l := &lockedFS{m: fixture(t, "procstat")}
	r, err := newReader(l, 2)
	require.NoError(t, err)
	meter := &Meter{r: r}
	at := time.Unix(1000, 0)
	busy := int64(117420)
	step := func() {
		at = at.Add(10 * time.Millisecond)
		busy += 1000
		replace(l.m, "proc/stat", "cpu ", "cpu  "+strconv.FormatInt(busy, 10)+" 65 22767 445138 650 0 877 0 0 0")
		meter.take(at)
	}
	meter.take(at)
	step()
	require.Greater(t, meter.CPUUsage(), 0.99)
	l.broken = true
	meter.take(at.Add(10 * time.Millisecond))
	assert.ErrorIs(t, meter.Err(), fs.ErrNotExist)
	assert.Zero(t, meter.CPUUsage())
	l.broken = false
	step()
	assert.NoError(t, meter.Err())
	assert.Greater(t, meter.CPUUsage(), 0.99)
	var none *Meter
	assert.Zero(t, none.CPUUsage(), "a nil Meter (a failed Start handed on) reads 0")
}
