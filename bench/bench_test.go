package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/global/redistest"
	"github.com/leapflow/leapflow/internal/hammer"
)

// TestQuickRun runs the main job end to end with -quick and checks the
// report's structure, not its speeds.
func TestQuickRun(t *testing.T) {
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-quick", "-progress=false", "-out", out, "-threshold", "200"}, io.Discard)
	require.NoError(t, err)
	var stdout bytes.Buffer
	require.NoError(t, run(cfg, &stdout, io.Discard))

	text := stdout.String()
	for _, want := range []string{"Throughput, one hot resource", "Throughput, 1000 resources", "Accuracy: threshold 200", "Memory: bytes per limiter", "Saturated CPU:"} {
		assert.Contains(t, text, want)
	}
	md, err := os.ReadFile(filepath.Join(out, "report.md"))
	require.NoError(t, err)
	for _, want := range []string{"# leapflow bench report", "## Throughput", "### one hot resource", "### 1000 resources", "## Accuracy", "## Memory", "![accuracy](accuracy.svg)",
		"## Global limit on Redis", "| global, leasing |", "the fullest server window held", "## Saturated CPU", "| default (coarse) | 256 |",
		"## Precision against buckets", "| 10 | span-exact |",
		"## Global GCRA on Redis: leapflow and redis_rate", "| leapflow global GCRA | 1 |", "| redis_rate v10 | 1 |", "most in 1 s (server)",
		"## What each rule kind costs", "| QPS Reject, 16 windows |", "| Global (stub source) |",
		"## Per-key limits", "| leapflow | zipf over 10000 keys |", "| map+x/time/rate | uniform over 50000 keys |", "most in its own windows"} {
		assert.Contains(t, string(md), want)
	}
	for _, im := range impls {
		assert.Contains(t, string(md), "| "+im.name+" |", "throughput row")
	}
	assertMarkdownTables(t, string(md))
	assert.Regexp(t, `g=256 {2,}allocs/op`, text, "the per-key table's last columns stand apart")
	for _, l := range keyLimiters {
		assert.Contains(t, text, l.name+": "+l.config(hugeKeyRate), "the peer's configuration is printed")
		assert.Contains(t, string(md), l.config(hugeKeyRate), "the peer's configuration is in the report")
	}
	assert.Regexp(t, `Wall time \d`, text)
	for _, l := range accLimiters {
		for _, sc := range []string{"boundary", "greedy", "hammer"} {
			assert.Contains(t, string(md), fmt.Sprintf("| %s | %s |", l.name, sc))
		}
	}
	for _, name := range []string{"throughput-1.svg", "throughput-1000.svg", "accuracy.svg"} {
		data, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err)
		assertWellFormedSVG(t, name, data)
	}
}

// The global-load section, run by name, prints its four tables.
func TestGlobalLoadSection(t *testing.T) {
	cfg, err := parseFlags([]string{"-quick", "-only", "global-load"}, io.Discard)
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, runOnly(cfg, &out))
	for _, want := range []string{"Below the limit", "Random arrivals against the oracle", "Entry latency with Redis far away", "Saturated CPU, healthy Redis"} {
		assert.Contains(t, out.String(), want)
	}
	assert.Regexp(t, `poisson +1000 +4 `, out.String())
	assert.Regexp(t, `20ms +\d`, out.String())
}

// Every rule kind's row of the section admits every request and allocates
// nothing per request (the measure's own goroutine start and GC are
// spread over every call).
func TestEveryRuleKindIsMeasuredWithoutAllocating(t *testing.T) {
	rows := kindsSection(config{duration: 20 * time.Millisecond}, func(string) {})
	require.Len(t, rows, len(kindCases()))
	allowed := 0.01
	if raceEnabled {
		// A quarter of what is put back is dropped and made anew: a
		// wait's timer is three objects, so about 0.75 a call; a timer
		// made at every call would be 3.
		allowed = 1.5
	}
	for _, k := range rows {
		assert.Positive(t, k.nsPerOp, k.name)
		assert.Less(t, k.allocs, allowed, "%s: allocs per Entry+Exit", k.name)
	}
}

