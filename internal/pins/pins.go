// Package pins carries the protocol between stat's Registry and flow
// without exporting it: pinning the nodes of the resources that flow's
// rules name (the registry never lets them go), letting them go again, and
// replacing a node the registry let go while a request counted on it.
// Package stat sets Stat when it starts; only leapflow's own packages can
// import this one.
package pins

// Protocol is a registry's protocol with flow: R is the registry type and
// N its node type.
type Protocol[R, N any] struct {
	// Pin returns the nodes of resources, creating those missing, and
	// pins them all; or, if the cap leaves no room for the missing ones,
	// changes nothing and returns the registry's error.
	Pin func(r R, resources []string) ([]N, error)
	// Unpin lets the registry drop the nodes of resources again once idle.
	Unpin func(r R, resources []string)
	// Replace returns the node that stands for dropped's resource now,
	// creating it if needed, past the cap if it must.
	Replace func(r R, dropped N) N
}

// Stat is package stat's Protocol[*stat.Registry, *stat.Node], set by its
// init (held as any: this package cannot name stat's types).
var Stat any
