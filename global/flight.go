package global

// A flight: one call to Redis and the requests waiting on it.

import (
	"time"

	"go.uber.org/atomic"
)

// flight is one call to Redis for a limit, and the requests waiting on it.
// A limit has at most one call in flight: a flight started while another
// is out (prev) gathers requests until that one ends, then seals what it
// asks for and leaves.
type flight struct {
	prev *flight // ended and cleared before the call
	// want is the sum of the requests that joined; the sealed bit is set
	// when the call leaves. need is the smallest request among them.
	want  atomic.Int64
	need  atomic.Int64
	done  chan struct{}
	ended atomic.Bool
	// The answer, written before done is closed: err, or refused, or
	// left tokens counted in bucket for the requests, claimable until
	// expires (then given back with the next call), and spare tokens
	// for the next call's requests (read only by that call).
	err     error
	refused bool
	left    atomic.Int64
	bucket  time.Time
	expires int64
	spare   int64
}

const sealed = int64(1) << 62

func newFlight(prev *flight, n int64) *flight {
	f := &flight{prev: prev, done: make(chan struct{})}
	f.want.Store(n)
	if n > 0 {
		f.need.Store(n)
	}
	return f
}

// add joins a request for n unless the call has left.
func (f *flight) add(n int64) bool {
	for {
		w := f.want.Load()
		if w&sealed != 0 {
			return false
		}
		if f.want.CompareAndSwap(w, w+n) {
			break
		}
	}
	// need after want: a call that has left by now asks with a need
	// larger than n at worst, which only risks a refusal when room is
	// short.
	for need := f.need.Load(); (need == 0 || n < need) && !f.need.CompareAndSwap(need, n); need = f.need.Load() {
	}
	return true
}

// withdraw takes a request for n back unless the call has left (the
// request gave up waiting).
func (f *flight) withdraw(n int64) {
	for {
		w := f.want.Load()
		if w&sealed != 0 || f.want.CompareAndSwap(w, w-n) {
			return
		}
	}
}

// seal closes f to new requests and returns what its requests ask for.
func (f *flight) seal() int64 {
	for {
		w := f.want.Load()
		if f.want.CompareAndSwap(w, w|sealed) {
			return w
		}
	}
}

// claim takes n of the tokens counted for f's requests, unless they
// expired.
func (f *flight) claim(now, n int64) bool {
	if now >= f.expires {
		return false
	}
	for {
		left := f.left.Load()
		if left < n {
			return false
		}
		if f.left.CompareAndSwap(left, left-n) {
			return true
		}
	}
}

// end publishes the answer.
func (f *flight) end() {
	f.ended.Store(true)
	close(f.done)
}
