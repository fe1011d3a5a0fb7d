package httpflow

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/stat/stattest"
)

// TestFlushSendsTheStatus: a Flush before any WriteHeader sends 200;
// a later WriteHeader(500) is superfluous, so the request must not count
// as an exception (HTTP/1 pooled wrapper, ResponseController, HTTP/2).
func TestFlushSendsTheStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		h2   bool
		rc   bool
	}{{"h1-Flush", false, false}, {"h1-ResponseController", false, true}, {"h2-Flush", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			eng := engine(t, stattest.NewClock(0))
			srv := httptest.NewUnstartedServer(Handler(eng, "api", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if tc.rc {
					_ = http.NewResponseController(w).Flush()
				} else {
					w.(http.Flusher).Flush()
				}
				w.WriteHeader(http.StatusInternalServerError) // superfluous: 200 went out
			})))
			srv.EnableHTTP2 = tc.h2
			srv.StartTLS()
			defer srv.Close()
			resp := get(t, srv.Client(), srv.URL)
			assert.Equal(t, http.StatusOK, resp.StatusCode, "the client got 200")
			snap, _ := eng.Snapshot("api")
			assert.Equal(t, int64(1), snap.MinutePass)
			assert.Equal(t, int64(0), snap.MinuteErrors, "a 200 response counted as an exception")
		})
	}
}

// fancyWriter is what many logging middlewares (chi's WrapResponseWriter,
// gorilla's handlers) hand on: Flusher, Hijacker and io.ReaderFrom only,
// so httpflow takes the httpsnoop path.
type fancyWriter struct{ http.ResponseWriter }

func (f fancyWriter) Flush() { f.ResponseWriter.(http.Flusher).Flush() }
func (f fancyWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return f.ResponseWriter.(http.Hijacker).Hijack()
}
func (f fancyWriter) ReadFrom(r io.Reader) (int64, error) {
	return f.ResponseWriter.(io.ReaderFrom).ReadFrom(r)
}

// TestReadFromOnTheHttpsnoopPath: ReadFrom sends 200 on every path; the
// pooled wrapper knows it (TestHTTP1WriterCounts "/from"), the httpsnoop
// path does not hook ReadFrom.
func TestReadFromOnTheHttpsnoopPath(t *testing.T) {
	eng := engine(t, stattest.NewClock(0))
	h := Handler(eng, "api", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.(io.ReaderFrom).ReadFrom(strings.NewReader("body"))
		w.WriteHeader(http.StatusInternalServerError) // too late: 200 went out
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(fancyWriter{w}, r)
	}))
	defer srv.Close()
	resp := get(t, srv.Client(), srv.URL)
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	snap, _ := eng.Snapshot("api")
	assert.Equal(t, int64(0), snap.MinuteErrors, "a 200 response counted as an exception")
}

// TestPolicyLeavesOutRelatedRules: a related-resource rule limits this
// resource by another's rate; it is no quota of this resource's, yet
// WithHeadersOnAdmit advertises it as one.
func TestPolicyLeavesOutRelatedRules(t *testing.T) {
	eng := engine(t, stattest.NewClock(0),
		flow.Rule{ID: "own", Resource: "GET /a", Threshold: 100},
		flow.Rule{ID: "rel", Resource: "GET /a", RelatedResource: "GET /b", Threshold: 1},
	)
	srv := httptest.NewServer(Handler(eng, "GET /a", ok, WithHeadersOnAdmit()))
	defer srv.Close()
	codes := 0
	for range 5 {
		if get(t, srv.Client(), srv.URL).StatusCode == http.StatusOK {
			codes++
		}
	}
	require.Equal(t, 5, codes, "GET /a admits 5 in a second: q=1 is not its quota")
	assert.Equal(t, `"own";q=100;w=1`, get(t, srv.Client(), srv.URL).Header.Get("RateLimit-Policy"))
}

// TestColdWarmUpLeavesNothingRemaining: a cold WarmUp rule blocks below its Threshold,
// and the 429 then says r>0 (quota left) in its RateLimit field.
func TestColdWarmUpLeavesNothingRemaining(t *testing.T) {
	clock := stattest.NewClock(0)
	eng := engine(t, clock, flow.Rule{ID: "w", Resource: "api", Threshold: 30, Behavior: flow.WarmUp, WarmUpPeriod: 10 * time.Second})
	srv := httptest.NewServer(Handler(eng, "api", ok))
	defer srv.Close()
	clock.Set(time.Second)
	var resp *http.Response
	for i := 0; i < 40; i++ {
		resp = get(t, srv.Client(), srv.URL)
		if resp.StatusCode == http.StatusTooManyRequests {
			t.Logf("blocked after %d admitted", i)
			break
		}
	}
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	t.Log(resp.Header.Get("RateLimit-Policy"), " / ", resp.Header.Get("RateLimit"))
	assert.True(t, strings.Contains(resp.Header.Get("RateLimit"), ";r=0"), "a 429 says quota remains: %q", resp.Header.Get("RateLimit"))
}

// TestPaddedForwardedForCostsNothing: behind a trusted proxy, the key of a
// request whose nearest hop is untrusted needs one hop parsed, but every
// hop of X-Forwarded-For is parsed (two error allocations each) before
// the limiter even runs, blocked requests included.
func TestPaddedForwardedForCostsNothing(t *testing.T) {
	key := ClientIP(netip.MustParsePrefix("10.0.0.0/8"))
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = "10.0.0.1:1"
	r.Header.Set("X-Forwarded-For", strings.Repeat("198.51.100.1, ", 1000)+"203.0.113.9")
	require.Equal(t, "203.0.113.9", key(r))
	allocs := testing.AllocsPerRun(10, func() { key(r) })
	assert.Less(t, allocs, 10.0, "allocations grow with the hops a client sent")
}
