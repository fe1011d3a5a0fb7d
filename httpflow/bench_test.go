package httpflow

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/leapflow/leapflow/flow"
)

// http1Like is a recorder with the optional interfaces of the HTTP/1
// server's writer, so that the benchmark takes the path a real HTTP/1
// request takes.
type http1Like struct{ *httptest.ResponseRecorder }

func (http1Like) FlushError() error                            { return nil }
func (http1Like) CloseNotify() <-chan bool                     { return nil }
func (http1Like) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, http.ErrNotSupported }
func (w http1Like) ReadFrom(r io.Reader) (int64, error)        { return io.Copy(w.ResponseRecorder, r) }
func (http1Like) SetReadDeadline(time.Time) error              { return nil }
func (http1Like) SetWriteDeadline(time.Time) error             { return nil }
func (http1Like) EnableFullDuplex() error                      { return nil }

// BenchmarkMiddleware is a trivial handler in process, with and without
// the middleware in front (a rule that never blocks), on a writer like the
// HTTP/1 server's (our wrapper) and on a plain recorder (httpsnoop's).
func BenchmarkMiddleware(b *testing.B) {
	e, err := flow.New()
	if err != nil {
		b.Fatal(err)
	}
	if err := e.LoadRules([]flow.Rule{{Resource: "GET /x", Threshold: 1e12}}); err != nil {
		b.Fatal(err)
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	writers := []struct {
		name string
		w    http.ResponseWriter
	}{{"http1", http1Like{httptest.NewRecorder()}}, {"recorder", httptest.NewRecorder()}}
	for _, wr := range writers {
		if got := isHTTP1(wr.w); got != (wr.name == "http1") {
			b.Fatalf("%s: isHTTP1 %v", wr.name, got)
		}
		for _, hd := range []struct {
			name string
			h    http.Handler
		}{{"plain", h}, {"leapflow", New(e).Handler("GET /x", h)}} {
			b.Run(wr.name+"/"+hd.name, func(b *testing.B) {
				r := httptest.NewRequest(http.MethodGet, "/x", nil)
				b.ReportAllocs()
				for b.Loop() {
					hd.h.ServeHTTP(wr.w, r)
				}
			})
		}
	}
}

// TestMiddlewareAllocations: on the HTTP/1 path an admitted request
// allocates nothing in the middleware (under the race detector, at most
// the tracker its pool dropped).
func TestMiddlewareAllocations(t *testing.T) {
	e, err := flow.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.LoadRules([]flow.Rule{{Resource: "GET /x", Threshold: 1e12}}); err != nil {
		t.Fatal(err)
	}
	h := New(e).Handler("GET /x", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	w := http1Like{httptest.NewRecorder()}
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	h.ServeHTTP(w, r)
	allowed := 0.0
	if raceEnabled {
		allowed = 1
	}
	if n := testing.AllocsPerRun(200, func() { h.ServeHTTP(w, r) }); n > allowed {
		t.Fatalf("%v allocations per request", n)
	}
}
