package flow

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/internal/cpu"
	"github.com/leapflow/leapflow/internal/names"
	"github.com/leapflow/leapflow/internal/stats"
	"github.com/leapflow/leapflow/metric"
)

// CPUMeter reads the CPU usage a system rule checks: the share of the CPU
// the process may use that it used lately, in [0, 1] (a container's
// share under its CPU limit, for example; the cpuusage package reads it
// from Linux's cgroups). The engine reads it at most once per refresh of
// its system rules' verdict (every 1 ms or so while requests come), never
// on a request's own path: a meter returns a value it keeps, read in the
// background.
type CPUMeter interface {
	CPUUsage() float64
}

// WithCPU gives the engine the CPU reading that SystemCPU and SystemBBR
// rules check; an engine without one refuses those rules. The engine
// starts nothing: a meter that samples in the background is started and
// stopped by its owner (cpuusage.Start, and its Close).
func WithCPU(m CPUMeter) Option {
	return func(c *config) { c.cpu = m }
}

// The system rules' timing: how long their verdict holds at most, and how
// long a SystemBBR rule keeps checking after
// the CPU usage fell below its threshold (so that the backlog the hot
// spell left drains before everything is admitted again).
const (
	systemRefresh = int64(time.Millisecond)
	systemCooling = int64(time.Second)
	// cpuRetry is the retry hint of a SystemCPU refusal: about two
	// readings of a meter that samples every 100 ms.
	cpuRetry = 200 * time.Millisecond
)

var systemKind = kind{
	is:       func(r *Rule) bool { return r.System != NotSystem },
	validate: validateSystem,
	compile:  compileSystem,
	describe: func(r *Rule) string {
		if r.System == SystemRT {
			return " SystemRT over " + r.MaxRT.String()
		}
		return " " + r.System.String() + " over CPU " + strconv.FormatFloat(r.Threshold, 'g', -1, 64)
	},
}

// validateSystem checks a system rule (r has its defaults); the engine
// checks that it has the CPU meter the rule needs (normalise).
func validateSystem(r *Rule, i int) error {
	if r.System == NotSystem {
		return nil
	}
	bad := func(field string, value any, reason string) error { return r.errorf(i, field, value, reason) }
	switch {
	case r.System > SystemBBR:
		return bad("System", r.System, "must be SystemCPU, SystemBBR or SystemRT")
	case r.Metric != QPS || r.Behavior != Reject:
		return bad("System", r.System, "is for rules of Metric QPS and Behavior Reject")
	case r.Global || r.PerKey || r.RelatedResource != "" || r.SpanExact || r.DryRun || r.Breaker != NotBreaker:
		return bad("System", r.System, "is not for Global, PerKey, related, span-exact, dry-run or breaker rules")
	case r.StatInterval != defaultStatInterval:
		return bad("StatInterval", r.StatInterval, "must be 1s (or left zero) for a system rule: it reads the resource's second window")
	case r.System == SystemRT:
		if r.MaxRT <= 0 || r.MaxRT > maxBreakerTimeout {
			return bad("MaxRT", r.MaxRT, fmt.Sprintf("must be in (0, %v]: the average RT over which a SystemRT rule refuses", maxBreakerTimeout))
		}
		if r.Threshold != 0 {
			return bad("Threshold", r.Threshold, "is not used by a SystemRT rule (MaxRT is its limit): leave it 0")
		}
	case !(r.Threshold > 0 && r.Threshold < 1):
		return bad("Threshold", r.Threshold, "must be a CPU usage in (0, 1) for a "+r.System.String()+" rule: it acts over it")
	}
	return nil
}

// systemGuard is a resource's system rules and the verdict they share:
// refreshed by the first request after it is due (one compare-and-swap
// elects it), read by every other request in two loads.
type systemGuard struct {
	// next is the engine time the verdict is due for a refresh; verdict
	// is 0 (admit) or the index + 1 of the rule that refuses.
	next    atomic.Int64
	verdict atomic.Int64
	_       [cpu.CacheLine - 16]byte
	// What the last refresh read, for Engine.Systems and the refusals:
	// the CPU usage (float64 bits), the requests in flight, the BBR
	// estimate of how many may be (max completions per second times min
	// RT, at least 1), and the average RT (ns).
	cpuBits  atomic.Uint64
	inflight atomic.Int64
	limit    atomic.Int64
	avgRT    atomic.Int64
	minRT    atomic.Int64
	// shedding says a SystemBBR rule checks requests (its CPU usage is
	// over its threshold, or was in the last second).
	shedding atomic.Bool
	rules    []systemRule
	node     *stats.Node
	meter    CPUMeter
}

