package baseline

import (
	"container/list"
	"sync"
	"time"
)

// Clock returns nanoseconds from an origin.
type Clock func() int64

// RealClock counts from its creation on the monotonic clock.
func RealClock() Clock {
	origin := time.Now()
	return func() int64 { return int64(time.Since(origin)) }
}

// FixedWindow counts admissions in windows [kW, (k+1)W) and resets at each
// boundary: the simplest limiter, with a double burst at the boundary.
type FixedWindow struct {
	mu     sync.Mutex
	limit  int64
	window int64
	start  int64
	count  int64
	clock  Clock
}

// NewFixedWindow admits limit requests per window.
func NewFixedWindow(limit int64, window time.Duration, clock Clock) *FixedWindow {
	return &FixedWindow{limit: limit, window: int64(window), clock: clock}
}

// Allow reports whether a request may pass now, reading the clock under
// the lock as the seed does.
func (f *FixedWindow) Allow() bool {
	ok, _ := f.AllowTimed()
	return ok
}

// AllowTimed is Allow that also returns the clock reading it decided at.
func (f *FixedWindow) AllowTimed() (bool, int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock()
	return f.allow(now), now
}

// AllowAt reports whether a request may pass at now.
func (f *FixedWindow) AllowAt(now int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allow(now)
}

func (f *FixedWindow) allow(now int64) bool {
	if start := now - now%f.window; start > f.start {
		f.start, f.count = start, 0
	}
	if f.count < f.limit {
		f.count++
		return true
	}
	return false
}

// SlidingLog keeps the time of every admission in the last window in a
// linked list: exact, with memory and time per request growing with the
// limit.
type SlidingLog struct {
	mu     sync.Mutex
	limit  int
	window int64
	log    *list.List
	clock  Clock
}

// NewSlidingLog admits limit requests in any span of window.
func NewSlidingLog(limit int, window time.Duration, clock Clock) *SlidingLog {
	return &SlidingLog{limit: limit, window: int64(window), log: list.New(), clock: clock}
}

// Allow reports whether a request may pass now, reading the clock under
// the lock as the seed does.
func (s *SlidingLog) Allow() bool {
	ok, _ := s.AllowTimed()
	return ok
}

// AllowTimed is Allow that also returns the clock reading it decided at.
func (s *SlidingLog) AllowTimed() (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	return s.allow(now), now
}

// AllowAt reports whether a request may pass at now.
func (s *SlidingLog) AllowAt(now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allow(now)
}

func (s *SlidingLog) allow(now int64) bool {
	for e := s.log.Front(); e != nil && now-e.Value.(int64) >= s.window; e = s.log.Front() {
		s.log.Remove(e)
	}
	if s.log.Len() < s.limit {
		s.log.PushBack(now)
		return true
	}
	return false
}

// SlidingWindow is the mutex-guarded ring of N slot counters with a rolling
// total: on each request it advances the current slot, zeroing the slots it
// passes and taking them off the total.
type SlidingWindow struct {
	mu       sync.Mutex
	slots    []int64
	cur      int
	slotTime int64 // start of the current slot
	total    int64
	limit    int64
	slotLen  int64
	clock    Clock
}

// NewSlidingWindow admits limit requests per window of n slots.
func NewSlidingWindow(limit int64, window time.Duration, n int, clock Clock) *SlidingWindow {
	return &SlidingWindow{slots: make([]int64, n), limit: limit, slotLen: int64(window) / int64(n), clock: clock}
}

// Allow reports whether a request may pass now, reading the clock under
// the lock as the seed's pseudo-code does.
func (s *SlidingWindow) Allow() bool {
	ok, _ := s.AllowTimed()
	return ok
}

// AllowTimed is Allow that also returns the clock reading it decided at.
func (s *SlidingWindow) AllowTimed() (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock()
	return s.allow(now), now
}

// AllowAt reports whether a request may pass at now.
func (s *SlidingWindow) AllowAt(now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allow(now)
}

func (s *SlidingWindow) allow(now int64) bool {
	start := now - now%s.slotLen
	if steps := (start - s.slotTime) / s.slotLen; steps > 0 {
		if steps >= int64(len(s.slots)) {
			clear(s.slots)
			s.total = 0
		} else {
			for range steps {
				s.cur = (s.cur + 1) % len(s.slots)
				s.total -= s.slots[s.cur]
				s.slots[s.cur] = 0
			}
		}
		s.slotTime = start
	}
	if s.total < s.limit {
		s.slots[s.cur]++
		s.total++
		return true
	}
	return false
}
