package dashboard

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// hostile is a resource name that would run script if it were markup.
const hostile = `<img src=x onerror="window.pwned=1"><script>window.pwned=2</script>`

// browser starts headless Chromium (Debian's package chromium; make test
// installs it) and returns a chromedp context on it and a function that
// closes the browser (call it before closing a server it streams from). It
// fails, never skips, when the browser is missing.
func browser(t *testing.T) (context.Context, func()) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("headless Chromium is needed: install Debian's package chromium (make deps does): %v", err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // CI runs as root
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1200, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 90*time.Second)
	closeAll := func() {
		cancelTimeout()
		cancel()
		cancelAlloc()
	}
	t.Cleanup(closeAll)
	return ctx, closeAll
}

// TestPageInABrowser: in a real browser the page loads, lists the
// resources, its numbers change as traffic changes, and a hostile resource
// name shows as text and runs nothing.
func TestPageInABrowser(t *testing.T) {
	eng, err := flow.New(flow.WithCPU(cpuAt(0.95)))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "api-limit", Resource: "api", Threshold: 1000},
		{ID: "api-shed", Resource: "api", System: flow.SystemBBR, Threshold: 0.8},
		{ID: "typo", Resource: "GET /itemz", Threshold: 10},
		{ID: "dep-breaker", Resource: "dep", Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: time.Hour}}))
	t.Cleanup(eng.Feed().Close)
	h, err := New(eng, WithToken("t0ken"))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	// Traffic that grows every 100 ms, so each second's count differs.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, res := range []string{"api", hostile, "http" + flow.CatchAllSuffix} {
				for range i {
					if en, err := eng.Entry(res); err == nil {
						en.Exit(nil)
					}
				}
			}
		}
	}()
	defer func() {
		close(stop)
		wg.Wait()
	}()

	ctx, closeBrowser := browser(t)
	defer closeBrowser() // before the server closes: the page holds a stream open
	apiPass := `document.querySelector('tr[data-resource="api"] td.pass')`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/?token=t0ken")))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](apiPass+` !== null && `+apiPass+`.textContent !== "0"`,
		chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the api row shows traffic")
	first, err := chromedp.Run(ctx, chromedp.Evaluate[string](apiPass+`.textContent`))
	require.NoError(t, err)
	// Real time, as an exception to the 100 ms rule: a real browser reads
	// a real server's stream, which delivers each whole second as it ends;
	// three seconds see at least two deliveries.
	time.Sleep(3 * time.Second)
	second, err := chromedp.Run(ctx, chromedp.Evaluate[string](apiPass+`.textContent`))
	require.NoError(t, err)
	status, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#status`)))
	require.NoError(t, err)
	hostileText, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`[...document.querySelectorAll('td.name')].map(td => td.textContent).find(s => s.startsWith('<img')) || ''`))
	require.NoError(t, err)
	scripts, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.scripts.length`))
	require.NoError(t, err)
	pwned, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.pwned || 0`))
	require.NoError(t, err)
	a, err := strconv.Atoi(first)
	require.NoError(t, err)
	b, err := strconv.Atoi(second)
	require.NoError(t, err)
	assert.Greater(t, b, a, "the numbers follow the traffic")
	assert.Equal(t, "live", status)
	assert.Equal(t, hostile, hostileText, "the name shows as text")
	assert.Equal(t, 1, scripts, "no script but the page's own")
	assert.Zero(t, pwned)

	// A rule whose resource sees nothing while requests go unmatched gets
	// a badge once it has been in force 10 s (real time: a real server).
	badge := func(res string) string {
		return `document.querySelector('tr[data-resource="` + res + `"] .badge.unreached')`
	}
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](badge("GET /itemz")+` !== null`, chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the unreached rule's row has its badge")
	apiBadge, err := chromedp.Run(ctx, chromedp.Evaluate[bool](badge("api")+` !== null`))
	require.NoError(t, err)
	assert.False(t, apiBadge, "a rule with traffic has none")

	// A resource with a circuit breaker has a badge of its state, which
	// turns when the breaker trips.
	breaker := `document.querySelector('tr[data-resource="dep"] .badge.breaker')`
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](breaker+` !== null`, chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the breaker's badge")
	closed, err := chromedp.Run(ctx, chromedp.Evaluate[string](breaker+`.textContent`))
	require.NoError(t, err)
	assert.Regexp(t, `^breaker closed since \d\d:\d\d:\d\d$`, closed, "its state, since the rule was loaded")
	apiBreaker, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		`document.querySelector('tr[data-resource="api"] .badge.breaker') !== null`))
	require.NoError(t, err)
	assert.False(t, apiBreaker, "a resource without a breaker has no breaker badge")
	en, err := eng.Entry("dep")
	require.NoError(t, err)
	en.Exit(errors.New("dependency down"))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](breaker+` !== null && `+breaker+`.textContent.startsWith("breaker open")`,
		chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the badge turns when the breaker trips")
	openText, err := chromedp.Run(ctx, chromedp.Evaluate[string](breaker+`.textContent`))
	require.NoError(t, err)
	assert.Regexp(t, `^breaker open since \d\d:\d\d:\d\d$`, openText, "with its last transition")
	open, err := chromedp.Run(ctx, chromedp.Evaluate[string](breaker+`.className`))
	require.NoError(t, err)
	assert.Equal(t, "badge breaker open", open)

	// A resource with system rules shows the CPU reading and the BBR
	// estimate, shedding: the CPU reads 95%, over the rule's 80%.
	system, err := chromedp.Run(ctx, chromedp.Evaluate[string](
		`(document.querySelector('tr[data-resource="api"] .badge.system') || {}).className || ''`))
	require.NoError(t, err)
	assert.Equal(t, "badge system shedding", system)
	text, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('tr[data-resource="api"] .badge.system').textContent`))
	require.NoError(t, err)
	assert.Regexp(t, `^CPU 95% · limit \d+$`, text)
}

// reloads is a Reloader a test sets.
type reloads struct{ n int64 }

func (r *reloads) Reloads() int64   { return r.n }
func (r *reloads) LastError() error { return nil }

// TestChartsSparklinesKeysAndSearchInABrowser: after a minute of
// fake-clock traffic, a dashboard made then shows, in a real browser, a
// sparkline on each row, a resource's charts of that whole minute (60
// points) on a time axis of wall-clock labels with units, the per-key
// rule's most refused key, the rule source's reloads, and finds one
// resource of 1,000 by the search box.
func TestChartsSparklinesKeysAndSearchInABrowser(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(2000))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{ID: "per-user", Resource: "api", PerKey: true, Threshold: 50}}))
	t.Cleanup(eng.Feed().Close)
	for sec := 13; sec < 73; sec++ { // the minute the engine holds at 74 s: [13 s, 73 s)
		clock.Set(time.Duration(sec)*time.Second + 100*time.Millisecond)
		for i := range 300 + sec%5*20 { // 50 admitted a second, a varying rest refused
			key := "attacker"
			if i%4 == 0 {
				key = fmt.Sprint("user-", i%40)
			}
			if en, err := eng.Entry("api", flow.WithKey(key)); err == nil {
				clock.Advance(time.Microsecond)
				en.Exit(nil)
			}
		}
		if sec == 40 {
			for i := range 1000 {
				if en, err := eng.Entry(fmt.Sprintf("svc-%04d", i)); err == nil {
					en.Exit(nil)
				}
			}
		}
	}
	clock.Set(74 * time.Second)
	eng.Feed().Poll()
	h, err := New(eng, WithReloads(&reloads{n: 3})) // made now: the minute the engine holds fills the charts
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()

	ctx, closeBrowser := browser(t)
	defer closeBrowser()
	row := `document.querySelector('tr[data-resource="api"]')`
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(srv.URL+"/")))
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](row+` !== null`, chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "the api row")

	// The sparkline: pass and block, 60 points each, not flat.
	spark, err := chromedp.Run(ctx, chromedp.Evaluate[[]int](`[...document.querySelectorAll('tr[data-resource="api"] svg.spark polyline')].map(p => p.points.numberOfItems)`))
	require.NoError(t, err)
	assert.Equal(t, []int{60, 60}, spark)
	flat, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`new Set([...document.querySelector('tr[data-resource="api"] svg.spark polyline.series-block').points].map(p => p.y)).size === 1`))
	require.NoError(t, err)
	assert.False(t, flat, "the blocks of the minute show")

	// The charts: a click, then 60 points on a time axis, with units.
	_, err = chromedp.Run(ctx, chromedp.Click(chromedp.CSS(`tr[data-resource="api"] td.name`)))
	require.NoError(t, err)
	pass := `document.querySelector('#traffic-chart polyline[data-series="pass"]')`
	_, err = chromedp.Run(ctx, chromedp.Poll[bool](pass+` !== null && `+pass+`.dataset.points === "60"`, chromedp.WithPollingTimeout(20*time.Second)))
	require.NoError(t, err, "a minute of seconds, from the start")
	labels, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#traffic-chart text.tick.x')].map(t => t.textContent)`))
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(labels), 3, "a labelled time axis")
	for _, l := range labels {
		assert.Regexp(t, `^\d\d:\d\d:\d\d$`, l, "wall-clock times")
	}
	units, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('svg.chart text.unit')].map(t => t.textContent)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"requests/s", "ms"}, units)
	rt, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#rt-chart polyline')].map(p => p.dataset.series + ":" + p.dataset.points)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"avgRT:60", "minRT:60"}, rt)
	legends, err := chromedp.Run(ctx, chromedp.Evaluate[string](`[...document.querySelectorAll('figcaption')].map(f => f.textContent).join(" | ")`))
	require.NoError(t, err)
	assert.Equal(t, "Requests per second pass block exception | Response time, ms average minimum", legends)

	// The per-key rule's busiest keys.
	refused, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(document.querySelector('.keyrule[data-rule="per-user"] table.refused td.key') || {}).textContent || ''`))
	require.NoError(t, err)
	assert.Equal(t, "attacker", refused)
	tracked, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('.keyrule[data-rule="per-user"] p').textContent`))
	require.NoError(t, err)
	assert.Regexp(t, `^11 of \d+ keys tracked`, tracked, "the attacker and ten users")
	reload, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#reload`)))
	require.NoError(t, err)
	assert.Regexp(t, `^rules reloaded 3 times`, reload)

	// 1,001 resources, 50 to a page; the search box finds one.
	count, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#resources tbody tr').length`))
	require.NoError(t, err)
	assert.Equal(t, 50, count, "a page")
	_, err = chromedp.Run(ctx, chromedp.SendKeys(chromedp.CSS(`#search`), "svc-0777"))
	require.NoError(t, err)
	found, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#resources tbody tr')].map(tr => tr.dataset.resource)`))
	require.NoError(t, err)
	assert.Equal(t, []string{"svc-0777"}, found)
	info, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`#count`)))
	require.NoError(t, err)
	assert.Equal(t, "1 of 1001 resources", info)
}
