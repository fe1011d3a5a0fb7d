package main

import (
	"fmt"
	"os/exec"
	"sync"
	"time"

	"go.uber.org/atomic"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/global"
	"github.com/leapflow/leapflow/global/redistest"
)

// globalResult is one cell of the global-limit table.
type globalResult struct {
	impl       string
	goroutines int
	nsPerOp    float64
	callsPerOp float64
}

// globalAccuracy is what several instances admitted on one global rule.
type globalAccuracy struct {
	instances int
	threshold int64
	admitted  int64
	fullest   int64 // the fullest server window
	calls     int64
	fallbacks int64
}

// globalSection runs the global-limit measurements against a redis-server
// it starts itself; it returns a note instead when there is none.
func globalSection(cfg config, tick func(string)) ([]globalResult, *globalAccuracy, string) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, nil, "skipped: redis-server not found (make test installs it from Debian's packages)"
	}
	srv, err := redistest.Launch()
	if err != nil {
		return nil, nil, "skipped: " + err.Error()
	}
	defer srv.Stop()
	var out []globalResult
	for _, im := range []struct {
		name  string
		batch int64 // 0: local rule
	}{{"local", 0}, {"global, leasing", 100_000}, {"global, no leasing", 1}} {
		for _, g := range cfg.goroutines {
			tick(fmt.Sprintf("global %s g=%d", im.name, g))
			client := srv.Client()
			var src *global.Source
			opts := []flow.Option{}
			rule := flow.Rule{Resource: "api", Threshold: hugeLimit}
			if im.batch > 0 {
				src, err = global.New(client, global.WithMaxBatch(im.batch))
				if err != nil {
					panic(err)
				}
				opts = append(opts, flow.WithTokenSource(src))
				rule.ID, rule.Global, rule.Fallback = fmt.Sprintf("bench-%s-%d-%d", im.name, g, time.Now().UnixNano()), true, flow.FallbackClosed
			}
			eng, err := flow.New(opts...)
			if err != nil {
				panic(err)
			}
			if err := eng.LoadRules([]flow.Rule{rule}); err != nil {
				panic(err)
			}
			h, err := eng.Resource("api")
			if err != nil {
				panic(err)
			}
			ns, _, ops := measure(func(int, int) {
				if en, err := h.Entry(); err == nil {
					en.Exit(nil)
				}
			}, g, cfg.duration)
			r := globalResult{impl: im.name, goroutines: g, nsPerOp: ns}
			if src != nil && ops > 0 {
				r.callsPerOp = float64(src.Stats().Calls) / float64(ops)
			}
			out = append(out, r)
			client.Close()
		}
	}
	tick("global accuracy")
	acc := globalHammer(srv, cfg)
	return out, acc, ""
}

// globalHammer runs four instances (engines with their own clients) on one
// global rule and reads every server window from the sources' audit hook.
func globalHammer(srv *redistest.Server, cfg config) *globalAccuracy {
	const instances = 4
	acc := &globalAccuracy{instances: instances, threshold: cfg.threshold}
	audit := global.NewAudit()
	var admitted atomic.Int64
	var sources []*global.Source
	var engs []*flow.Engine
	key := fmt.Sprintf("accuracy-%d", time.Now().UnixNano())
	deadline := time.Now().Add(cfg.accDuration)
	var wg sync.WaitGroup
	for range instances {
		client := srv.Client()
		defer client.Close()
		src, err := global.New(client, global.WithOnAdmit(audit.Record))
		if err != nil {
			panic(err)
		}
		sources = append(sources, src)
		eng, err := flow.New(flow.WithTokenSource(src))
		if err != nil {
			panic(err)
		}
		if err := eng.LoadRules([]flow.Rule{{ID: key, Resource: "api", Threshold: float64(cfg.threshold), Global: true, Fallback: flow.FallbackClosed}}); err != nil {
			panic(err)
		}
		engs = append(engs, eng)
		for range cfg.accG / instances {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					if en, err := eng.Entry("api"); err == nil {
						admitted.Inc()
						en.Exit(nil)
					}
				}
			}()
		}
	}
	wg.Wait()
	acc.admitted = admitted.Load()
	acc.fullest = audit.Fullest(time.Second)
	for _, s := range sources {
		acc.calls += s.Stats().Calls
	}
	for _, e := range engs {
		snap, _ := e.Snapshot("api")
		acc.fallbacks += snap.Fallbacks
	}
	return acc
}
