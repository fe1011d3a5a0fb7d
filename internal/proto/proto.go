// Package proto gates the parts of leapflow's packages that are protocol
// between them, not API: methods that take a Token can be called only from
// inside leapflow, because only packages that may import this one can make
// one. metric.Reservation.Cancel is one (an admission given back twice would
// let a window pass its threshold; flow never copies one), and the
// registry's pinning and replacing of nodes (which flow keeps in step with
// its rules) are the others.
package proto

// Token is what protocol methods take.
type Token struct{ _ [0]func() }
