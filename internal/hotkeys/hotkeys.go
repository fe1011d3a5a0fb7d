// Package hotkeys estimates a per-key rule's busiest keys over the last
// minute from a sample of its requests: one in Every, drawn by the caller,
// is added here with its outcome. Nothing is kept of the other requests,
// so the cost on the request path is the draw; a sample that finds the
// sketch busy (another sample being added) is dropped rather than waited
// for.
//
// Each outcome (admitted, refused) keeps a summary of at most Capacity
// keys per ten seconds, six of them, in the manner of space-saving: a key
// new to a full summary replaces the smallest of a few of its keys
// (candidates, read from a random place: a full scan would cost every
// request a share of it) and inherits its count, so a key kept is never
// undercounted, and a heavy key, larger than most, is rarely the one
// replaced. Estimates are sampled counts times Every.
package hotkeys

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// Every is how many requests one sample stands for (a power of two: the
// caller draws with a mask of Every-1).
const Every = 256

// candidates is how many keys of a full summary a newcomer's eviction
// looks at.
const candidates = 8

// Capacity is how many keys a summary keeps.
const Capacity = 64

const (
	slotLen = int64(10 * time.Second)
	slots   = 6 // a minute
)

// Count is a key's estimated count.
type Count struct {
	Key   string
	Count int64
}

// summary is a space-saving summary: at most Capacity keys and their
// counts.
type summary map[string]int64

// add counts one sample of key, evicting the smallest key when full; the
// newcomer inherits its count (the space-saving bound).
func (s summary) add(key string) {
	if _, ok := s[key]; ok || len(s) < Capacity {
		s[key]++
		return
	}
	var low string
	lowN, seen := int64(-1), 0
	for k, n := range s { // from a random place (Go's map order)
		if lowN < 0 || n < lowN {
			low, lowN = k, n
		}
		if seen++; seen == candidates {
			break
		}
	}
	delete(s, low)
	s[key] = lowN + 1
}

// slot is ten seconds of samples.
type slot struct {
	start        int64 // slotLen-aligned; -1 when empty
	pass, refuse summary
}

// Sketch is a rule's samples of the last minute. The zero value is not
// ready: use New.
type Sketch struct {
	mu    sync.Mutex
	slots [slots]slot
}

// New returns an empty sketch.
func New() *Sketch {
	s := &Sketch{}
	for i := range s.slots {
		s.slots[i] = slot{start: -1, pass: summary{}, refuse: summary{}}
	}
	return s
}

// Add counts a sampled request of key at now (engine nanoseconds):
// refused or admitted. It drops the sample when another is being added.
func (s *Sketch) Add(key string, refused bool, now int64) {
	if !s.mu.TryLock() {
		return
	}
	defer s.mu.Unlock()
	start := max(now, 0) / slotLen * slotLen
	sl := &s.slots[start/slotLen%slots]
	if sl.start != start {
		sl.start = start
		clear(sl.pass)
		clear(sl.refuse)
	}
	if refused {
		sl.refuse.add(key)
	} else {
		sl.pass.add(key)
	}
}

// Top returns the n keys of each outcome with the largest estimated
// counts over the minute up to now, largest first (ties by key).
func (s *Sketch) Top(now int64, n int) (passed, refused []Count) {
	pass, refuse := map[string]int64{}, map[string]int64{}
	s.mu.Lock()
	lo := max(now, 0)/slotLen*slotLen - (slots-1)*slotLen
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.start < lo || sl.start > now {
			continue
		}
		for k, c := range sl.pass {
			pass[k] += c
		}
		for k, c := range sl.refuse {
			refuse[k] += c
		}
	}
	s.mu.Unlock()
	return top(pass, n), top(refuse, n)
}

func top(m map[string]int64, n int) []Count {
	out := make([]Count, 0, len(m))
	for k, c := range m {
		out = append(out, Count{k, c * Every})
	}
	slices.SortFunc(out, func(a, b Count) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out[:min(n, len(out))]
}
