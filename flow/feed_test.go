package flow

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

// TestFeedStepByStep: on a fake clock, the engine's feed delivers each
// resource's completed seconds once, with wall-clock times one second
// apart, the most in flight under a Concurrency rule, and on Close the
// current second marked partial.
func TestFeedStepByStep(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	e, _ := newEngine(t, clock)
	load(t, e, Rule{Resource: "api", Threshold: 100}, Rule{Resource: "conc", Metric: Concurrency, Threshold: 5})
	f := e.Feed()
	require.Same(t, f, e.Feed(), "one feed per engine")
	var got []stat.Second
	cancel := f.Subscribe(func(b []stat.Second) { got = append(got, b...) })
	f.Poll() // starts the feed: seconds from 11 s on are whole
	clock.Set(11*time.Second + 100*time.Millisecond)
	for range 3 {
		require.True(t, try(e, "api"))
	}
	held := make([]Entry, 3)
	for i := range held {
		en, err := e.Entry("conc")
		require.NoError(t, err)
		held[i] = en
	}
	clock.Set(12*time.Second + 500*time.Millisecond)
	for _, en := range held {
		en.Exit(nil)
	}
	require.True(t, try(e, "api"))
	clock.Set(13 * time.Second)
	f.Poll()
	byRes := map[string][]stat.Second{}
	for _, s := range got {
		byRes[s.Resource] = append(byRes[s.Resource], s)
	}
	require.Len(t, byRes["api"], 1)
	require.Len(t, byRes["conc"], 1)
	assert.Equal(t, int64(3), byRes["api"][0].Pass)
	assert.Equal(t, int64(3), byRes["api"][0].Success)
	assert.Equal(t, int64(3), byRes["conc"][0].MaxConcurrency)
	assert.Equal(t, int64(11*time.Second), byRes["api"][0].Start)
	first := byRes["api"][0].Time
	assert.Equal(t, first, first.Truncate(time.Second), "whole wall seconds")

	got = nil
	clock.Set(13*time.Second + 200*time.Millisecond)
	require.True(t, try(e, "api"))
	f.Close()
	require.Len(t, got, 3, "the exits of conc at 12.5 s, api's second 12, and the partial 13")
	var partial, twelve stat.Second
	for _, s := range got {
		switch {
		case s.Partial:
			partial = s
		case s.Resource == "api":
			twelve = s
		}
	}
	assert.Equal(t, int64(1), twelve.Pass)
	assert.Equal(t, first.Add(time.Second), twelve.Time, "the next engine second is the next wall second")
	assert.Equal(t, int64(13*time.Second), partial.Start)
	assert.Equal(t, int64(1), partial.Pass)
	got = nil
	f.Poll()
	f.Close()
	assert.Empty(t, got, "nothing after Close")
	cancel()
}

// TestFeedStartAndClose: Start polls every second on its own goroutine;
// Close stops it (goleak checks the package) and delivers what is left.
func TestFeedStartAndClose(t *testing.T) {
	e, err := New()
	require.NoError(t, err)
	load(t, e, Rule{Resource: "api", Threshold: 1000})
	f := e.Feed()
	var mu sync.Mutex
	var pass int64
	f.Subscribe(func(b []stat.Second) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range b {
			pass += s.Pass
		}
	})
	f.Start()
	f.Start()
	time.Sleep(1100 * time.Millisecond) // the first poll starts the feed
	for range 50 {
		require.True(t, try(e, "api"))
	}
	f.Close()
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, int64(50), pass)
}
