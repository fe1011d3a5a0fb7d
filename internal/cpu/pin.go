package cpu

import _ "unsafe" // for go:linkname

// procPin and procUnpin are the runtime's own way to learn the current P.
// The runtime marks them for linkname use by packages outside the standard
// library; sync.Pool relies on the same pair.
//
//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// Pin returns the index of the P running the caller, the stripe hint that
// the ...On methods take. The goroutine may move right after; that only
// costs locality, never correctness, since every stripe is updated
// atomically. Callers that touch several striped objects in one operation
// pin once and pass the hint to each.
func Pin() int {
	p := procPin()
	procUnpin()
	return p
}

//go:linkname cheaprand runtime.cheaprand
func cheaprand() uint32

// Rand returns a cheap pseudo-random number from the running M's own state:
// no shared write, a few nanoseconds. It is for spreading and sampling, not
// for anything that must be unpredictable.
func Rand() uint32 { return cheaprand() }

// PinRand is Pin and Rand in one call: the stripe hint and a draw for a
// sampled refresh (see flow's clock read).
func PinRand() (int, uint32) {
	p := procPin()
	r := cheaprand()
	procUnpin()
	return p, r
}
