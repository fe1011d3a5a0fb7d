// Package trace makes request traces (Poisson, bursty, one hot instance),
// replays them in real time against instances, and runs the oracle they
// are judged by: the same bucketed sliding window run in one place, with
// every request in view.
package trace

import (
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"
)

// Arrival is one request: when, from the start, and at which instance.
type Arrival struct {
	At       time.Duration
	Instance int
}

// poisson calls emit at the arrival times of a Poisson process of rate
// per second over d.
func poisson(rng *rand.Rand, rate float64, d time.Duration, emit func(at time.Duration)) {
	for t := 0.0; ; {
		t += rng.ExpFloat64() / rate
		at := time.Duration(t * float64(time.Second))
		if at >= d {
			return
		}
		emit(at)
	}
}

// Poisson spreads Poisson arrivals of rate per second over d evenly on n
// instances.
func Poisson(rng *rand.Rand, rate float64, d time.Duration, n int) []Arrival {
	var out []Arrival
	poisson(rng, rate, d, func(at time.Duration) { out = append(out, Arrival{at, rng.IntN(n)}) })
	return out
}

// OneHot is Poisson with a share hot of the arrivals on instance 0 and
// the rest spread on the others.
func OneHot(rng *rand.Rand, rate float64, d time.Duration, n int, hot float64) []Arrival {
	var out []Arrival
	poisson(rng, rate, d, func(at time.Duration) {
		i := 0
		if n > 1 && rng.Float64() >= hot {
			i = 1 + rng.IntN(n-1)
		}
		out = append(out, Arrival{at, i})
	})
	return out
}

// Bursty is Poisson arrivals of rate per second during bursts of length
// on, one starting every period at a random offset, none between them.
func Bursty(rng *rand.Rand, rate float64, on, period, d time.Duration, n int) []Arrival {
	var out []Arrival
	for start := time.Duration(0); start < d; start += period {
		from := start + time.Duration(rng.Int64N(int64(period-on)+1))
		poisson(rng, rate, on, func(at time.Duration) {
			if from+at < d {
				out = append(out, Arrival{from + at, rng.IntN(n)})
			}
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// Outcome is what one request got, and when it was sent.
type Outcome struct {
	At       time.Time
	Admitted bool
}

// Replay sends trace in real time from one goroutine per instance (of n):
// each sends its arrivals when they are due, late ones at once. admit
// makes one request at an instance. It returns every outcome, in order of
// sending.
func Replay(trace []Arrival, n int, admit func(instance int) bool) []Outcome {
	per := make([][]time.Duration, n)
	for _, a := range trace {
		per[a.Instance] = append(per[a.Instance], a.At)
	}
	outs := make([][]Outcome, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, at := range per[i] {
				if wait := time.Until(start.Add(at)); wait > 0 {
					time.Sleep(wait)
				}
				now := time.Now()
				outs[i] = append(outs[i], Outcome{At: now, Admitted: admit(i)})
			}
		}()
	}
	wg.Wait()
	var all []Outcome
	for _, o := range outs {
		all = append(all, o...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
	return all
}

// Admitted counts the admitted outcomes.
func Admitted(outs []Outcome) (n int64) {
	for _, o := range outs {
		if o.Admitted {
			n++
		}
	}
	return n
}

// Oracle runs a sliding window of threshold admissions per window, in
// buckets of window/buckets aligned to the Unix epoch (as the Redis layer
// keeps them), on the sending times of outs, and returns how many it
// admits.
func Oracle(outs []Outcome, threshold int64, window time.Duration, buckets int) int64 {
	blen := int64(window) / int64(buckets)
	counts := map[int64]int64{}
	var admitted int64
	for _, o := range outs {
		b := o.At.UnixNano() / blen
		var sum int64
		for k := b - int64(buckets) + 1; k <= b; k++ {
			sum += counts[k]
		}
		if sum < threshold {
			counts[b]++
			admitted++
		}
		delete(counts, b-int64(buckets))
	}
	return admitted
}

// Ratio is a/b, or 1 when both are 0.
func Ratio(a, b int64) float64 {
	if b == 0 {
		if a == 0 {
			return 1
		}
		return math.Inf(1)
	}
	return float64(a) / float64(b)
}

// Even is arrivals evenly spaced at rate per second over d, dealt to n
// instances in turn.
func Even(rate float64, d time.Duration, n int) []Arrival {
	var out []Arrival
	gap := float64(time.Second) / rate
	for i := 0; ; i++ {
		at := time.Duration(float64(i) * gap)
		if at >= d {
			return out
		}
		out = append(out, Arrival{at, i % n})
	}
}
