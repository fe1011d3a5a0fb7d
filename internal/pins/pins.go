// Package pins carries the protocol between package stats and flow
// without exporting it: pinning the nodes of the resources that flow's
// rules name (the registry never lets them go), letting them go again,
// replacing a node the registry let go while a request counted on it,
// counting in a node's concurrency the requests in flight that no rule
// counted (adoption), and reading a Coarse clock's cached value.
// Package stats sets Stat when it starts; only leapflow's own packages can
// import this one.
package pins

import (
	"time"

	"go.uber.org/atomic"
)

// Protocol is stat's protocol with flow: R is the registry type, N its
// node type and C its coarse clock type.
type Protocol[R, N, C any] struct {
	// Pin returns the nodes of resources, creating those missing, and
	// pins them all; or, if the cap leaves no room for the missing ones,
	// changes nothing and returns the registry's error.
	Pin func(r R, resources []string) ([]N, error)
	// Unpin lets the registry drop the nodes of resources again once idle.
	Unpin func(r R, resources []string)
	// Replace returns the node that stands for dropped's resource now,
	// creating it if needed, past the cap if it must.
	Replace func(r R, dropped N) N
	// Adopt counts in n's concurrency, as adopted, the requests in
	// flight (passes minus completions) that its concurrency does not
	// count yet, read in one instant of its second window; it returns how
	// many, and whether n held none adopted before.
	Adopt func(n N) (added int64, first bool)
	// ReleaseAdopted ends up to k of n's adopted requests (as many as it
	// holds) in its concurrency; it reports whether that ended the last.
	ReleaseAdopted func(n N, k int64) (drained bool)
	// Cached returns the words of clock c: its cached time, and the flag
	// that says reads must refresh it (see clocks.Coarse).
	Cached func(c C) (now *atomic.Int64, behind *atomic.Bool)
	// Refresh is c's refresh for a reader that saw v: the time c holds
	// after it. A reader refreshes when behind is set, and otherwise when
	// a cheap random draw masked by RefreshMask is 0 (Coarse.Now's own
	// rule, spelled out where a call would not inline).
	Refresh     func(c C, v int64) int64
	RefreshMask uint32
	// Monotonic reports whether clock is stat's NewMonotonic, and its
	// origin: a reader can then read time.Since(origin) itself, without
	// the interface call.
	Monotonic func(clock any) (origin time.Time, ok bool)
}

// Stat is package stats' Protocol[*stats.Registry, *stats.Node,
// *clocks.Coarse], set by its init (held as any: this package cannot name their types).
var Stat any
