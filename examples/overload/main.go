// Command overload puts a service of fixed capacity (8 workers of 10 ms:
// 800 requests a second), after a second at half its capacity, under 3x
// overload for a few seconds of real time, first with no rule, then with a SystemBBR rule in front, and
// prints goodput, latency and the requests shed.
//
// Without a rule every request waits for a worker and the wait grows
// without bound; with the rule the service completes about what it can
// and sheds the rest at once. The rule reads a CPU usage: here the share
// of the workers busy, measured by a sampler this program starts and
// stops (flow.CPUMeter is one method). A real service hands the engine
// cpuusage.Start()'s Meter instead, which reads its container's cgroup:
//
//	meter, err := cpuusage.Start()
//	...
//	defer meter.Close()
//	eng, err := flow.New(flow.WithCPU(meter))
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leapflow/leapflow/flow"
)

const (
	workers = 8
	service = 10 * time.Millisecond
)

func main() {
	d := flag.Duration("d", 3*time.Second, "how long each run lasts")
	flag.Parse()
	if err := run(os.Stdout, *d); err != nil {
		log.Fatal(err)
	}
}

func run(out io.Writer, d time.Duration) error {
	fmt.Fprintf(out, "%-24s %10s %8s %8s %8s\n", "3x overload", "goodput/s", "p50", "p99", "shed")
	for _, bbr := range []bool{false, true} {
		s := newService()
		eng, err := flow.New(flow.WithCPU(s))
		if err != nil {
			return err
		}
		name := "no rule"
		if bbr {
			name = "SystemBBR at 0.8"
			if err := eng.LoadRules([]flow.Rule{{Resource: "inbound", System: flow.SystemBBR, Threshold: 0.8}}); err != nil {
				return err
			}
		}
		r := s.load(eng, 3*workers*float64(time.Second/service), d)
		fmt.Fprintf(out, "%-24s %10.0f %8v %8v %8d\n", name, r.goodput, r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.shed)
	}
	return nil
}

// svc is the service: workers slots, and the busy time its sampler turns
// into a CPU usage.
type svc struct {
	slots chan struct{}
	busy  atomic.Int64 // workers busy now
	usage atomic.Uint64
}

func newService() *svc { return &svc{slots: make(chan struct{}, workers)} }

// CPUUsage is the share of the workers busy over the last 50 ms
// (flow.CPUMeter).
func (s *svc) CPUUsage() float64 { return math.Float64frombits(s.usage.Load()) }

// sample measures the busy share every millisecond and publishes its
// average every 50 ms, until stop is closed.
func (s *svc) sample(stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	t := time.NewTicker(time.Millisecond)
	defer t.Stop()
	var sum, n float64
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			sum += float64(s.busy.Load()) / workers
			if n++; n == 50 {
				s.usage.Store(math.Float64bits(sum / n))
				sum, n = 0, 0
			}
		}
	}
}

// result is one run's figures.
type result struct {
	goodput  float64
	p50, p99 time.Duration
	shed     int
}

// warm is how long each run first sends at half the capacity, unmeasured:
// the service's history, which the rule estimates from.
const warm = time.Second

// load sends, after warm, rate requests a second for d, in batches every
// millisecond, each through eng's resource "inbound" and then to a
// worker; it waits for every admitted request to complete.
func (s *svc) load(eng *flow.Engine, rate float64, d time.Duration) result {
	stop := make(chan struct{})
	var sampler, reqs sync.WaitGroup
	sampler.Add(1)
	go s.sample(stop, &sampler)
	var (
		mu        sync.Mutex
		latencies []time.Duration
		shed      int
		completed atomic.Int64
	)
	start := time.Now()
	sent := 0.0
	half := workers * float64(time.Second/service) / 2
	for tick := time.NewTicker(time.Millisecond); time.Since(start) < warm+d; <-tick.C {
		el := time.Since(start)
		due := half*min(el, warm).Seconds() + rate*max(el-warm, 0).Seconds()
		for ; sent < due; sent++ {
			measured := el >= warm
			en, err := eng.Entry("inbound")
			if err != nil {
				if measured {
					shed++
				}
				continue
			}
			reqs.Add(1)
			go func(arrived time.Time) {
				defer reqs.Done()
				s.slots <- struct{}{} // wait for a worker
				s.busy.Add(1)
				time.Sleep(service)
				s.busy.Add(-1)
				<-s.slots
				en.Exit(nil)
				if el := time.Since(start); el >= warm && el <= warm+d {
					completed.Add(1)
				}
				if measured {
					mu.Lock()
					latencies = append(latencies, time.Since(arrived))
					mu.Unlock()
				}
			}(time.Now())
		}
	}
	reqs.Wait()
	close(stop)
	sampler.Wait()
	slices.Sort(latencies)
	r := result{goodput: float64(completed.Load()) / d.Seconds(), shed: shed}
	if n := len(latencies); n > 0 {
		r.p50, r.p99 = latencies[n/2], latencies[n*99/100]
	}
	return r
}
