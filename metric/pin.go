package metric

import _ "unsafe" // for go:linkname

// procPin and procUnpin are the runtime's own way to learn the current P.
// The runtime marks them for linkname use by packages outside the standard
// library; sync.Pool relies on the same pair.
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// pid returns the index of the P running the caller. The goroutine may move
// right after; that only costs locality, never correctness, since every stripe
// is updated atomically.
func pid() int {
	p := procPin()
	procUnpin()
	return p
}
