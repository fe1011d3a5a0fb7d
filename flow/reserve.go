package flow

import (
	"errors"
	"runtime"
	"time"

	"go.uber.org/atomic"
)

// Reservation is a request admitted now for an instant that may be later
// (x/time/rate's Reserve): every rule it passes has counted it at that
// instant, where it will land, and holds it there until the caller enters
// or cancels. Delay says how long until then. A Reservation is for one
// goroutine's use, except Cancel, which any goroutine may call, once or
// more.
type Reservation struct {
	st    *reservedState
	e     *Engine
	name  string
	rr    *resourceRules
	p     int
	start int64 // the instant's start (see take)
	wait  int64 // how long after start it goes
}

// reservedState is what a Reservation holds, apart from it, so that a
// reservation dropped unentered and uncancelled can be cancelled by the
// garbage collector's cleanup (which must not reach the Reservation).
type reservedState struct {
	h     held
	q     request
	state atomic.Int32
}

// Reservation states.
const (
	reserved int32 = iota
	entered
	cancelled
)

// ErrReservationDone matches the error of entering a Reservation that
// was entered or cancelled already.
var ErrReservationDone = errors.New("flow: the reservation was entered or cancelled already")

// Reserve admits a request for the earliest instant its rate rules allow
// within its wait (WithWait, WithWait(0) for now only; an hour when not
// given) and returns at once, without waiting: the reservation says how
// long until the request may go
// (Delay), and the caller then enters it (Entry, once Delay has passed)
// or gives it up (Cancel, which gives back what it took under the
// cancel rule of WithWait). A request no instant within the wait admits
// is blocked, with the rule's *BlockError, as Entry would block it. A
// Concurrency rule counts the request in flight from Reserve (until Exit
// of the entered request, or Cancel). A resource without rules is
// reserved for now. Reserve allocates the Reservation; Entry does not
// allocate.
func (e *Engine) Reserve(resource string, opts ...EntryOption) (*Reservation, error) {
	q := request{n: 1}
	if err := e.readOptions(&q, opts); err != nil {
		return nil, err
	}
	if !q.hasWait {
		q.wait = int64(longestWait)
	}
	set := e.ruleSet()
	rr := set.byResource[resource]
	if rr == nil {
		// No rules: nothing to hold; Entry counts it.
		if _, err := e.registry.Node(resource); err != nil {
			return nil, err
		}
		return &Reservation{st: &reservedState{q: q}, e: e, name: resource, start: e.now()}, nil
	}
	st := &reservedState{q: q}
	p, d, now := e.pinDrawNow()
	st.q.draw = d
	start, wait, _, err := e.take(rr, &st.h, p, now, &st.q)
	if err != nil {
		return nil, err
	}
	r := &Reservation{st: st, e: e, name: resource, rr: rr, p: p, start: start, wait: wait}
	// A reservation dropped without Entry or Cancel gives back what it
	// took when it is collected (a Concurrency rule's slot above all).
	runtime.AddCleanup(r, func(st *reservedState) { st.cancel(e, rr) }, st)
	return r, nil
}

// Delay returns how long from now until the reserved instant (0 once it
// has come).
func (r *Reservation) Delay() time.Duration {
	return time.Duration(max(r.start+r.wait-r.e.now(), 0))
}

// Entry turns the reservation into the admitted request, stamped
// (Entry.Start) and counted by its rules at its instant; call it once
// Delay is 0. One entered earlier still counts at its instant in its
// rules, so their bounds hold on the counts, not on when it ran; the
// resource's statistics count it when it runs. It returns
// ErrReservationDone after Entry or Cancel. To wait for the instant,
// sleep for Delay (or select on a timer and the request's context, and
// Cancel if the context ends first).
func (r *Reservation) Entry() (Entry, error) {
	st := r.st
	if !st.state.CompareAndSwap(reserved, entered) {
		return Entry{}, ErrReservationDone
	}
	if r.rr == nil {
		if st.q.hasKey {
			return r.e.Entry(r.name, WithCount(int(st.q.n)), WithKey(st.q.key))
		}
		return r.e.Entry(r.name, WithCount(int(st.q.n)))
	}
	return r.e.finish(r.rr, &st.h, r.p, r.start+r.wait, 0, true, &st.q)
}

// Cancel gives the reservation up: what it took goes back as the cancel
// rule of WithWait says. It does nothing after Entry or a first Cancel.
// A reservation dropped without either is cancelled when the garbage
// collector finds it unreachable, which may be long after: call Cancel.
func (r *Reservation) Cancel() { r.st.cancel(r.e, r.rr) }

func (st *reservedState) cancel(e *Engine, rr *resourceRules) {
	if st.state.CompareAndSwap(reserved, cancelled) && rr != nil {
		e.release(rr, &st.h, st.q.n)
	}
}
