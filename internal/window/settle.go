package window

// Settle hands over by time what later writes would hand over: readers
// that need a past span complete (stat's completed seconds) call it. If
// the newest bucket is over at now and counted anything, a fresh newest
// bucket is made at now, so the old one freezes (a writer that still
// reaches it makes its count on the new one); then every bucket that left
// the window a bucket or more before now is retired and handed over
// (WithHandover), once. After Settle(now), everything counted at a time
// before now - interval - bucket length has been handed over but for
// writers far enough behind to clamp into the newest bucket (they count
// there, and it is handed over in its turn). Settle takes the rotation
// lock; it makes at most one bucket, and none for a window idle since the
// previous Settle.
func (w *Window) Settle(now int64) {
	now = max(now, 0)
	a := &w.arr
	// Borrows due by now fold in when their bucket is made: make it, so a
	// priority request's pass is counted in its own second by time.
	for {
		start, ok := a.DueBorrow(now)
		if !ok || start <= a.Head().Start() {
			break
		}
		a.Current(start)
	}
	if head := a.Head(); now >= head.Start()+a.BucketLen() && head.Value.active() {
		a.Current(now)
	}
	a.RetireStale(now)
}

// active reports whether the bucket counted anything.
func (b *bucket) active() bool {
	if b.maxConcurrency() != 0 || loadT(&b.occupied) != 0 {
		return true
	}
	if _, ok := b.lowestRT(); ok {
		return true
	}
	for _, e := range [...]Event{Pass, Block, Success, Exception, RT} {
		if b.get(e) != 0 {
			return true
		}
	}
	return false
}

// CountsRange returns what the buckets whose start is in [lo, hi) hold:
// each event summed, the smallest RT (-1 if none) and the largest
// concurrency.
func (w *Window) CountsRange(lo, hi int64) Counts {
	c := Counts{MinRT: -1}
	w.CountsEach(lo, hi, func(_ int64, o Counts) { c.Add(o) })
	return c
}

// CountsEach calls fn with what each bucket whose start is in [lo, hi)
// holds, and its start (in no particular order).
func (w *Window) CountsEach(lo, hi int64, fn func(start int64, c Counts)) {
	for b := range w.arr.Buckets(lo, hi) {
		v := &b.Value
		c := Counts{Pass: v.get(Pass), Block: v.get(Block), Success: v.get(Success), Exception: v.get(Exception),
			RT: v.get(RT), Occupied: v.get(OccupiedPass), MinRT: -1, MaxConcurrency: v.maxConcurrency()}
		if rt, ok := v.lowestRT(); ok {
			c.MinRT = rt
		}
		fn(b.Start(), c)
	}
}

// RecordConcurrency records c requests in flight at now: the bucket keeps
// the largest (Counts.MaxConcurrency).
func (w *Window) RecordConcurrency(now, c int64) { w.updateConcurrency(max(now, 0), c) }

// Add adds o into c: events summed, the smaller MinRT (-1: none), the
// larger MaxConcurrency.
func (c *Counts) Add(o Counts) {
	c.Pass += o.Pass
	c.Block += o.Block
	c.Success += o.Success
	c.Exception += o.Exception
	c.RT += o.RT
	c.Occupied += o.Occupied
	if o.MinRT >= 0 && (c.MinRT < 0 || o.MinRT < c.MinRT) {
		c.MinRT = o.MinRT
	}
	c.MaxConcurrency = max(c.MaxConcurrency, o.MaxConcurrency)
}

// Zero reports whether c holds nothing.
func (c Counts) Zero() bool {
	return c.Pass == 0 && c.Block == 0 && c.Success == 0 && c.Exception == 0 && c.RT == 0 && c.Occupied == 0 &&
		c.MinRT < 0 && c.MaxConcurrency == 0
}

// Locked runs fn under the rotation lock: no bucket is made or retired
// (nor handed over) while it runs; writes within buckets go on.
func (w *Window) Locked(fn func()) { w.arr.Locked(fn) }
