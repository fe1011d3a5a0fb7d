package dashboard

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// The default clock's ticker lives as long as the process; goleak checks
// that no SSE stream outlives its client.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/leapflow/leapflow/internal/clocks.(*Coarse).run"))
}

func engine(t *testing.T, clock *stattest.Clock, rules ...flow.Rule) *flow.Engine {
	t.Helper()
	opts := []flow.Option{flow.WithMaxResources(16)}
	if clock != nil {
		opts = append(opts, flow.WithClock(clock))
	}
	e, err := flow.New(opts...)
	require.NoError(t, err)
	require.NoError(t, e.LoadRules(rules))
	t.Cleanup(e.Feed().Close)
	return e
}

func get(t *testing.T, url string, header ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// TestTickAndHistory: after a completed second the tick has the
// resource's exact counts, its rules and its in-flight count, and the
// history has its point; resources with rules and no traffic are listed.
func TestTickAndHistory(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{ID: "api-limit", Resource: "api", Threshold: 2}, flow.Rule{Resource: "quiet", Metric: flow.Concurrency, Threshold: 3})
	h, err := New(eng)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	clock.Set(time.Second)
	for range 3 {
		if en, err := eng.Entry("api"); err == nil {
			en.Exit(nil)
		}
	}
	clock.Set(3 * time.Second)
	eng.Feed().Poll()
	resp, body := get(t, srv.URL+"/api/tick")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var tick Tick
	require.NoError(t, json.Unmarshal([]byte(body), &tick))
	require.Len(t, tick.Rows, 2)
	api := tick.Rows[0]
	assert.Equal(t, "api", api.Resource, "busiest first")
	assert.Equal(t, int64(2), api.Pass)
	assert.Equal(t, int64(1), api.Block)
	assert.Equal(t, int64(2), api.Success)
	assert.Equal(t, "api-limit: QPS 2/s Reject", api.Rules)
	assert.Equal(t, "quiet", tick.Rows[1].Resource)
	assert.Equal(t, "Concurrency 3 in flight", tick.Rows[1].Rules)

	_, body = get(t, srv.URL+"/api/history?resource=api")
	var pts []Point
	require.NoError(t, json.Unmarshal([]byte(body), &pts))
	require.Len(t, pts, 1)
	assert.Equal(t, int64(2), pts[0].Pass)

	resp, body = get(t, srv.URL+"/")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, `<script src="app.js"></script>`)
	assert.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'self'")
	resp, _ = get(t, srv.URL+"/app.js")
	assert.Equal(t, http.StatusOK, resp.StatusCode)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/tick", nil)
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "read-only")
}

// TestTickShowsBreakerState: a resource with a circuit breaker has its
// state in the tick, with the time until its next probe while it refuses,
// as it goes closed, open, half-open and closed again.
func TestTickShowsBreakerState(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	eng := engine(t, clock, flow.Rule{ID: "dep-breaker", Resource: "dep", Breaker: flow.ErrorCount, Threshold: 1, RetryTimeout: 5 * time.Second},
		flow.Rule{ID: "api-limit", Resource: "api", Threshold: 2})
	h, err := New(eng)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	state := func() (string, int64) {
		t.Helper()
		eng.Feed().Poll() // the page's tick is made every second, as the feed delivers
		_, body := get(t, srv.URL+"/api/tick")
		var tick Tick
		require.NoError(t, json.Unmarshal([]byte(body), &tick))
		for _, r := range tick.Rows {
			if r.Resource == "api" {
				assert.Empty(t, r.Breaker, "a resource without a breaker has no state")
			}
		}
		for _, r := range tick.Rows {
			if r.Resource == "dep" {
				return r.Breaker, r.BreakerRetryMS
			}
		}
		t.Fatal("no dep row")
		return "", 0
	}
	s, retry := state()
	assert.Equal(t, "closed", s)
	assert.Zero(t, retry)

	en, err := eng.Entry("dep")
	require.NoError(t, err)
	en.Exit(errors.New("dependency down"))
	clock.Advance(time.Second)
	s, retry = state()
	assert.Equal(t, "open", s)
	assert.Equal(t, int64(4000), retry, "the next probe 5 s after the trip")

	clock.Advance(4 * time.Second)
	probe, err := eng.Entry("dep")
	require.NoError(t, err, "the probe")
	s, _ = state()
	assert.Equal(t, "half-open", s)
	probe.Exit(nil)
	s, retry = state()
	assert.Equal(t, "closed", s)
	assert.Zero(t, retry)
}

