package keytable

import (
	"math/rand/v2"
	"unsafe"
)

// memhash is the runtime's seeded hash of n bytes at p, the one Go's maps
// and hash/maphash use (AES rounds where the CPU has them). The runtime
// marks it for linkname use by packages outside the standard library.
// Calling it directly costs a key's lookup two hashes of about 25
// instructions each; through maphash.String, with its seed check, chunking
// and slice conversion, each took about 60.
//
//go:linkname memhash runtime.memhash
//go:noescape
func memhash(p unsafe.Pointer, seed, n uintptr) uintptr

// seed is a secret hash seed of the table's: random, never 0.
type seed uint64

func newSeed() seed { return seed(rand.Uint64() | 1) }

// sum is key's 64-bit hash under seed s (leapflow runs on 64-bit
// platforms only: see internal/window's stripe index).
func (s seed) sum(key string) uint64 {
	return uint64(memhash(unsafe.Pointer(unsafe.StringData(key)), uintptr(s), uintptr(len(key))))
}
