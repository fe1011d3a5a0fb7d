package breaker

import (
	"math/bits"
	"math/rand/v2"
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
	b.Exit(0, now, now, true, false)
	if all, bad := b.Sum(now); all < MaxCount/2 || bad != 1 {
		t.Fatalf("a full bucket, then a failure: %d completions, %d failed; want the good ones halved, not dropped", all, bad)
	}
	if s, _ := b.State(); s != Closed {
		t.Fatalf("1 failure in %d: %v", MaxCount/2, s)
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

// A time's bucket (its epoch, by a multiplication where it can) is the
// time over the bucket length, and its cell in the ring the epoch modulo
// the ring, for bucket lengths of whole and broken ms, at times from 0 to
// 2^62 ns.
func TestEpochIsTheTimeOverTheBucketLength(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	lens := []int64{1e6, 2e6, 3e6, 7e6, 100e6, 999e6, 1e9, 3600e9, 1e6 + 1, 1234567}
	for _, n := range []int{1, 3, 10, 64, 100} {
		for _, bl := range lens {
			b := New(Config{Strategy: ErrorCount, Threshold: 1, MinRequests: 1, Interval: bl * int64(n), Buckets: n,
				RetryTimeout: sec, ProbeTimeout: sec}, nil)
			ring := uint64(1)<<bits.Len(uint(n-1)) - 1
			for i := range 20000 {
				now := rng.Int64N(1 << (1 + i%62))
				if i%7 == 0 {
					now = (now/bl)*bl - int64(i%2) // a bucket's edge, and the ns before it
				}
				want := uint64(max(now, 0) / bl)
				e, idx := b.epoch(now)
				if e != want&(1<<epochBits-1) || uint64(idx) != want&ring {
					t.Fatalf("buckets %d of %d ns, now %d: epoch %d cell %d, want %d cell %d", n, bl, now, e, idx, want&(1<<epochBits-1), want&ring)
				}
			}
		}
	}
}

// A full bucket keeps an ErrorCount breaker's failures whole (it halves
// its completions only): the breaker trips at its Threshold, however many
// good completions filled the bucket.
func TestAFullBucketKeepsErrorCountsFailures(t *testing.T) {
	b := New(Config{Strategy: ErrorCount, Threshold: 1_000_000, MinRequests: 1,
		Interval: int64(time.Hour), Buckets: 1, RetryTimeout: sec, ProbeTimeout: sec}, nil)
	b.Reset(0)
	now := int64(time.Second)
	const fails = 999_999
	for i := 0; i < fails; i++ {
		b.Exit(0, now, now, true, false)
	}
	for i := 0; i < MaxCount-fails+1; i++ { // fill the bucket past MaxCount
		b.Exit(0, now, now, false, false)
	}
	all, bad := b.Sum(now)
	t.Logf("window after %d completions (%d failed): all=%d bad=%d", MaxCount+1, fails, all, bad)
	b.Exit(0, now, now, true, false) // the 1,000,000th failure
	if s, _ := b.State(); s != Open {
		all, bad := b.Sum(now)
		t.Fatalf("1,000,000 failures in the window did not trip a Threshold-1e6 ErrorCount breaker: state %v, window all=%d bad=%d", s, all, bad)
	}
}
