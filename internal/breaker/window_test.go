package breaker

import (
	"testing"
	"time"
)

// A stripe's bucket that reached MaxCount completions halves its counts
// and goes on counting: failures after it are seen.
func TestAFullBucketKeepsCounting(t *testing.T) {
	b := New(Config{Strategy: ErrorRatio, Threshold: 0.5, MinRequests: 1, Interval: int64(time.Hour), Buckets: 1,
		RetryTimeout: int64(time.Second), ProbeTimeout: int64(time.Second)}, nil)
	now := int64(time.Second)
	b.Reset(now)
	for range MaxCount {
		b.Exit(0, now, now, false, false)
	}
	for range 3 * MaxCount {
		b.Exit(0, now, now, true, false)
	}
	all, bad := b.Sum(now)
	s, _ := b.State()
	t.Logf("all %d bad %d state %v", all, bad, s)
	if s != Open {
		t.Errorf("75%% failures in the window: still %v", s)
	}
}

// An Exit whose now is a bucket behind (a clock step back the engine
// passes through, or a goroutine descheduled between its clock read and
// its count) counts in the newer bucket rather than wipe it, with one
// bucket too.
func TestALateCompletionCountsInTheNewerBucket(t *testing.T) {
	b := New(Config{Strategy: ErrorCount, Threshold: 3, MinRequests: 1, Interval: int64(100 * time.Millisecond), Buckets: 1,
		RetryTimeout: int64(time.Second), ProbeTimeout: int64(time.Second)}, nil)
	b.Reset(0)
	t1 := int64(1250 * time.Millisecond)
	b.Exit(0, t1, t1, true, false)
	b.Exit(0, t1, t1, true, false)
	b.Exit(0, t1-60e6, t1-60e6, true, false)
	all, bad := b.Sum(t1)
	t.Logf("all %d bad %d", all, bad)
	if bad < 2 {
		t.Errorf("the two failures at t1 were lost: %d", bad)
	}
}
