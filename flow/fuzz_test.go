package flow

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/leapflow/leapflow/stat/stattest"
)

// flakySource answers from a byte of the fuzz input: allow, refuse, fail or
// panic.
type flakySource struct{ mode *byte }

func (s flakySource) Acquire(context.Context, GlobalRequest) (bool, error) {
	switch *s.mode % 4 {
	case 0:
		return true, nil
	case 1:
		return false, nil
	case 2:
		return false, errors.New("down")
	}
	panic("source bug")
}

// FuzzEngine loads a fuzzed rule pair and runs fuzzed requests through it:
// nothing may panic, every error is a known kind, and once every admission
// has exited nothing is left in flight.
func FuzzEngine(f *testing.F) {
	f.Add(uint8(0), uint8(0), 10.0, uint16(1000), uint32(0), 0.0, uint16(0), uint8(0), uint8(0), 0.0, int64(1), []byte{1, 2, 3})
	f.Add(uint8(1), uint8(0), 2.0, uint16(0), uint32(0), 0.0, uint16(0), uint8(0), uint8(0), 0.0, int64(1), []byte{0, 0, 0, 9, 9})
	f.Add(uint8(0), uint8(1), 100.0, uint16(500), uint32(2000), 3.0, uint16(0), uint8(0), uint8(0), 0.0, int64(3), []byte{5, 200, 7})
	f.Add(uint8(0), uint8(2), 5.0, uint16(1000), uint32(0), 0.0, uint16(300), uint8(4), uint8(0), 0.0, int64(2), []byte{1, 1, 1, 1})
	f.Add(uint8(0), uint8(3), 50.0, uint16(1000), uint32(1000), 2.0, uint16(100), uint8(0), uint8(0), 0.0, int64(1), []byte{3, 4})
	f.Add(uint8(0), uint8(0), 1e19, uint16(1000), uint32(0), 0.0, uint16(0), uint8(0), uint8(0), 0.0, int64(math.MaxInt64), []byte{255})
	f.Add(uint8(0), uint8(0), 10.0, uint16(1000), uint32(0), 0.0, uint16(0), uint8(1), uint8(0), 0.5, int64(1), []byte{2, 2, 3, 3})
	f.Add(uint8(0), uint8(0), 10.0, uint16(1000), uint32(0), 0.0, uint16(0), uint8(2), uint8(1), 0.0, int64(0), []byte{7})
	f.Add(uint8(0), uint8(0), math.NaN(), uint16(7), uint32(1), -1.0, uint16(9), uint8(255), uint8(9), math.Inf(1), int64(-1), []byte{})
	f.Fuzz(func(t *testing.T, m, b uint8, threshold float64, intervalMs uint16, warmMs uint32, cold float64,
		queueMs uint16, flags, fallback uint8, share float64, count int64, steps []byte) {
		if len(steps) > 256 {
			steps = steps[:256]
		}
		clock := stattest.NewClock(0)
		var mode byte
		e, err := New(WithClock(clock), WithTokenSource(flakySource{&mode}),
			WithSleep(func(ctx context.Context, d time.Duration) error { clock.Advance(d); return ctx.Err() }))
		if err != nil {
			t.Fatal(err)
		}
		r := Rule{
			Resource: "api", Metric: Metric(m % 3), Behavior: Behavior(b % 5), Threshold: threshold,
			StatInterval: time.Duration(intervalMs) * time.Millisecond, WarmUpPeriod: time.Duration(warmMs) * time.Millisecond,
			ColdFactor: cold, MaxQueueing: time.Duration(queueMs) * time.Millisecond,
			Global: flags&1 != 0, Fallback: Fallback(fallback % 4), LocalShare: share,
		}
		if flags&2 != 0 {
			r.RelatedResource = "db"
		}
		rules := []Rule{r, {Resource: "api", Metric: Concurrency, Threshold: float64(flags % 7)}}
		if err := e.LoadRules(rules); err != nil && !errors.Is(err, ErrInvalidRule) {
			t.Fatalf("LoadRules: %v", err)
		}
		var open []Entry
		for i, s := range steps {
			mode = s >> 4
			clock.Advance(time.Duration(s%16) * 37 * time.Millisecond)
			if s%61 == 0 {
				clock.Advance(-time.Duration(s) * time.Millisecond) // steps back
			}
			opts := []EntryOption{WithCount(int(count%5) + int(s%3))}
			if flags&4 != 0 {
				opts = append(opts, WithWait(500*time.Millisecond))
			}
			name := "api"
			if i%5 == 4 {
				name = "db"
			}
			en, err := e.Entry(name, opts...)
			switch {
			case err == nil:
				open = append(open, en)
			case errors.Is(err, ErrBlocked), errors.Is(err, ErrInvalidOption), errors.Is(err, context.Canceled):
			default:
				t.Fatalf("step %d: unexpected error %v", i, err)
			}
			if s%4 == 0 {
				for j := range open {
					open[j].Exit(nil)
					open[j].Exit(nil)
				}
				open = open[:0]
			}
		}
		for j := range open {
			open[j].Exit(nil)
		}
		if c := e.registry.Lookup("api"); c != nil && c.Concurrency() != 0 {
			t.Fatalf("concurrency %d after every exit", c.Concurrency())
		}
		if c := e.registry.Lookup("api"); c != nil && c.Inflight() != 0 {
			t.Fatalf("in flight %d after every exit", c.Inflight())
		}
	})
}