// TestAccess: with a token or basic auth, nothing is served without it.
func TestAccess(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	h, err := New(eng, WithToken("s3cret"))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, path := range []string{"/", "/app.js", "/api/tick", "/api/events", "/api/history?resource=x"} {
		resp, _ := get(t, srv.URL+path)
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, path)
		resp, _ = get(t, srv.URL+path+"?token=wrong")
		assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, path)
	}
	resp, _ := get(t, srv.URL+"/api/tick?token=s3cret")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = get(t, srv.URL+"/api/tick", "Authorization", "Bearer s3cret")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	// A page opened with the token passes it on to its own requests.
	resp, _ = get(t, srv.URL+"/?token=s3cret")
	require.Len(t, resp.Cookies(), 1)
	c := resp.Cookies()[0]
	assert.True(t, c.HttpOnly)
	assert.Equal(t, http.SameSiteStrictMode, c.SameSite)
	resp, _ = get(t, srv.URL+"/app.js", "Cookie", c.Name+"="+c.Value)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, _ = get(t, srv.URL+"/app.js", "Cookie", c.Name+"=wrong")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	basic, err := New(eng, WithBasicAuth("ops", "pw"))
	require.NoError(t, err)
	bsrv := httptest.NewServer(basic)
	defer bsrv.Close()
	resp, _ = get(t, bsrv.URL+"/")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("WWW-Authenticate"), "Basic")
	req, _ := http.NewRequest(http.MethodGet, bsrv.URL+"/", nil)
	req.SetBasicAuth("ops", "pw")
	r2, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	r2.Body.Close()
	assert.Equal(t, http.StatusOK, r2.StatusCode)

	_, err = New(eng, WithBasicAuth("ops", ""))
	assert.ErrorContains(t, err, "WithBasicAuth needs both")
	_, err = New(eng, WithMaxRows(-1))
	assert.ErrorContains(t, err, "WithMaxRows must be >= 1, got -1")
	_, err = New(eng, WithMaxRows(0))
	assert.ErrorContains(t, err, "got 0", "an explicit 0 is not the default")
	_, err = New(eng, WithHistorySeconds(0))
	assert.ErrorContains(t, err, "WithHistorySeconds")
	_, err = New(eng, WithMaxHistoryPoints(-3))
	assert.ErrorContains(t, err, "WithMaxHistoryPoints")
}

// TestEventsStreamEndsWithItsClient: the stream sends a tick at once and
// one per delivery; when the client goes away the handler returns
// (goleak checks the package).
func TestEventsStreamEndsWithItsClient(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{Resource: "api", Threshold: 100})
	h, err := New(eng)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/events")
	require.NoError(t, err)
	assert.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	r := bufio.NewReader(resp.Body)
	readEvent := func() string {
		var data string
		for {
			line, err := r.ReadString('\n')
			require.NoError(t, err)
			if line == "\n" {
				return data
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				data = strings.TrimSpace(v)
			}
		}
	}
	assert.Contains(t, readEvent(), `"resource":"api"`)
	clock.Set(time.Second)
	en, err := eng.Entry("api")
	require.NoError(t, err)
	en.Exit(nil)
	clock.Set(3 * time.Second)
	eng.Feed().Poll()
	assert.Contains(t, readEvent(), `"pass":1`)
	resp.Body.Close()
	d := h.(*server)
	require.Eventually(t, func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.clients) == 0
	}, 5*time.Second, 10*time.Millisecond, "the stream ended with its client")
}

