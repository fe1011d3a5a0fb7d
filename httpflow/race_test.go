//go:build race

package httpflow

// raceEnabled: under the race detector sync.Pool drops a share of what is
// put back, so pooled objects are sometimes made anew.
const raceEnabled = true
