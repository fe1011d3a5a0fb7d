// Package hammer runs benchmark bodies from an exact number of goroutines,
// so results can be named and compared by goroutine count (testing's
// RunParallel only offers multiples of GOMAXPROCS).
package hammer

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Goroutines is the default sweep: 1 to 16, then heavy oversubscription.
var Goroutines = []int{1, 2, 4, 8, 16, 64, 256}

// Run runs b.N operations split over g goroutines, all released at once.
// body does n operations; goroutine i is passed as id so bodies can keep
// per-goroutine state. The reported ns/op is for the whole machine.
func Run(b *testing.B, g int, body func(id, n int)) {
	b.ReportAllocs()
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	per, extra := b.N/g, b.N%g
	for i := range g {
		n := per
		if i < extra {
			n++
		}
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			body(i, n)
		}()
	}
	ready.Wait()
	b.ResetTimer()
	close(start)
	done.Wait()
}

// Sweep runs body under a sub-benchmark per goroutine count, named
// "goroutines=G".
func Sweep(b *testing.B, counts []int, body func(id, n int)) {
	for _, g := range counts {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) { Run(b, g, body) })
	}
}

// InRequestOrder is a stream of n keys drawn by next, each request's key
// its own copy, laid out in stream order: as a server reads a request's
// key from the request itself, a lookup measured over it pays for its
// table, not for fetching the caller's key from a random place in memory.
func InRequestOrder(n int, next func() string) []string {
	var buf strings.Builder
	ends := make([]int, n)
	for i := range ends {
		buf.WriteString(next())
		ends[i] = buf.Len()
	}
	all := buf.String()
	stream := make([]string, n)
	from := 0
	for i, end := range ends {
		stream[i], from = all[from:end], end
	}
	return stream
}