// TestHistoryFromAMetricLog: the chart's history is seeded from a metric
// log's recent lines.
func TestHistoryFromAMetricLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	now := time.Now().Truncate(time.Second)
	var b strings.Builder
	for i, res := range []string{"api", "api", "other"} {
		ts := now.Add(time.Duration(i-3) * time.Second)
		b.WriteString(strings.Join([]string{
			itoa(ts.UnixMilli()), ts.UTC().Format(time.DateTime), res, itoa(int64(i + 1)), "0", "1", "0", "5", "0", "0"}, "|") + "\n")
	}
	old := now.Add(-time.Hour)
	b.WriteString(itoa(old.UnixMilli()) + "|" + old.UTC().Format(time.DateTime) + "|api|99|0|0|0|0|0|0\n")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	eng := engine(t, stattest.NewClock(0))
	h, err := New(eng, WithHistoryFile(path))
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	_, body := get(t, srv.URL+"/api/history?resource=api")
	var pts []Point
	require.NoError(t, json.Unmarshal([]byte(body), &pts))
	require.Len(t, pts, 2, "the hour-old line is past the history")
	assert.Equal(t, int64(1), pts[0].Pass)
	assert.Equal(t, int64(2), pts[1].Pass)
	assert.InDelta(t, 5.0, pts[0].AvgRT, 1e-9)
	// The feed's seconds a history file seeded (an engine that writes the
	// log it is seeded from) are not kept twice.
	h.(*server).add([]stat.Second{{Resource: "api", Time: now.Add(-2 * time.Second), Pass: 2}, {Resource: "api", Time: now, Pass: 7}})
	_, body = get(t, srv.URL+"/api/history?resource=api")
	pts = nil
	require.NoError(t, json.Unmarshal([]byte(body), &pts))
	require.Len(t, pts, 3, "the seeded seconds once, and the new one")
	assert.Equal(t, int64(7), pts[2].Pass)

	_, err = New(eng, WithHistoryFile(filepath.Join(t.TempDir(), "none", "m.log")))
	assert.ErrorContains(t, err, "HistoryFile")
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// MaxHistoryPoints bounds the points kept for all resources together, even
// when one delivery holds more resources than the bound.
func TestHistoryStaysWithinMaxHistoryPoints(t *testing.T) {
	clock := stattest.NewClock(10 * time.Second)
	eng, err := flow.New(flow.WithClock(clock), flow.WithMaxResources(1000))
	require.NoError(t, err)
	t.Cleanup(eng.Feed().Close)
	h, err := New(eng, WithMaxHistoryPoints(10))
	require.NoError(t, err)
	clock.Set(11*time.Second + time.Millisecond)
	for i := range 500 {
		en, err := eng.Entry(fmt.Sprintf("r%d", i))
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Set(13 * time.Second)
	eng.Feed().Poll()
	d := h.(*server)
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.LessOrEqual(t, d.points, 10)
}

// A metric log holding a line the writer can leave behind (a line cut by a
// crash, then appended to) does not stop New: the dashboard starts with the
// lines that read.
func TestHistoryFileWithACrashRemnantStarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.log")
	now := time.Now().Truncate(time.Second)
	line := func(ts time.Time, res string) string {
		return strings.Join([]string{itoa(ts.UnixMilli()), ts.UTC().Format(time.DateTime), res, "1", "0", "1", "0", "5", "0", "0"}, "|")
	}
	cut := line(now.Add(-3*time.Second), "api")[:20]
	body := line(now.Add(-4*time.Second), "api") + "\n" + cut + line(now.Add(-2*time.Second), "api") + "\n" + line(now.Add(-time.Second), "api") + "\n"
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	eng := engine(t, stattest.NewClock(0))
	_, err := New(eng, WithHistoryFile(path))
	require.NoError(t, err)
}

// TestEveryPassReachesTheHistory: a dashboard made in the middle of a
// second, on a resource a rule made before it, has every pass from the
// first request to the feed's Close in its history.
func TestEveryPassReachesTheHistory(t *testing.T) {
	clock := stattest.NewClock(5*time.Second + 300*time.Millisecond)
	eng := engine(t, clock, flow.Rule{Resource: "api", Threshold: 1000})
	h, err := New(eng)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	want := int64(0)
	for i, at := range []time.Duration{300, 700, 1200, 2600, 3900} {
		clock.Set(5*time.Second + at*time.Millisecond)
		for range i + 1 {
			en, err := eng.Entry("api")
			require.NoError(t, err)
			en.Exit(nil)
			want++
		}
		eng.Feed().Poll()
	}
	eng.Feed().Close()
	_, body := get(t, srv.URL+"/api/history?resource=api")
	var pts []Point
	require.NoError(t, json.Unmarshal([]byte(body), &pts))
	var got int64
	for _, p := range pts {
		got += p.Pass
	}
	assert.Equal(t, want, got)
}

// cpuAt is a CPU reading a test sets.
type cpuAt float64

func (c cpuAt) CPUUsage() float64 { return float64(c) }

// A resource with system rules carries what they read in the tick: the
// CPU usage, the BBR estimate, whether the rule sheds; others carry none.
func TestTickShowsSystemState(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	eng, err := flow.New(flow.WithClock(clock), flow.WithCPU(cpuAt(0.9)))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "inbound", System: flow.SystemBBR, Threshold: 0.8},
		{Resource: "api", Threshold: 5}}))
	t.Cleanup(eng.Feed().Close)
	for range 10 { // 2 in flight of 20 ms at a time: an estimate of 2
		a, err := eng.Entry("inbound")
		require.NoError(t, err)
		b, err := eng.Entry("inbound")
		require.NoError(t, err)
		clock.Advance(20 * time.Millisecond)
		a.Exit(nil)
		b.Exit(nil)
	}
	h, err := New(eng)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	eng.Feed().Poll()
	_, body := get(t, srv.URL+"/api/tick")
	var tick Tick
	require.NoError(t, json.Unmarshal([]byte(body), &tick))
	found := false
	for _, r := range tick.Rows {
		switch r.Resource {
		case "inbound":
			found = true
			require.NotNil(t, r.System)
			assert.Equal(t, System{CPU: 0.9, Limit: 2, Shedding: true}, *r.System)
		case "api":
			assert.Nil(t, r.System)
		}
	}
	assert.True(t, found, body)
}