// TestLeapflowNeverOverAdmits: in every accuracy scenario, leapflow's own
// windows hold at most the threshold, and its spans keep the documented
// bound (W - W/n: the threshold; W: twice it).
func TestLeapflowNeverOverAdmits(t *testing.T) {
	const threshold = 100
	l := accLimiters[0]
	require.Equal(t, "leapflow", l.name)
	for _, a := range []accuracy{boundary(l, threshold, 1e9), greedy(l, threshold, 1e9), hammerAccuracy(l, threshold, 1e8, 16, 3e8)} {
		assert.LessOrEqual(t, a.maxOwn, int64(threshold), a.scenario)
		assert.LessOrEqual(t, a.maxShort, int64(threshold), a.scenario)
		assert.LessOrEqual(t, a.maxFull, int64(2*threshold), a.scenario)
		assert.Positive(t, a.total, a.scenario)
	}
	// Span-exact: every continuous W within the threshold, in every
	// scenario, at a steady n/(n+1) of it under saturation.
	for _, l := range accLimiters {
		if l.name != "leapflow-span-exact" {
			continue
		}
		for _, a := range []accuracy{boundary(l, threshold, 1e9), greedy(l, threshold, 1e9), hammerAccuracy(l, threshold, 1e8, 16, 3e8)} {
			assert.LessOrEqual(t, a.maxFull, int64(threshold), a.scenario)
			assert.Positive(t, a.total, a.scenario)
		}
		n := 10.0 // flow's default span buckets (WithSpanBuckets)
		assert.InDelta(t, threshold*n/(n+1), steadyRate(l, threshold, 1e9), 1)
	}
	// The precision table's extremes: one bucket (the fixed window) lets
	// the seeds' boundary example hold twice the threshold in a span of
	// W; span-exact with one bucket never more than it.
	assert.Equal(t, int64(2*threshold), boundary(precisionLimiter(1, false), threshold, 1e9).maxFull)
	for _, n := range precisionBuckets {
		assert.LessOrEqual(t, boundary(precisionLimiter(n, true), threshold, 1e9).maxFull, int64(threshold), "n=%d", n)
	}
	// The fixed window's double burst is visible where leapflow has none.
	for _, l := range accLimiters {
		if l.name == "fixed-window" {
			f := boundary(l, threshold, 1e9)
			assert.Equal(t, int64(2*threshold), f.maxFull)
		}
	}
}

func assertWellFormedSVG(t *testing.T, name string, data []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(data))
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, name)
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
			assert.Equal(t, "http://www.w3.org/2000/svg", se.Name.Space, name)
		}
	}
	assert.Equal(t, "svg", root, name)
	assert.True(t, strings.Contains(string(data), "<polyline") || strings.Contains(string(data), "<rect"), name)
}

func TestMaxSpanAndOwn(t *testing.T) {
	ts := []int64{0, 10, 20, 95, 100, 105}
	assert.Equal(t, int64(3), maxSpan(ts, 20))    // 95, 100, 105
	assert.Equal(t, int64(6), maxSpan(ts, 106))   // all
	assert.Equal(t, int64(4), maxOwn(ts, 100, 1)) // [0, 100)
	assert.Equal(t, int64(6), maxOwn(ts, 200, 2)) // buckets [0, 100) and [100, 200)
}

func TestFlagErrors(t *testing.T) {
	_, err := parseFlags([]string{"-threshold", "0"}, io.Discard)
	assert.ErrorContains(t, err, "-threshold must be >= 1, got 0")
	_, err = parseFlags([]string{"-goroutines", "1,x"}, io.Discard)
	assert.ErrorContains(t, err, `-goroutines wants positive integers, got "x"`)
	c, err := parseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, 256, c.goroutines[len(c.goroutines)-1])
}

// BenchmarkThroughput is the throughput table as go test benchmarks, for
// benchstat: scenario=hot|many, impl=..., goroutines=G.
func BenchmarkThroughput(b *testing.B) {
	for _, sc := range []struct {
		name string
		n    int
	}{{"hot", 1}, {"many", 1000}} {
		for _, im := range impls {
			o, cleanup := im.setup(sc.n)
			b.Run(fmt.Sprintf("scenario=%s/impl=%s", sc.name, strings.ReplaceAll(im.name, "/", "-")), func(b *testing.B) {
				hammer.Sweep(b, hammer.Goroutines, func(id, n int) {
					for i := range n {
						o(id, i)
					}
				})
			})
			cleanup()
		}
	}
}

