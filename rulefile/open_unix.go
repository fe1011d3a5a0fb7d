//go:build unix

package rulefile

import "syscall"

// openNonblock opens without waiting (a FIFO's open would wait for a
// writer).
const openNonblock = syscall.O_NONBLOCK