// systemRule is one system rule of a guard; hotAt is, for a SystemBBR
// rule, the last time the CPU usage was over its threshold (engine ns).
type systemRule struct {
	check     SystemCheck
	threshold float64
	maxRT     int64
	be        *BlockError
	hotAt     *atomic.Int64
}

// neverHot is a hotAt long before any engine time.
const neverHot = math.MinInt64 / 2

// compileSystem adds a system rule to its resource's guard.
func compileSystem(c *compiling) {
	rr, r := c.rr, c.r
	if rr.system == nil {
		rr.system = &systemGuard{node: rr.node, meter: c.e.cpu}
	}
	// A SystemBBR rule of the same threshold in the set before keeps its
	// hot reading: a reload does not end its cooling.
	hot := new(atomic.Int64)
	hot.Store(neverHot)
	if old := c.old.byResource[r.Resource]; old != nil && old.system != nil && r.System == SystemBBR {
		for _, o := range old.system.rules {
			if o.check == SystemBBR && o.threshold == r.Threshold {
				hot = o.hotAt
				break
			}
		}
	}
	be := newBlockError(r, ReasonSystem)
	what := map[SystemCheck]string{SystemCPU: fmt.Sprintf("CPU usage over %g", r.Threshold), SystemRT: "average RT over " + r.MaxRT.String(),
		SystemBBR: fmt.Sprintf("CPU usage over %g, and as many in flight as it completes", r.Threshold)}[r.System]
	be.msg = fmt.Sprintf("flow: %s blocked by rule %s (%s: %s)", names.Abbrev(r.Resource), names.Abbrev(r.Name()), r.System, what)
	rr.system.rules = append(rr.system.rules, systemRule{check: r.System, threshold: r.Threshold, maxRT: int64(r.MaxRT), be: be, hotAt: hot})
}

// admits reports whether the resource's system rules admit a request at
// now, or which of them refuses it.
func (g *systemGuard) admits(now int64) (int, bool) {
	if now >= g.next.Load() {
		g.refresh(now)
	}
	v := g.verdict.Load()
	return int(v - 1), v == 0
}

// refresh computes the verdict at now, if this caller is the one to.
func (g *systemGuard) refresh(now int64) {
	due := g.next.Load()
	if now < due || !g.next.CompareAndSwap(due, now+systemRefresh) {
		return // another request refreshes it
	}
	var usage float64
	if g.meter != nil {
		// A reading out of [0, 1] (NaN, a meter's error) is clamped: NaN
		// reads as 0, cool.
		if u := g.meter.CPUUsage(); u > 0 {
			usage = min(u, 1)
		}
	}
	w := g.node.Second()
	inflight := g.node.Inflight()
	// The least RT is at least 1 ms, as Kratos has it: a clock too coarse
	// to see a faster request reads 0, which would refuse everything.
	minRT, _ := w.MinRT(now)
	minRT = max(minRT, int64(time.Millisecond))
	// At least 1, as Sentinel and Kratos have it: a service that
	// completed nothing in the last second while hot (stalled, or not
	// started) admits a request while at most one is in flight.
	est := max(w.MaxRate(now, metric.Success)*float64(minRT)/float64(time.Second), 1)
	limit := int64(math.Ceil(est))
	avg := int64(w.AvgRT(now))
	g.cpuBits.Store(math.Float64bits(usage))
	g.inflight.Store(inflight)
	g.limit.Store(limit)
	g.avgRT.Store(avg)
	g.minRT.Store(minRT)
	verdict, shedding := int64(0), false
	for i := range g.rules {
		r := &g.rules[i]
		refuse := false
		switch r.check {
		case SystemCPU:
			refuse = usage > r.threshold
		case SystemRT:
			refuse = avg > r.maxRT
		case SystemBBR:
			if usage > r.threshold {
				r.hotAt.Store(now)
			}
			if now-r.hotAt.Load() < systemCooling {
				shedding = true
				// Refused past the estimate, as Sentinel and Kratos
				// compare: the request is admitted while no more are in
				// flight before it than the estimate.
				refuse = float64(inflight) > est
			}
		}
		if refuse && verdict == 0 {
			verdict = int64(i + 1)
		}
	}
	// The verdict before the next refresh is due: no later refresh can
	// store its verdict before this one's.
	g.shedding.Store(shedding)
	g.verdict.Store(verdict)
	if shedding {
		// While shedding, the verdict follows the requests in flight
		// closely: an admitting one holds for a quarter of the least RT
		// (at most 1 ms), a SystemBBR rule's refusal for 1/32 of it (a
		// completion makes room for the next request soon).
		period := minRT / 4
		if verdict != 0 && g.rules[verdict-1].check == SystemBBR {
			period = minRT / 32
		}
		g.next.Store(now + min(systemRefresh, period))
	}
}

