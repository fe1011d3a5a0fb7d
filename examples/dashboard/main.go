// Command dashboard runs a demo service with simulated traffic behind
// leapflow and serves the live dashboard: bursts on "checkout", a slow
// "report" limited to 2 in flight, "search" failing now and then,
// "export", blocked by a rule of 0, "api" limited per user with one
// client far over its limit, and "payments", whose dependency fails in
// spells that trip its circuit breaker. It prints where the dashboard
// listens and runs until interrupted.
//
//	go run ./examples/dashboard [-addr 127.0.0.1:8080]
//	go run ./examples/dashboard -screenshot docs/dashboard.png   # needs Chromium
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/leapflow/leapflow/dashboard"
	"github.com/leapflow/leapflow/flow"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address the dashboard listens on")
	shot := flag.String("screenshot", "", "write a screenshot of the dashboard to this PNG file after a few seconds, then exit")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *addr, *shot, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

var rules = []flow.Rule{
	{ID: "checkout-qps", Resource: "checkout", Threshold: 40},
	{ID: "report-slots", Resource: "report", Metric: flow.Concurrency, Threshold: 2},
	{ID: "search-qps", Resource: "search", Threshold: 200},
	{ID: "export-off", Resource: "export", Threshold: 0},
	{ID: "per-user", Resource: "api", PerKey: true, Threshold: 10},
	{ID: "payments-breaker", Resource: "payments", Breaker: flow.ErrorRatio, Threshold: 0.5, MinRequests: 10, RetryTimeout: 3 * time.Second},
}

// run serves the dashboard until ctx ends (or, with shot, until the
// screenshot is written).
func run(ctx context.Context, addr, shot string, out io.Writer) error {
	eng, err := flow.New()
	if err != nil {
		return err
	}
	if err := eng.LoadRules(rules); err != nil {
		return err
	}
	defer eng.Feed().Close()
	h, err := dashboard.New(eng)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	url := "http://" + lis.Addr().String() + "/"
	fmt.Fprintf(out, "dashboard on %s\n", url)

	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var wg sync.WaitGroup
	simulate(trafficCtx, eng, &wg)
	defer func() {
		stopTraffic()
		wg.Wait()
		shut, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(shut) // the page's stream may hold on: closed below
		_ = srv.Close()
	}()
	if shot != "" {
		return screenshot(ctx, url, shot, out)
	}
	<-ctx.Done()
	return nil
}

// simulate sends the demo's traffic until ctx ends.
func simulate(ctx context.Context, eng *flow.Engine, wg *sync.WaitGroup) {
	every := func(d time.Duration, fn func(tick int)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(d)
			defer t.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					fn(i)
				}
			}
		}()
	}
	call := func(res string, rt time.Duration, fail bool) {
		en, err := eng.Entry(res)
		if err != nil {
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(rt):
			case <-ctx.Done():
			}
			var e error
			if fail {
				e = errors.New("demo failure")
			}
			en.Exit(e)
		}()
	}
	every(20*time.Millisecond, func(i int) { // checkout: a burst every 5 s
		n := 1
		if i%250 < 50 {
			n = 3
		}
		for range n {
			call("checkout", time.Duration(5+rand.IntN(10))*time.Millisecond, false)
		}
	})
	every(100*time.Millisecond, func(int) { call("report", 700*time.Millisecond, false) })
	every(10*time.Millisecond, func(int) { call("search", time.Duration(1+rand.IntN(4))*time.Millisecond, rand.IntN(10) == 0) })
	every(200*time.Millisecond, func(int) { call("export", time.Millisecond, false) })
	keyed := func(key string, rt time.Duration) {
		if en, err := eng.Entry("api", flow.WithKey(key)); err == nil {
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-time.After(rt):
				case <-ctx.Done():
				}
				en.Exit(nil)
			}()
		}
	}
	every(5*time.Millisecond, func(int) { // 40 users within their 10 a second, one scraper at 200
		keyed(fmt.Sprintf("user-%02d", rand.IntN(40)), time.Duration(2+rand.IntN(6))*time.Millisecond)
		keyed("scraper-7f3a", time.Millisecond)
	})
	every(25*time.Millisecond, func(i int) { // the dependency fails for 4 s in every 15
		call("payments", time.Duration(8+rand.IntN(8))*time.Millisecond, i%600 >= 400 && i%600 < 560)
	})
}

// screenshot opens the dashboard in headless Chromium, selects the
// checkout row, and writes the page to path.
func screenshot(ctx context.Context, url, path string, out io.Writer) error {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		return fmt.Errorf("the screenshot needs Debian's package chromium: %w", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox,
		chromedp.WindowSize(1400, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	if err := chromedp.Do(bctx, chromedp.Navigate(url)); err != nil {
		return err
	}
	time.Sleep(4 * time.Second) // a few completed seconds
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[any](`document.querySelector('tr[data-resource="checkout"] td.name').click()`)); err != nil {
		return err
	}
	time.Sleep(20 * time.Second)                                 // the sparklines and charts fill, the breaker trips
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %s\n", path)
	return nil
}
