package metric

// Counter is a striped sum: each P adds to its own cache line, reads add the
// lines up. Use it for a count many goroutines change and few read (an
// in-flight gauge). A Sum that runs alongside Adds may miss the latest of
// them. A Counter is safe for simultaneous use and must not be copied after
// first use.
type Counter struct {
	stripes []stripe
	mask    int
}

// NewCounter returns a Counter of DefaultStripes stripes.
func NewCounter() *Counter {
	n := DefaultStripes()
	return &Counter{stripes: make([]stripe, n), mask: n - 1}
}

// Add adds d (which may be negative).
func (c *Counter) Add(d int64) { c.stripes[pid()&c.mask].c[0].Add(d) }

// Sum returns the total of every Add so far.
func (c *Counter) Sum() int64 {
	var sum int64
	for i := range c.stripes {
		sum += c.stripes[i].c[0].Load()
	}
	return sum
}
