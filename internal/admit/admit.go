// Package admit lets flow give back an admission that metric made, without
// making the give-back usable outside leapflow: an admission is given back
// at most once only because flow holds each one once and never copies it.
package admit

// Token is what metric.Reservation.Cancel takes; only packages that may
// import this one can make one.
type Token struct{ _ [0]func() }
