package window

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// oracle is the brute-force model of a Window: a list of every add, placed in
// the bucket its (clamped) time falls in, summed by scanning the list.
type oracle struct {
	interval, bucketLen int64
	latest              int64
	adds                []oracleAdd
}

type oracleAdd struct {
	start int64
	e     Event
	n     int64
}

func (o *oracle) clamp(t int64) int64 {
	if t < o.latest {
		return o.latest
	}
	return t
}

func (o *oracle) add(t int64, e Event, n int64) {
	t = o.clamp(t)
	s := t - t%o.bucketLen
	o.latest = max(o.latest, s)
	o.adds = append(o.adds, oracleAdd{s, e, n})
}

func (o *oracle) sum(t int64, e Event) int64 { return o.sumOver(t, o.interval, e) }

func (o *oracle) sumOver(t, span int64, e Event) int64 {
	t = o.clamp(t)
	var sum int64
	for _, a := range o.adds {
		if a.e == e && a.start <= t && t-a.start < span {
			sum += a.n
		}
	}
	return sum
}

// checkAgainstOracle replays ops decoded from data: each 3 bytes are a time
// step (mostly forward, sometimes back), an op (an event to add, an
// admission, or a cancel of the oldest admission held, whose bucket by then
// may be frozen or gone) and a count, and every op is followed by a Sum
// compared with the oracle, over the whole window (cached when the time is
// in the newest bucket) and over a view of half of it.
func checkAgainstOracle(t *testing.T, n int, data []byte) {
	t.Helper()
	interval := int64(time.Second)
	w, err := NewWindow(n, time.Duration(interval), WithStripes(4))
	if err != nil {
		t.Fatal(err)
	}
	o := &oracle{interval: interval, bucketLen: interval / int64(n)}
	var half *Reader
	if n%2 == 0 {
		if half, err = w.View(time.Duration(interval / 2)); err != nil {
			t.Fatal(err)
		}
	}
	var held []Reservation
	now := int64(0)
	for i := 0; i+2 < len(data); i += 3 {
		step := int64(int8(data[i])) * int64(time.Second) / 40 // -3.2s..+3.2s
		now = max(0, now+step)
		cnt := int64(data[i+2]%7) + 1
		switch op := data[i+1] % (uint8(numEvents) + 2); op {
		case uint8(numEvents): // admit, to cancel later
			r, ok := w.Admit(now, cnt, math.MaxInt32)
			if !ok {
				t.Fatalf("op %d: admission refused", i/3)
			}
			o.add(now, Pass, cnt)
			held = append(held, r)
		case uint8(numEvents) + 1: // cancel the oldest admission held
			if len(held) > 0 {
				r := held[0]
				held = held[1:]
				o.adds = append(o.adds, oracleAdd{r.Start(), Pass, -r.count()})
				r.Cancel()
			}
		default:
			e := Event(op)
			w.Add(now, e, cnt)
			o.add(now, e, cnt)
		}
		q := max(0, now+int64(int8(data[i+2]))*int64(time.Millisecond)*10)
		for _, ev := range Events() {
			if got, want := w.Sum(q, ev), o.sum(q, ev); got != want {
				t.Fatalf("op %d: Sum(%d, %v) = %d want %d", i/3, q, ev, got, want)
			}
			if half == nil {
				continue
			}
			if got, want := half.Sum(q, ev), o.sumOver(q, interval/2, ev); got != want {
				t.Fatalf("op %d: half Sum(%d, %v) = %d want %d", i/3, q, ev, got, want)
			}
		}
	}
}

func TestSumMatchesOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(42, 42))
	cases := 300
	if testing.Short() {
		cases = 50
	}
	for c := range cases {
		data := make([]byte, 3*(10+rng.IntN(200)))
		for i := range data {
			data[i] = byte(rng.UintN(256))
		}
		// Bias steps forward and small, as real clocks are.
		for i := 0; i < len(data); i += 3 {
			if rng.IntN(10) < 8 {
				data[i] = byte(rng.IntN(12))
			}
		}
		n := []int{1, 2, 4, 5, 10}[c%5]
		checkAgainstOracle(t, n, data)
	}
}

func FuzzSumMatchesOracle(f *testing.F) {
	f.Add(uint8(2), []byte{4, 0, 1, 4, 1, 2, 250, 2, 3, 40, 4, 5})
	f.Add(uint8(10), []byte{1, 0, 1, 1, 0, 1, 1, 0, 1, 200, 0, 1, 1, 0, 1})
	f.Fuzz(func(t *testing.T, n uint8, data []byte) {
		checkAgainstOracle(t, []int{1, 2, 4, 5, 10}[n%5], data)
	})
}
