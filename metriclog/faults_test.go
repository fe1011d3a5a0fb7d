package metriclog

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

// faultySink passes writes to the file but as it is told: failing them
// (after writing part: a full disk cuts a line), or holding them (a
// stalled disk) until released.
type faultySink struct {
	sink
	mu      sync.Mutex
	err     error // set: writes write half and fail with it
	hold    chan struct{}
	holding chan struct{} // closed once a write is held
}

func (f *faultySink) Write(b []byte) (int, error) {
	f.mu.Lock()
	err, hold := f.err, f.hold
	f.mu.Unlock()
	if hold != nil {
		select {
		case <-f.holding:
		default:
			close(f.holding)
		}
		<-hold
	}
	if err != nil {
		n, _ := f.sink.Write(b[:len(b)/2])
		return n, err
	}
	return f.sink.Write(b)
}

func (f *faultySink) fail(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

// second makes one second of traffic on api and delivers the one before.
func second(t *testing.T, clock *stattest.Clock, eng *flow.Engine, i int) {
	t.Helper()
	clock.Set(time.Duration(i)*time.Second + 100*time.Millisecond)
	enter(t, eng, "api", 1, nil)
	eng.Feed().Poll()
}

// TestFailedWritesAreCountedAndWritingResumes: while writes fail (a full
// disk: ENOSPC after half a line; a folder made read-only: EACCES), the
// seconds are counted as lost and each error reaches WithOnError; once the
// disk takes writes again the writer goes on by itself, and the file reads
// back whole: what a failure wrote of a line is taken back.
func TestFailedWritesAreCountedAndWritingResumes(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, 16)
	path := filepath.Join(t.TempDir(), "metrics.log")
	var mu sync.Mutex
	var seen []error
	w, err := NewWriter(eng, path, WithOnError(func(err error) { mu.Lock(); seen = append(seen, err); mu.Unlock() }))
	require.NoError(t, err)
	f := &faultySink{sink: w.out}
	w.out = f
	wait := func(what string, ok func(Stats) bool) {
		t.Helper()
		require.Eventually(t, func() bool { return ok(w.Stats()) }, 5*time.Second, time.Millisecond, what)
	}
	for i := 1; i <= 3; i++ {
		second(t, clock, eng, i)
	}
	wait("written", func(s Stats) bool { return s.Lines == 1 })
	f.fail(&os.PathError{Op: "write", Path: path, Err: syscall.ENOSPC})
	for i := 4; i <= 6; i++ {
		second(t, clock, eng, i)
	}
	wait("a full disk loses seconds", func(s Stats) bool { return s.LostSeconds == 3 })
	f.fail(&os.PathError{Op: "open", Path: path, Err: syscall.EACCES})
	second(t, clock, eng, 7)
	wait("a read-only folder too", func(s Stats) bool { return s.LostSeconds == 4 })
	f.fail(nil)
	for i := 8; i <= 10; i++ {
		second(t, clock, eng, i)
	}
	wait("writing resumed", func(s Stats) bool { return s.Lines == 4 })
	require.Error(t, w.Close(), "Close reports the first error")
	st := w.Stats()
	assert.Equal(t, Stats{Lines: 6, LostLines: 4, LostSeconds: 4, Errors: 4}, st, "and the last two seconds at Close")
	mu.Lock()
	assert.Len(t, seen, 4)
	assert.True(t, errors.Is(seen[0], syscall.ENOSPC), "%v", seen[0])
	mu.Unlock()
	lines := readAll(t, path) // strict: a cut or joined line would not parse
	assert.Len(t, lines, 6)
}

// TestDeletedFolderIsMadeAgain: a folder deleted under an open file (its
// lines would go to a file no one can read) is noticed at the next write,
// made again with a new file, and nothing is lost.
func TestDeletedFolderIsMadeAgain(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, 16)
	dir := filepath.Join(t.TempDir(), "logs")
	path := filepath.Join(dir, "metrics.log")
	w, err := NewWriter(eng, path)
	require.NoError(t, err)
	for i := 1; i <= 3; i++ {
		second(t, clock, eng, i)
	}
	require.Eventually(t, func() bool { return w.Stats().Lines == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, os.RemoveAll(dir))
	second(t, clock, eng, 4)
	second(t, clock, eng, 5)
	require.Eventually(t, func() bool { return w.Stats().Lines == 3 }, 5*time.Second, time.Millisecond)
	require.NoError(t, w.Close())
	assert.Len(t, readAll(t, path), 4, "the seconds after the deletion, in a new file, and the last two at Close")
	assert.Zero(t, w.Stats().LostSeconds)
}

// TestStalledDiskNeverHoldsTheEngineOrTheFeed: while a write hangs (a
// stalled disk), requests go on and the feed goes on delivering to its
// other subscribers; the writer drops what it cannot queue, counting it,
// and writes again once the disk answers.
func TestStalledDiskNeverHoldsTheEngineOrTheFeed(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, 16)
	path := filepath.Join(t.TempDir(), "metrics.log")
	w, err := NewWriter(eng, path)
	require.NoError(t, err)
	release := make(chan struct{})
	f := &faultySink{sink: w.out, hold: release, holding: make(chan struct{})}
	w.out = f
	var others int
	cancel := eng.Feed().Subscribe(func(b []stat.Second) { others += len(b) })
	defer cancel()
	second(t, clock, eng, 1)
	second(t, clock, eng, 2)
	second(t, clock, eng, 3) // second 1 is delivered, and its write held
	select {
	case <-f.holding:
	case <-time.After(5 * time.Second):
		t.Fatal("the first write was not held")
	}
	const n = 100
	for i := 4; i < 4+n; i++ {
		second(t, clock, eng, i) // each Entry and each Poll returns
	}
	assert.Equal(t, n+1, others, "the other subscriber had every second")
	st := w.Stats()
	assert.Equal(t, int64(n+1-1-64), st.LostSeconds, "one held, 64 wait; the rest are dropped, and counted")
	f.mu.Lock()
	f.hold = nil
	f.mu.Unlock()
	close(release)
	require.NoError(t, w.Close())
	st = w.Stats()
	assert.Equal(t, int64(1+64+2), st.Lines, "the held one, the 64 queued and the two at Close")
	assert.Len(t, readAll(t, path), int(st.Lines))
}