// BenchmarkPerKey is the per-key section's cells as benchmarks: every
// per-key limiter on each stream, warmed up with every key of it
// (go test -bench PerKey -cpu 2 ./bench for a quick look; the section
// runs in go run ./bench).
func BenchmarkPerKey(b *testing.B) {
	for _, st := range []struct {
		name string
		make func() keyStream
	}{
		{"one-hot-key", hotStream},
		{"zipf-100k", func() keyStream { return zipfStream(100_000) }},
		{"uniform-1M", func() keyStream { return uniformStream(1_000_000) }},
	} {
		var s keyStream // made on the first impl that runs
		for _, l := range keyLimiters {
			b.Run(fmt.Sprintf("stream=%s/impl=%s", st.name, strings.ReplaceAll(l.name, "/", "-")), func(b *testing.B) {
				if s.keys == nil {
					s = st.make()
				}
				take, done := l.make(hugeKeyRate, 2_000_000)
				defer done()
				for _, k := range s.distinct {
					take(k)
				}
				keys := s.keys
				hammer.Sweep(b, []int{1, 2, 16}, func(id, n int) {
					for i := range n {
						take(keys[(id*7919+i)&(len(keys)-1)])
					}
				})
			})
		}
	}
}

// TestSaturationKeepsTheClock: under a saturated CPU the default clock
// admits about what the monotonic clock does (a clock that fell behind by
// half the run would admit half as many), and never more than
// the windows the run touched allow.
func TestSaturationKeepsTheClock(t *testing.T) {
	rs := saturation(config{quick: true, threshold: 300})
	require.Len(t, rs, 2)
	def, mono := rs[0], rs[1]
	t.Logf("%+v\n%+v", def, mono)
	for _, r := range rs {
		assert.Positive(t, r.startup, "%s: starting the goroutines is timed", r.clock)
		assert.GreaterOrEqual(t, r.duration, r.startup, "%s: the run's time includes starting the goroutines", r.clock)
	}
	rate := func(r saturationResult) float64 { return float64(r.admitted) / r.duration.Seconds() }
	assert.GreaterOrEqual(t, rate(def), 0.5*rate(mono))
	for _, r := range rs {
		// Admissions can land until the hammer sees the stop, a window later.
		bound := int64(300 * (math.Ceil(r.duration.Seconds()) + 2))
		assert.LessOrEqual(t, r.admitted, bound, "%s: at most one second's threshold per window touched", r.clock)
	}
}

// TestPerKeyAccuracyOfLeapflow: under the per-key hammer, leapflow's own
// windows of each hot key hold at most the threshold, and any continuous
// second at most twice it.
func TestPerKeyAccuracyOfLeapflow(t *testing.T) {
	a := keyAccuracy(keyLimiters[0], 16, 1200*time.Millisecond)
	assert.LessOrEqual(t, a.own, a.threshold)
	assert.Positive(t, a.own)
	assert.LessOrEqual(t, a.most, 2*a.threshold)
}

// TestGCRAAdmitsAsXTimeRate: set up alike (a burst of the threshold), the
// GCRA behaviour and x/time/rate admit the same in the deterministic
// scenarios.
func TestGCRAAdmitsAsXTimeRate(t *testing.T) {
	byName := map[string]accLimiter{}
	for _, l := range accLimiters {
		byName[l.name] = l
	}
	for _, run := range []func(accLimiter, int64, time.Duration) accuracy{boundary, greedy} {
		g, x := run(byName["leapflow-gcra"], 100, time.Second), run(byName["x/time/rate"], 100, time.Second)
		g.limiter, x.limiter = "", ""
		assert.Equal(t, x, g)
	}
}

// TestGCRAHammerHoldsTheBound: in the bench's GCRA hammer, leapflow's
// Global GCRA rule keeps burst + rate in every 1 s span of the server
// clock, over a run of 1.5 s.
func TestGCRAHammerHoldsTheBound(t *testing.T) {
	srv, err := redistest.Launch()
	require.NoError(t, err)
	defer srv.Stop()
	admin := srv.Client()
	defer admin.Close()
	h := gcraHammerRun(srv, admin, gcraImpls[0], 200, 20, 16, 1500*time.Millisecond)
	assert.Positive(t, h.admitted)
	assert.Zero(t, h.errors)
	assert.LessOrEqual(t, h.mostServer, h.burst+h.rate)
	assert.LessOrEqual(t, h.mostLocal, h.admitted)
}

