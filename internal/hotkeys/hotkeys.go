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
// (candidates, from a place that rotates: a full scan would cost every
// request a share of it) and inherits its count, so a key kept is never
// undercounted, and a heavy key, larger than most, is rarely the one
// replaced. Adding allocates nothing. Estimates are sampled counts times
// Every.
package hotkeys

import (
	"cmp"
	"encoding/binary"
	"hash/maphash"
	"slices"
	"strings"
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
const Capacity = 32

// keyLen is the bytes of a key a summary keeps, in place: nothing of the
// caller's string is kept (it may be a buffer the caller reuses), and
// adding allocates nothing. A longer key keeps its first keyLen-8 bytes
// and 8 bytes of its hash, and shows as those bytes and "…".
const keyLen = 48

// stored is a key as a summary keeps it.
type stored struct {
	n    uint8 // bytes of b in use
	long bool  // b ends with a hash of the rest
	b    [keyLen]byte
}

// seed hashes the long keys.
var seed = maphash.MakeSeed()

// store is key as a summary keeps it.
func store(key string) stored {
	var k stored
	if len(key) <= keyLen {
		k.n = uint8(copy(k.b[:], key))
		return k
	}
	copy(k.b[:keyLen-8], key)
	binary.LittleEndian.PutUint64(k.b[keyLen-8:], maphash.String(seed, key))
	k.n, k.long = keyLen, true
	return k
}

// String is the key as shown.
func (k *stored) String() string {
	if k.long {
		return strings.ToValidUTF8(string(k.b[:keyLen-8]), "") + "…"
	}
	return string(k.b[:k.n])
}

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
// counts, in place.
type summary struct {
	n      int
	keys   [Capacity]stored
	counts [Capacity]int64
	next   int // where the next eviction looks first (it rotates)
}

// add counts one sample of key; a key new to a full summary replaces the
// smallest of candidates keys and inherits its count (the space-saving
// bound).
func (s *summary) add(key *stored) {
	for i := range s.n {
		if s.keys[i] == *key {
			s.counts[i]++
			return
		}
	}
	if s.n < Capacity {
		s.keys[s.n], s.counts[s.n] = *key, 1
		s.n++
		return
	}
	low := s.next
	for j := 1; j < candidates; j++ {
		if i := (s.next + j) % Capacity; s.counts[i] < s.counts[low] {
			low = i
		}
	}
	s.next = (s.next + candidates) % Capacity
	s.keys[low] = *key
	s.counts[low]++
}

// reset empties the summary.
func (s *summary) reset() { s.n, s.next = 0, 0 }

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
		s.slots[i].start = -1
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
		sl.pass.reset()
		sl.refuse.reset()
	}
	k := store(key)
	if refused {
		sl.refuse.add(&k)
	} else {
		sl.pass.add(&k)
	}
}

// Top returns the n keys of each outcome with the largest estimated
// counts over the minute up to now, largest first (ties by key).
func (s *Sketch) Top(now int64, n int) (passed, refused []Count) {
	pass, refuse := map[stored]int64{}, map[stored]int64{}
	s.mu.Lock()
	lo := max(now, 0)/slotLen*slotLen - (slots-1)*slotLen
	for i := range s.slots {
		sl := &s.slots[i]
		if sl.start < lo || sl.start > now {
			continue
		}
		for i := range sl.pass.n {
			pass[sl.pass.keys[i]] += sl.pass.counts[i]
		}
		for i := range sl.refuse.n {
			refuse[sl.refuse.keys[i]] += sl.refuse.counts[i]
		}
	}
	s.mu.Unlock()
	return top(pass, n), top(refuse, n)
}

func top(m map[stored]int64, n int) []Count {
	out := make([]Count, 0, len(m))
	for k, c := range m {
		out = append(out, Count{k.String(), c * Every})
	}
	slices.SortFunc(out, func(a, b Count) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return out[:min(n, len(out))]
}
