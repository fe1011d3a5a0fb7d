//go:build race

package main

// raceEnabled: under the race detector sync.Pool drops a share of what is
// put back, so a pooled object (a wait's timer, the room of a resource
// with more than two windows) is sometimes made anew.
const raceEnabled = true
