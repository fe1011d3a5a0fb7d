package global

import (
	"sort"
	"sync"
	"time"
)

// Audit collects admissions per server bucket from WithOnAdmit, to
// check a limit after the fact: several Sources may share one. It is safe
// for simultaneous use.
type Audit struct {
	mu        sync.Mutex
	perBucket map[int64]int64 // bucket start (µs) -> admissions
}

// NewAudit returns an empty Audit.
func NewAudit() *Audit { return &Audit{perBucket: map[int64]int64{}} }

// Record is a function for WithOnAdmit.
func (a *Audit) Record(bucket time.Time, n int64) {
	a.mu.Lock()
	a.perBucket[bucket.UnixMicro()] += n
	a.mu.Unlock()
}

// Total returns every admission recorded.
func (a *Audit) Total() int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var t int64
	for _, n := range a.perBucket {
		t += n
	}
	return t
}

// Fullest returns the most admissions in any server window of length
// window (the buckets whose start lies within window of a bucket's start).
func (a *Audit) Fullest(window time.Duration) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	starts := make([]int64, 0, len(a.perBucket))
	for s := range a.perBucket {
		starts = append(starts, s)
	}
	sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
	var worst, sum int64
	lo := 0
	for _, end := range starts {
		sum += a.perBucket[end]
		for end-starts[lo] >= window.Microseconds() {
			sum -= a.perBucket[starts[lo]]
			lo++
		}
		worst = max(worst, sum)
	}
	return worst
}