// refusal is what a refusal by rule i carries: what it saw, and when to
// retry (a BBR rule: the fastest completion, when one in flight makes
// room; a CPU rule: cpuRetry; an RT rule: a bucket of the window, when its
// oldest completions leave it).
func (g *systemGuard) refusal(i int) refusal {
	r := &g.rules[i]
	var seen float64
	var retry int64
	switch r.check {
	case SystemCPU:
		seen, retry = math.Float64frombits(g.cpuBits.Load()), int64(cpuRetry)
	case SystemRT:
		seen, retry = float64(g.avgRT.Load())/1e6, g.node.Second().BucketLen()
	default:
		seen, retry = float64(g.inflight.Load()), min(max(g.minRT.Load(), int64(time.Millisecond)), int64(time.Second))
	}
	return refusal{r.be, seen, room{retry, retry}, i}
}

// refuseSystem counts a request rr's system rules refused (rule i) and
// returns its Entry.
func (e *Engine) refuseSystem(rr *resourceRules, p int, now, n int64, i int) (Entry, error) {
	rf := rr.system.refusal(i)
	if rr.rateRules > 0 && rr.rules > 1 {
		// As block tells a refusal of the general path: when the rate
		// rules after it would admit the request too.
		q := request{n: n}
		rf.rm.retry = rr.laterRetry(stageSystem, now, &q, rf.rm.retry, true)
	}
	e.count(rr.node, p, now, metric.Block, n)
	return blocked(rf.be, rf.seen, rf.rm)
}

// SystemStatus is what a resource's system rules read at their last
// refresh, as Engine.Systems returns it.
type SystemStatus struct {
	// Resource is the resource the rules guard; Rules are its system
	// rules, in load order.
	Resource string
	Rules    []Rule
	// CPU is the CPU usage read (0 without a meter).
	CPU float64
	// Inflight is the requests in flight; Limit the BBR estimate of how
	// many may be (its most completions per second in a bucket of the
	// resource's second window, times its least RT; at least 1: a service
	// that completed nothing in the last second admits one in flight);
	// AvgRT the average RT over the second window.
	Inflight, Limit int64
	AvgRT           time.Duration
	// Shedding says whether a SystemBBR rule is checking (the CPU usage
	// is over its threshold, or was in the last second); Refusing
	// whether the verdict in force refuses requests.
	Shedding, Refusing bool
}

// Systems returns, for each resource with system rules (Rule.System), in
// load order, what its rules read at their last refresh (refreshed now if
// no request did in the last millisecond).
func (e *Engine) Systems() []SystemStatus {
	set := e.ruleSet()
	now := e.now()
	var out []SystemStatus
	at := map[*systemGuard]int{} // a guard's status in out
	for i := range set.rules {
		r := &set.rules[i]
		rr := set.byResource[r.Resource]
		if r.System == NotSystem || rr == nil || rr.system == nil {
			continue
		}
		g := rr.system
		k, ok := at[g]
		if !ok {
			g.refresh(now)
			k, at[g] = len(out), len(out)
			out = append(out, SystemStatus{Resource: r.Resource, CPU: math.Float64frombits(g.cpuBits.Load()), Inflight: g.inflight.Load(),
				Limit: g.limit.Load(), AvgRT: time.Duration(g.avgRT.Load()), Shedding: g.shedding.Load(), Refusing: g.verdict.Load() != 0})
		}
		out[k].Rules = append(out[k].Rules, *r)
	}
	return out
}
