//go:build !unix

package rulefile

// openNonblock is 0 where the platform has no such flag.
const openNonblock = 0
