package flow

import (
	"context"
	"errors"
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
	e     *Engine
	name  string
	set   *ruleSet
	rr    *resourceRules
	h     held
	q     request
	p     int
	start int64 // the instant's start (see take)
	wait  int64 // how long after start it goes
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
// within its wait (WithWait; MaxWait when not given) and returns at once,
// without waiting: the reservation says how long until the request may go
// (Delay), and the caller then enters it (Enter, or Wait to sleep until
// then) or gives it up (Cancel, which gives back what it took under the
// cancel rule of WithWait). A request no instant within the wait admits
// is blocked, with the rule's *BlockError, as Entry would block it. A
// resource without rules is reserved for now. Reserve allocates the
// Reservation; Entry and Wait do not allocate.
func (e *Engine) Reserve(resource string, opts ...EntryOption) (*Reservation, error) {
	q := request{n: 1}
	if err := parseOptions(&q, opts); err != nil {
		return nil, err
	}
	if q.priority {
		q.wait = max(q.wait, e.occupyTimeout)
	}
	if q.wait == 0 {
		q.wait = int64(MaxWait)
	}
	set := e.rules.Load()
	rr := set.byResource[resource]
	if rr == nil {
		// No rules: nothing to hold; Enter counts it.
		if _, err := e.registry.Node(resource); err != nil {
			return nil, err
		}
		return &Reservation{e: e, name: resource, set: set, q: q, start: e.now()}, nil
	}
	r := &Reservation{e: e, name: resource, set: set, rr: rr, q: q}
	p, now := e.pinNow()
	start, wait, _, err := e.take(rr, &r.h, p, now, &r.q)
	if err != nil {
		return nil, err
	}
	r.p, r.start, r.wait = p, start, wait
	return r, nil
}

// Delay returns how long from now until the reserved instant (0 once it
// has come).
func (r *Reservation) Delay() time.Duration {
	return time.Duration(max(r.start+r.wait-r.e.now(), 0))
}

// Enter turns the reservation into the admitted request, counted at its
// instant; call it once Delay is 0 (a request that goes earlier is still
// counted at its instant, so a rule's bound holds on the counts, not on
// when it ran). It returns ErrReservationDone after Enter or Cancel.
func (r *Reservation) Enter() (Entry, error) {
	if !r.state.CompareAndSwap(reserved, entered) {
		return Entry{}, ErrReservationDone
	}
	if r.rr == nil {
		if r.q.hasKey {
			return r.e.Entry(r.name, WithCount(int(r.q.n)), WithKey(r.q.key))
		}
		return r.e.Entry(r.name, WithCount(int(r.q.n)))
	}
	return r.e.finish(r.set, r.rr, &r.h, r.p, r.start+r.wait, 0, &r.q)
}

// Wait sleeps until the reserved instant, or until ctx ends (then it
// cancels the reservation and returns ctx's error), and enters it.
func (r *Reservation) Wait(ctx context.Context) (Entry, error) {
	if d := r.Delay(); d > 0 {
		if err := r.e.wait(ctx, d); err != nil {
			r.Cancel()
			return Entry{}, err
		}
	}
	return r.Enter()
}

// Cancel gives the reservation up: what it took goes back as the cancel
// rule of WithWait says. It does nothing after Enter or a first Cancel.
func (r *Reservation) Cancel() {
	if r.state.CompareAndSwap(reserved, cancelled) && r.rr != nil {
		r.e.release(r.rr, &r.h, r.q.n)
	}
}