// Every peer stays on the path its scenario measures: with a limit no run
// reaches, every per-key peer and every peer middleware admits every
// request, and sethvargo's memorystore (which refills only when a tick of
// its Interval passes, and then to far less than Tokens when Tokens is
// large) sees no tick within a run. With the accuracy's limit (100/s),
// each per-key peer admits the limit at once.
func TestEveryPeerStaysOnItsPassPath(t *testing.T) {
	c := svConfig(hugeKeyRate)
	assert.Greater(t, c.Interval, runBudget, "no refill tick within a run")
	assert.GreaterOrEqual(t, c.Tokens, uint64(1<<40), "more tokens than any run's requests")
	for _, l := range keyLimiters {
		take, done := l.make(hugeKeyRate, 1000)
		admitted := 0
		for i := range 100_000 {
			if ok, _ := take(fmt.Sprint("k", i%4)); ok {
				admitted++
			}
		}
		done()
		assert.Equal(t, 100_000, admitted, "%s (%s) admits every request", l.name, l.config(hugeKeyRate))

		take, done = l.make(100, 1000)
		admitted = 0
		for range 100 {
			if ok, _ := take("hot"); ok {
				admitted++
			}
		}
		done()
		assert.Equal(t, 100, admitted, "%s (%s) admits its limit at once", l.name, l.config(100))
	}
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	sv, ul := peerMiddlewares(bare)
	for name, h := range map[string]http.Handler{"sethvargo/go-limiter": sv, "ulule/limiter": ul} {
		refused := 0
		for range 20_000 {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x", nil))
			if w.Code != http.StatusNoContent {
				refused++
			}
		}
		assert.Zero(t, refused, "%s middleware admits every request", name)
	}
}

// The accuracy chart's category labels never overlap: side by side, each
// fits between its neighbours; tilted, the lines are far enough apart and
// the chart is tall enough for the longest.
func TestBarChartLabelsDoNotOverlap(t *testing.T) {
	for _, cats := range [][]string{
		{"a", "b", "c"},
		accNames(),
		append(accNames(), "a-much-longer-limiter-name-than-any", "another/limiter"),
	} {
		var buf bytes.Buffer
		require.NoError(t, barChart(&buf, "t", "y", cats, []series{{name: "s", points: make([]float64, len(cats))}}, 1, "ref"))
		var svg struct {
			Height float64 `xml:"height,attr"`
			Texts  []struct {
				X         float64 `xml:"x,attr"`
				Y         float64 `xml:"y,attr"`
				Transform string  `xml:"transform,attr"`
				Text      string  `xml:",chardata"`
			} `xml:"text"`
		}
		require.NoError(t, xml.Unmarshal(buf.Bytes(), &svg))
		type label struct {
			x, y   float64
			tilted bool
		}
		var labels []label
		for _, tx := range svg.Texts {
			for _, c := range cats {
				if tx.Text == c {
					labels = append(labels, label{tx.X, tx.Y, strings.Contains(tx.Transform, "rotate")})
				}
			}
		}
		require.Len(t, labels, len(cats), "%v", cats)
		for i := 1; i < len(labels); i++ {
			a, b := labels[i-1], labels[i]
			gap := b.x - a.x
			if !b.tilted {
				assert.GreaterOrEqual(t, gap, (labelWidth(cats[i-1])+labelWidth(cats[i]))/2, "%q and %q overlap", cats[i-1], cats[i])
				continue
			}
			assert.GreaterOrEqual(t, gap*math.Sin(labelTilt*math.Pi/180), 14.0, "tilted %q and %q overlap", cats[i-1], cats[i])
			assert.LessOrEqual(t, b.y+labelWidth(cats[i])*math.Sin(labelTilt*math.Pi/180), svg.Height, "%q runs off the chart", cats[i])
		}
	}
}

func accNames() []string {
	var names []string
	for _, l := range accLimiters {
		names = append(names, l.name)
	}
	return names
}

