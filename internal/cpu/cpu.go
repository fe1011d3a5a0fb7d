// Package cpu holds what leapflow's striped counters share: the cache-line
// size they are padded to, the index of the P running the caller, and how
// many stripes to spread a counter over.
package cpu

import (
	"math/bits"
	"runtime"
)

// CacheLine is the size hot counters are padded to: the line of x86-64 and
// of most arm64 cores. Cores with 128-byte lines (Apple M-series) still keep
// padded counters apart; only a pair of adjacent stripes may then share one.
const CacheLine = 64

// MaxStripes caps the stripes per counter: beyond it, memory grows faster
// than contention falls.
const MaxStripes = 64

// Stripes returns the stripe count used when none is configured:
// GOMAXPROCS rounded up to a power of two, at most MaxStripes.
func Stripes() int { return RoundStripes(runtime.GOMAXPROCS(0)) }

// RoundStripes rounds n up to a power of two in [1, MaxStripes].
func RoundStripes(n int) int {
	if n <= 1 {
		return 1
	}
	if n > MaxStripes {
		return MaxStripes
	}
	return 1 << bits.Len(uint(n-1))
}
