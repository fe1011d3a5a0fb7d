package flow

import (
	"cmp"
	"slices"
	"sync"
	"time"

	"github.com/leapflow/leapflow/stat"
)

// Feed delivers each resource's completed seconds (stat.Second) to its
// subscribers, each second once and complete: the Prometheus collector,
// the metric log and the dashboard read an engine through it. An engine
// has one (Engine.Feed), as every second is handed out once.
//
// A second is delivered a window (1 s) after it ends, when every bucket of
// it has left the engine's second window: by time, so an idle resource's
// last busy second goes out too. Seconds in which a resource counted
// nothing are not delivered. Counts that reach a second after it was
// delivered (a pass taken back when a queued request gave up, a write from
// a goroutine that read the clock long before) go out with the resource's
// next delivered second. No count of a second goes below zero, so sums over
// seconds only grow: a pass taken back waits for a later second with
// passes to take it from (one taken back when no pass follows is never
// subtracted). Sums are otherwise exact. A feed falling
// more than 58 seconds behind (not polled) skips what the engine no longer
// holds.
//
// Wall-clock times: the engine clock's origin is arbitrary, so the feed
// maps engine time to wall time by one offset, taken when the feed is
// made (time.Now against the engine clock), and a second's Time is the
// wall time of its start truncated to the second. Each engine second
// thus has its own wall second, in order, with no gaps or repeats; over
// days the mapping drifts from the wall clock by what NTP slews (parts per
// million).
type Feed struct {
	eng    *Engine
	origin time.Time // wall time at engine time 0
	// deliver serialises deliveries: subscribers are called under it, in
	// order, and may subscribe or cancel (mu), but not Poll or Close.
	deliver sync.Mutex
	// mu guards the subscribers and the state below.
	mu     sync.Mutex
	subs   map[int]func([]stat.Second)
	nextID int
	batch  []stat.Second
	closed bool
	// stopping is set by Close: Start starts nothing from then on.
	stopping bool
	// stop and done run the ticker Start begins; tick makes it (a real
	// ticker of a second; tests drive their own).
	stop, done chan struct{}
	tick       func() (<-chan time.Time, func())
}

// everySecond is a Feed's tick: a ticker of a second and its Stop.
func everySecond() (<-chan time.Time, func()) {
	t := time.NewTicker(time.Second)
	return t.C, t.Stop
}

// Feed returns the engine's feed, made on the first call: from the
// second it is made in on, every second of every resource is kept for it
// (at most 64 between polls), that second whole (the engine still holds
// all of it). Nothing runs until Start or Poll.
func (e *Engine) Feed() *Feed {
	e.ruleSet()
	e.feedOnce.Do(func() {
		wall, now := time.Now(), e.now()
		e.feed = &Feed{eng: e, origin: wall.Add(-time.Duration(now)), subs: map[int]func([]stat.Second){}, tick: everySecond}
		e.registry.Seconds(now, false, func(stat.Second) {}) // starts keeping them: nothing is whole yet
	})
	return e.feed
}

// Subscribe calls fn with each delivery's seconds (a batch per poll,
// possibly empty, in order of time), until
// the returned function is called. fn runs on the polling goroutine, one
// call at a time: it must not block (copy what it keeps; the slice is
// reused), and may subscribe or cancel, but not Poll or Close.
func (f *Feed) Subscribe(fn func([]stat.Second)) (cancel func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := f.nextID
	f.nextID++
	f.subs[id] = fn
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.subs, id)
	}
}

// SubscribeRecent is Subscribe for a subscriber made late: fn's first
// call, made before SubscribeRecent returns, holds the completed seconds
// the engine still keeps (a minute of each resource, in order of time)
// that the feed delivered before, or that came before the feed was made;
// its later calls are the deliveries from then on. No second comes twice
// or goes missing between the two. Counts that reached a second after it
// was delivered are in it here (the engine's minute holds them where they
// belong), not in a later second.
func (f *Feed) SubscribeRecent(fn func([]stat.Second)) (cancel func()) {
	f.deliver.Lock()
	defer f.deliver.Unlock()
	var batch []stat.Second
	f.eng.registry.Recent(func(s stat.Second) {
		s.Time = f.origin.Add(time.Duration(s.Start)).Truncate(time.Second)
		batch = append(batch, s)
	})
	slices.SortStableFunc(batch, func(a, b stat.Second) int { return cmp.Compare(a.Start, b.Start) })
	fn(batch)
	return f.Subscribe(fn)
}

// Poll delivers what completed by now on the engine clock (engines on a
// fake clock are polled by hand; Start polls every second).
func (f *Feed) Poll() { f.poll(false) }

func (f *Feed) poll(final bool) {
	f.deliver.Lock()
	defer f.deliver.Unlock()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	f.closed = final
	subs := make([]func([]stat.Second), 0, len(f.subs))
	for _, fn := range f.subs {
		subs = append(subs, fn)
	}
	f.mu.Unlock()
	f.batch = f.batch[:0]
	f.eng.registry.Seconds(f.eng.now(), final, func(s stat.Second) {
		s.Time = f.origin.Add(time.Duration(s.Start)).Truncate(time.Second)
		f.batch = append(f.batch, s)
	})
	// By second, then as the registry ranges (a final delivery holds two
	// or three seconds of each resource).
	slices.SortStableFunc(f.batch, func(a, b stat.Second) int { return cmp.Compare(a.Start, b.Start) })
	for _, fn := range subs {
		fn(f.batch)
	}
}

// Start polls every second in a goroutine of its own until Close. It may
// be called more than once.
func (f *Feed) Start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stop != nil || f.stopping {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	f.stop, f.done = stop, done
	ticks, stopTicks := f.tick()
	go func() {
		defer close(done)
		defer stopTicks()
		for {
			select {
			case <-stop:
				return
			case <-ticks:
				f.Poll()
			}
		}
	}()
}

// Close stops the polling and delivers, once, every second not delivered
// yet, up to the current one, marked Partial. The feed delivers nothing
// after it.
func (f *Feed) Close() {
	f.mu.Lock()
	stop, done := f.stop, f.done
	f.stop, f.stopping = nil, true
	f.mu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
	f.poll(true)
}
