//go:build race

package flow

// raceEnabled: under the race detector sync.Pool drops a quarter of what
// is put back, so a pooled object (a wait's timer) is sometimes made anew.
const raceEnabled = true
