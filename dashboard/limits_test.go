package dashboard

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat"
	"github.com/leapflow/leapflow/stat/stattest"
)

// streams is how many event streams d holds open.
func (s *server) streams() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients)
}

// stuckReaders opens n event streams that never read a byte.
func stuckReaders(t testing.TB, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for range n {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		_, err = fmt.Fprintf(c, "GET /api/events HTTP/1.1\r\nHost: dashboard\r\n\r\n")
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return conns
}

// events reads a stream's ticks into a channel until it ends.
func events(body *bufio.Reader) <-chan string {
	out := make(chan string, 64)
	go func() {
		defer close(out)
		for {
			line, err := body.ReadString('\n')
			if err != nil {
				return
			}
			if v, ok := strings.CutPrefix(line, "data: "); ok {
				out <- v
			}
		}
	}()
	return out
}

// TestEventStreamsAreCappedAndStuckReadersHoldNoOne: with 200 streams that
// never read and one viewer open, 10,000 more attempts are each answered
// 503 at once; the viewer receives every tick, in order, while the stuck
// streams hold it up not at all; the heap stays under 64 MiB.
func TestEventStreamsAreCappedAndStuckReadersHoldNoOne(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	h, err := New(eng, WithMaxStreams(201))
	require.NoError(t, err)
	d := h.(*server)
	srv := httptest.NewServer(h)
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/api/events")
	require.NoError(t, err)
	defer resp.Body.Close()
	ticks := events(bufio.NewReader(resp.Body))
	<-ticks // the first, at once
	stuck := stuckReaders(t, srv.Listener.Addr().String(), 200)
	defer func() {
		for _, c := range stuck {
			c.Close()
		}
	}()
	require.Eventually(t, func() bool { return d.streams() == 201 }, 10*time.Second, 5*time.Millisecond)

	const attempts, workers = 10_000, 16
	var wg sync.WaitGroup
	codes := make([]map[int]int, workers)
	for w := range workers {
		codes[w] = map[int]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer c.CloseIdleConnections()
			for range attempts / workers {
				r, err := c.Get(srv.URL + "/api/events")
				if err != nil {
					codes[w][-1]++
					continue
				}
				r.Body.Close()
				codes[w][r.StatusCode]++
			}
		}()
	}
	// Meanwhile every tick reaches the viewer.
	for i := range 20 {
		name := fmt.Sprintf("resource-%02d", i)
		d.add([]stat.Second{{Resource: name, Time: time.Now(), Pass: int64(i + 1)}})
		deadline := time.After(10 * time.Second)
	wait:
		for {
			select {
			case msg, ok := <-ticks:
				require.True(t, ok, "the viewer's stream ended")
				if strings.Contains(msg, `"resource":"`+name+`"`) {
					break wait
				}
			case <-deadline:
				t.Fatalf("tick %d never reached the viewer", i)
			}
		}
	}
	wg.Wait()
	total := map[int]int{}
	for _, m := range codes {
		for k, v := range m {
			total[k] += v
		}
	}
	assert.Equal(t, map[int]int{http.StatusServiceUnavailable: attempts}, total, "every stream past the cap is refused")
	assert.Equal(t, int64(attempts), d.refusedStreams.Load())
	assert.Equal(t, 201, d.streams())
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	assert.Less(t, ms.HeapAlloc, uint64(64<<20), "heap")
}

