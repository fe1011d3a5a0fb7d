//go:build !race

package httpflow

const raceEnabled = false