// After a second in which one resource of fifty had traffic, the event
// stream's message carries that resource only, with its new second; the
// stream began with the whole table, sparklines included; a viewer that
// did not take a change is sent the whole table instead.
func TestAChangeCarriesOnlyWhatChanged(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	var rules []flow.Rule
	for i := range 50 {
		rules = append(rules, flow.Rule{Resource: fmt.Sprintf("r-%02d", i), Threshold: 100})
	}
	eng, err := flow.New(flow.WithClock(clock))
	require.NoError(t, err)
	require.NoError(t, eng.LoadRules(rules))
	t.Cleanup(eng.Feed().Close)
	h, err := New(eng)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/api/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	ticks := events(bufio.NewReader(resp.Body))
	next := func() Tick {
		t.Helper()
		select {
		case msg := <-ticks:
			var tick Tick
			require.NoError(t, json.Unmarshal([]byte(msg), &tick))
			return tick
		case <-time.After(10 * time.Second):
			t.Fatal("no tick")
		}
		return Tick{}
	}
	first := next()
	require.True(t, first.Full)
	require.Len(t, first.Rows, 50)
	require.NotNil(t, first.Rows[0].Spark)
	assert.Len(t, first.Rows[0].Spark.Pass, 60)

	clock.Set(2*time.Second + 100*time.Millisecond)
	for range 3 {
		en, err := eng.Entry("r-07")
		require.NoError(t, err)
		en.Exit(nil)
	}
	clock.Set(4 * time.Second)
	eng.Feed().Poll()
	var change Tick
	for change = next(); len(change.Rows) == 0; change = next() { // the feed's own ticks may come between
	}
	assert.False(t, change.Full)
	require.Len(t, change.Rows, 1, "the resource with traffic only")
	assert.Equal(t, "r-07", change.Rows[0].Resource)
	assert.Equal(t, int64(3), change.Rows[0].Pass)
	require.Len(t, change.Rows[0].New, 1)
	assert.Equal(t, int64(3), change.Rows[0].New[0].Pass)
	assert.Nil(t, change.Rows[0].Spark)

	// A viewer that did not take a change: the whole table next.
	s := h.(*server)
	c := make(chan []byte, 1)
	s.mu.Lock()
	s.clients[c] = struct{}{}
	s.mu.Unlock()
	s.add([]stat.Second{{Resource: "r-01", Start: int64(5 * time.Second), Time: time.Now(), Pass: 1}})
	s.add([]stat.Second{{Resource: "r-02", Start: int64(6 * time.Second), Time: time.Now(), Pass: 1}})
	assert.Nil(t, <-c, "the whole table, not a change it cannot follow")
	s.mu.Lock()
	delete(s.clients, c)
	s.mu.Unlock()
}

// A delivery larger than MaxHistoryPoints (a late subscriber's minute of
// many resources) keeps its newest seconds, not its oldest.
func TestAMinuteOverTheBoundKeepsItsNewestSeconds(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	h, err := New(eng, WithMaxHistoryPoints(100))
	require.NoError(t, err)
	s := h.(*server)
	base := time.Now().Truncate(time.Second).Add(-time.Minute)
	var batch []stat.Second
	for sec := range 60 {
		for r := range 10 {
			batch = append(batch, stat.Second{Resource: fmt.Sprint("r", r), Time: base.Add(time.Duration(sec) * time.Second), Pass: int64(sec + 1)})
		}
	}
	s.add(batch)
	s.mu.Lock()
	points, newest := s.points, s.history[len(s.history)-1][0].Time
	s.mu.Unlock()
	assert.LessOrEqual(t, points, 100)
	assert.Equal(t, base.Add(59*time.Second).UnixMilli(), newest, "the newest second kept")
}

// The keys panel empties when the last per-key rule goes: a change then
// carries an empty list (nil, omitted, says unchanged).
func TestKeysEmptyWhenTheLastPerKeyRuleGoes(t *testing.T) {
	clock := stattest.NewClock(time.Second)
	eng := engine(t, clock, flow.Rule{ID: "per-user", Resource: "api", PerKey: true, Threshold: 5})
	h, err := New(eng)
	require.NoError(t, err)
	s := h.(*server)
	var tick Tick
	require.NoError(t, json.Unmarshal(s.change(time.Now().UnixMilli(), nil), &tick))
	assert.Nil(t, tick.Keys, "unchanged since New")
	require.NoError(t, eng.LoadRules([]flow.Rule{{Resource: "api", Threshold: 5}}))
	msg := s.change(time.Now().UnixMilli(), nil)
	assert.Contains(t, string(msg), `"keys":[]`)
	require.NoError(t, json.Unmarshal(msg, &tick))
	require.NotNil(t, tick.Keys)
	assert.Empty(t, *tick.Keys)
}