// Text tables are columns: a header cell never runs into the next one,
// nor a number into the next number (before, "g=256allocs/op" and
// "1349.60.00"); Markdown tables have as many cells in each row as in
// their header.
func TestTablesHaveTheirShape(t *testing.T) {
	var buf bytes.Buffer
	table(&buf, false, []string{"impl", "stream", "g=256", "allocs/op"}, [][]string{
		{"leapflow", "zipf over 100000 keys", "1349.6", "0.00"},
		{"sethvargo/go-limiter", "uniform", "12.5", "1.00"}})
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	require.Len(t, lines, 3)
	cells := regexp.MustCompile(`\S+(?: \S+)*`)
	for _, l := range lines {
		assert.Len(t, cells.FindAllString(l, -1), 4, "%q: four columns, at least two spaces apart", l)
		assert.Equal(t, len(lines[0]), len(l), "%q: every line as wide", l)
	}
	assert.True(t, strings.HasPrefix(strings.TrimLeft(lines[1], " "), "leapflow              "), "names align left: %q", lines[1])

	buf.Reset()
	table(&buf, true, []string{"a", "b"}, [][]string{{"x|y", "2"}})
	assert.Equal(t, "| a | b |\n|---|---:|\n| x\\|y | 2 |\n", buf.String())
}

// assertMarkdownTables checks that every row of every table of a Markdown
// text has its header's number of cells.
func assertMarkdownTables(t *testing.T, md string) {
	t.Helper()
	want := 0
	for i, l := range strings.Split(md, "\n") {
		if !strings.HasPrefix(l, "|") {
			want = 0
			continue
		}
		n := strings.Count(l, "|") - 1
		if want == 0 {
			want = n
			continue
		}
		assert.Equal(t, want, n, "line %d: %q", i+1, l)
	}
}

// The breaker section's probe hammer and hung probe: leapflow admits
// exactly one probe per half-open period at every goroutine count (the
// hammer returns an error otherwise), and a probe that never returns
// gives its place back after ProbeTimeout, so the breaker closes once the
// dependency answers.
func TestBreakerSectionOneProbePerPeriodAndAHungProbeReturns(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, breakerProbes(config{quick: true}, &out))
	for _, g := range probeGoroutines {
		assert.Regexp(t, fmt.Sprintf(`(?m)^  leapflow +%d +3 +1 +1 +\d+$`, g), out.String())
	}
	out.Reset()
	breakerHungProbe(&out)
	assert.Regexp(t, `(?m)^  leapflow +\d+ +\d+ +\d+ms$`, out.String(), "closed after a probe timeout")
	assert.NotRegexp(t, `(?m)^  leapflow .* never$`, out.String())
}

// The overload section meets its targets in simulated time (SystemBBR's
// goodput within 10% of capacity, p99 within 2x the unloaded one), prints
// its three cases and draws its two charts.
func TestOverloadSectionMeetsItsTargetsAndDraws(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, overloadSection(config{out: dir}, &out))
	for _, c := range overloadCases {
		assert.Contains(t, out.String(), c.name)
	}
	for _, name := range []string{"overload-goodput.svg", "overload-latency.svg"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		assertWellFormedSVG(t, name, data)
	}
}

// The growth section measures every dimension and size, leapflow on each
// and the peers where they have a counterpart, and draws its chart.
func TestGrowthSectionMeasuresEverySize(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, growthSection(config{quick: true, duration: 5 * time.Millisecond, out: dir}, &out))
	resources, windows, keys := growthSizes(true)
	assert.Equal(t, len(resources)+len(windows)+len(keys), strings.Count(out.String(), "\n  resources")+
		strings.Count(out.String(), "\n  windows")+strings.Count(out.String(), "\n  keys"), out.String())
	assert.Regexp(t, `(?m)^  keys +10000 +\d+ \(`, out.String())
	data, err := os.ReadFile(filepath.Join(dir, "growth.svg"))
	require.NoError(t, err)
	assertWellFormedSVG(t, "growth.svg", data)
}

// TestSteadyChurnAllocatesUnderOncePerMinute: once every window has gone
// round, active resources rotate their buckets without allocating, at 2
// and 64 stripes, plain and span-exact: under one allocation per
// resource per minute (issue 31's bar), counted by the runtime.
func TestSteadyChurnAllocatesUnderOncePerMinute(t *testing.T) {
	was := runtime.GOMAXPROCS(0)
	res, err := churn([]churnCase{{2, "Reject"}, {64, "Reject"}, {2, "span-exact"}}, 50, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 {
		t.Fatalf("%d rows want 3", len(res))
	}
	for _, r := range res {
		if perMin := 60 * r.allocs; perMin >= 1 {
			t.Errorf("GOMAXPROCS %d %s: %.2f allocations per resource per minute (%.0f bytes/s)", r.procs, r.rule, perMin, r.bytes)
		}
	}
	if got := runtime.GOMAXPROCS(0); got != was {
		t.Errorf("GOMAXPROCS %d after the churn table, %d before", got, was)
	}
}
