package hotkeys

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const sec = int64(time.Second)

// The heavy keys of a skewed stream come first with their counts, within
// the space-saving bound (the smallest count a summary held) even when
// far more keys than Capacity pass through it.
func TestTopKeysOfASkewedStream(t *testing.T) {
	s := New()
	truth := map[string]int64{}
	for i := range 20_000 {
		key := fmt.Sprint("light-", i%500) // 500 keys of 40 samples
		switch {
		case i%4 == 0:
			key = "heavy"
		case i%10 == 1:
			key = "second"
		}
		truth[key]++
		s.Add(key, false, int64(i)*sec/1000) // 20 s
	}
	passed, refused := s.Top(20*sec, 3)
	require.Len(t, passed, 3)
	assert.Empty(t, refused)
	assert.Equal(t, "heavy", passed[0].Key)
	assert.Equal(t, "second", passed[1].Key)
	// Each slot's summary overestimates by at most its smallest count,
	// which the light keys keep near their own share.
	for _, c := range passed[:2] {
		est, real := c.Count/Every, truth[c.Key]
		assert.GreaterOrEqual(t, est, real, c.Key)
		assert.LessOrEqual(t, est, real+int64(2*(20_000/10)/Capacity)*2, c.Key)
	}
}

// Outcomes are kept apart, and a sample older than a minute is gone.
func TestRefusalsApartAndAMinuteKept(t *testing.T) {
	s := New()
	for range 5 {
		s.Add("attacker", true, 3*sec)
	}
	s.Add("user", false, 3*sec)
	passed, refused := s.Top(3*sec, 10)
	assert.Equal(t, []Count{{"user", Every}}, passed)
	assert.Equal(t, []Count{{"attacker", 5 * Every}}, refused)
	passed, refused = s.Top(59*sec, 10)
	assert.Len(t, passed, 1, "still in the minute")
	assert.Len(t, refused, 1)
	passed, refused = s.Top(61*sec, 10)
	assert.Empty(t, passed, "a minute later")
	assert.Empty(t, refused)
	s.Add("later", false, 75*sec) // reuses the slot of 15 s
	passed, _ = s.Top(75*sec, 10)
	assert.Equal(t, []Count{{"later", Every}}, passed)
}

// Samples added from many goroutines while Top reads: race-free, and no
// sample counted twice (a busy sketch drops samples instead).
func TestSamplesFromManyGoroutines(t *testing.T) {
	s := New()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				s.Add(fmt.Sprint("k", (g+i)%7), i%3 == 0, sec)
				if i%100 == 0 {
					s.Top(sec, 5)
				}
			}
		}()
	}
	wg.Wait()
	passed, refused := s.Top(sec, 100)
	var n int64
	for _, c := range append(passed, refused...) {
		n += c.Count / Every
	}
	assert.LessOrEqual(t, n, int64(4*2000))
	assert.Positive(t, n)
}

// Adding a sample allocates nothing, new keys through a full summary
// included (it runs on the request path of one request in Every).
func TestAddingAllocatesNothing(t *testing.T) {
	s := New()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	i := 0
	allocs := testing.AllocsPerRun(10_000, func() {
		s.Add(keys[i%len(keys)], i%3 == 0, int64(i)*sec/100)
		i++
	})
	assert.Zero(t, allocs)
}

// A summary keeps no byte of the caller's string: a key in a buffer the
// caller then overwrites is reported as it was. A key longer than keyLen
// shows its start, and two such keys alike there stay apart.
func TestKeysAreCopied(t *testing.T) {
	s := New()
	buf := []byte("user-001")
	s.Add(unsafe.String(&buf[0], len(buf)), false, sec)
	copy(buf, "XXXXXXXX")
	long1, long2 := strings.Repeat("a", 60)+"1", strings.Repeat("a", 60)+"2"
	for range 3 {
		s.Add(long1, true, sec)
	}
	s.Add(long2, true, sec)
	passed, refused := s.Top(sec, 10)
	assert.Equal(t, []Count{{"user-001", Every}}, passed)
	require.Len(t, refused, 2)
	assert.Equal(t, Count{strings.Repeat("a", keyLen-8) + "…", 3 * Every}, refused[0])
	assert.Equal(t, int64(Every), refused[1].Count)
}