// TestRequestLimits: a body, an overlong URL or header, and paths that
// climb out of the embedded files are refused; nothing but the assets and
// the API is served.
func TestRequestLimits(t *testing.T) {
	eng := engine(t, nil, flow.Rule{Resource: "api", Threshold: 1})
	h, err := New(eng)
	require.NoError(t, err)
	do := func(r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	r := httptest.NewRequest(http.MethodGet, "/api/tick", strings.NewReader("x"))
	assert.Equal(t, http.StatusRequestEntityTooLarge, do(r).Code, "a body")
	r = httptest.NewRequest(http.MethodGet, "/api/history?resource="+strings.Repeat("a", 3000), nil)
	assert.Equal(t, http.StatusRequestURITooLong, do(r).Code, "a long URL")
	r = httptest.NewRequest(http.MethodGet, "/api/tick", nil)
	r.Header.Set("X-Filler", strings.Repeat("a", 9000))
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, do(r).Code, "large header fields")
	for i := range 100 {
		r.Header.Set(fmt.Sprintf("X-F%d", i), strings.Repeat("b", 100))
	}
	r.Header.Del("X-Filler")
	assert.Equal(t, http.StatusRequestHeaderFieldsTooLarge, do(r).Code, "many header fields")
	r = httptest.NewRequest(http.MethodGet, "/api/tick", nil)
	assert.Equal(t, http.StatusOK, do(r).Code)

	for _, target := range []string{"/../dashboard.go", "/%2e%2e/dashboard.go", "/assets/../dashboard.go", "/..%2fgo.mod",
		"/../../../../etc/passwd", "/dashboard.go", "/go.mod", "//etc/passwd"} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.URL.Path, r.URL.RawPath, r.RequestURI = target, "", target
		if raw := strings.Contains(target, "%"); raw {
			r.URL.RawPath = target
		}
		w := do(r)
		body := w.Body.String()
		assert.False(t, w.Code == http.StatusOK && (strings.Contains(body, "package dashboard") || strings.Contains(body, "module ") ||
			strings.Contains(body, "root:")), "%s: %d %.80q", target, w.Code, body)
	}
}

// BenchmarkEntryUnderDashboardLoad: Entry and Exit on an engine whose
// dashboard has 200 streams that never read, a viewer, a tick of 100
// resources pushed every 100 ms (ten times the feed's rate) and a refused
// stream attempt every millisecond, against the same engine with no dashboard. The two should
// cost the same (within 1.2x): nothing the dashboard does reaches the
// request path, only the CPU the load itself takes.
func BenchmarkEntryUnderDashboardLoad(b *testing.B) {
	run := func(b *testing.B, eng *flow.Engine) {
		b.ReportAllocs()
		for b.Loop() {
			en, err := eng.Entry("api")
			if err != nil {
				b.Fatal(err)
			}
			en.Exit(nil)
		}
	}
	newEngine := func(b *testing.B) *flow.Engine {
		eng, err := flow.New(flow.WithMaxResources(16))
		require.NoError(b, err)
		require.NoError(b, eng.LoadRules([]flow.Rule{{Resource: "api", Threshold: 1e12}}))
		b.Cleanup(eng.Feed().Close)
		return eng
	}
	b.Run("dashboard=none", func(b *testing.B) { run(b, newEngine(b)) })
	b.Run("dashboard=loaded", func(b *testing.B) {
		eng := newEngine(b)
		h, err := New(eng, WithMaxStreams(201))
		require.NoError(b, err)
		d := h.(*server)
		srv := httptest.NewServer(h)
		defer srv.Close()
		resp, err := http.Get(srv.URL + "/api/events")
		require.NoError(b, err)
		defer resp.Body.Close()
		ticks := events(bufio.NewReader(resp.Body))
		stuck := stuckReaders(b, srv.Listener.Addr().String(), 200)
		defer func() {
			for _, c := range stuck {
				c.Close()
			}
		}()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { // the viewer reads
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-ticks:
				}
			}
		}()
		go func() { // ticks and refused attempts
			defer wg.Done()
			c := &http.Client{}
			defer c.CloseIdleConnections()
			batch := make([]stat.Second, 100)
			for i := range batch {
				batch[i] = stat.Second{Resource: fmt.Sprint("r", i), Time: time.Now(), Pass: 1}
			}
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if i%100 == 0 {
					d.add(batch)
				}
				if r, err := c.Get(srv.URL + "/api/events"); err == nil {
					r.Body.Close()
				}
			}
		}()
		require.Eventually(b, func() bool { return d.streams() == 201 }, 10*time.Second, 5*time.Millisecond)
		b.ResetTimer()
		run(b, eng)
		b.StopTimer()
		close(stop)
		wg.Wait()
	})
}
