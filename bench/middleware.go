package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"time"

	"github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ululestd "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"google.golang.org/grpc"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/grpcflow"
	"github.com/leapflow/leapflow/httpflow"
)

// The middleware section: a trivial handler called in process (no
// network), bare and behind each middleware, with rules that never block
// unless the case says so.

// mwResult is one middleware case at one goroutine count.
type mwResult struct {
	name, note string
	goroutines int
	nsPerOp    float64
	allocs     float64
}

// http1Writer is a recorder with the optional interfaces of the HTTP/1
// server's writer, so that httpflow takes the path a real HTTP/1 request
// takes.
type http1Writer struct{ *httptest.ResponseRecorder }

func (http1Writer) FlushError() error        { return nil }
func (http1Writer) CloseNotify() <-chan bool { return nil }
func (http1Writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, http.ErrNotSupported
}
func (w http1Writer) ReadFrom(r io.Reader) (int64, error) { return io.Copy(w.ResponseRecorder, r) }
func (http1Writer) SetReadDeadline(time.Time) error       { return nil }
func (http1Writer) SetWriteDeadline(time.Time) error      { return nil }
func (http1Writer) EnableFullDuplex() error               { return nil }

// mwPeerLimit is the peers' limit per second in the middleware section:
// one no run reaches.
const mwPeerLimit = 1 << 40

// peerMiddlewares are the peers' middlewares around h, per IP, at
// mwPeerLimit.
func peerMiddlewares(h http.Handler) (sethvargo, ululeMW http.Handler) {
	sv, err := memorystore.New(svConfig(mwPeerLimit))
	if err != nil {
		panic(err)
	}
	svMW, err := httplimit.NewMiddleware(sv, httplimit.IPKeyFunc())
	if err != nil {
		panic(err)
	}
	ul := ululestd.NewMiddleware(ulule.New(ululemem.NewStore(), ulule.Rate{Period: time.Second, Limit: mwPeerLimit}))
	return svMW.Handle(h), ul.Handler(h)
}

// mwCase makes a handler to time, per goroutine; nil when it cannot be
// made.
type mwCase struct {
	name, note string
	// make returns the call to time for one goroutine.
	make func() func()
}

func mwCases() []mwCase {
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	eng := func(rules ...flow.Rule) *flow.Engine {
		e, err := flow.New()
		if err != nil {
			panic(err)
		}
		if err := e.LoadRules(rules); err != nil {
			panic(err)
		}
		return e
	}
	const huge = 1e9 // within a key window's count
	route := eng(flow.Rule{Resource: "GET /x", Threshold: huge})
	perIP := eng(flow.Rule{Resource: "GET /x", Threshold: huge, PerKey: true})
	serveHTTP := func(h http.Handler, http1 bool) func() func() {
		return func() func() {
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			var w http.ResponseWriter = httptest.NewRecorder()
			if http1 {
				w = http1Writer{httptest.NewRecorder()}
			}
			return func() { h.ServeHTTP(w, r) }
		}
	}
	svMW, ul := peerMiddlewares(bare)
	gEng := eng(flow.Rule{Resource: "/bench.Svc/Call", Threshold: huge},
		flow.Rule{Resource: "/bench.Svc/Blocked", Threshold: 1.0 / 3600, StatInterval: time.Hour})
	l := grpcflow.New(gEng)
	unary := func(context.Context, any) (any, error) { return nil, nil }
	call := &grpc.UnaryServerInfo{FullMethod: "/bench.Svc/Call"}
	blocked := &grpc.UnaryServerInfo{FullMethod: "/bench.Svc/Blocked"}
	for range 3 { // fill the hour's quota of 3: every later call is refused, told when to retry
		_, _ = l.UnaryServer(context.Background(), nil, blocked, unary)
	}
	return []mwCase{
		{"net/http bare", "the handler alone", serveHTTP(bare, true)},
		{"httpflow", "route rule, HTTP/1 writer (pooled wrapper)", serveHTTP(httpflow.New(route).Handler("GET /x", bare), true)},
		{"httpflow per IP", "PerKey rule keyed by httpflow.ClientIP, HTTP/1 writer", serveHTTP(httpflow.New(perIP,
			httpflow.WithResource(func(*http.Request) string { return "GET /x" }), httpflow.WithKey(httpflow.ClientIP())).Middleware(bare), true)},
		{"httpflow other writer", "route rule, a writer without HTTP/1's interfaces (httpsnoop)", serveHTTP(httpflow.New(route).Handler("GET /x", bare), false)},
		{"sethvargo/go-limiter", "httplimit middleware, per IP, " + svDescribe(mwPeerLimit), serveHTTP(svMW, true)},
		{"ulule/limiter", fmt.Sprintf("stdlib middleware, per IP, memory store, limiter.Rate{Period: 1s, Limit: %d}", int64(mwPeerLimit)), serveHTTP(ul, true)},
		{"gRPC bare", "a unary handler alone", func() func() { return func() { _, _ = unary(context.Background(), nil) } }},
		{"grpcflow", "unary server interceptor, admitted", func() func() {
			return func() { _, _ = l.UnaryServer(context.Background(), nil, call, unary) }
		}},
		{"grpcflow blocked", "unary server interceptor, refused: ResourceExhausted with RetryInfo and ErrorInfo", func() func() {
			return func() { _, _ = l.UnaryServer(context.Background(), nil, blocked, unary) }
		}},
	}
}

// middlewareSection times each case on 1 goroutine and on one per CPU.
func middlewareSection(cfg config, tick func(string)) []mwResult {
	var res []mwResult
	for _, c := range mwCases() {
		for _, g := range mwGoroutines() {
			tick(fmt.Sprintf("middleware %s g=%d", c.name, g))
			calls := make([]func(), g)
			for i := range calls {
				calls[i] = c.make()
			}
			ns, allocs, _ := measure(func(id, _ int) { calls[id]() }, g, cfg.duration)
			res = append(res, mwResult{name: c.name, note: c.note, goroutines: g, nsPerOp: ns, allocs: allocs})
		}
	}
	return res
}

func mwGoroutines() []int {
	if p := runtime.GOMAXPROCS(0); p > 1 {
		return []int{1, p}
	}
	return []int{1}
}

// middlewareTables writes the section, as text or Markdown.
func (r *report) middlewareTables(w io.Writer, md bool) {
	if md {
		fmt.Fprintf(w, "\n## Middleware\n\nA trivial handler called in process (no network, so only the middleware's own cost shows), "+
			"bare and behind each middleware; rules far above the load unless the case says refused. "+
			"ns/op for the whole machine; allocs/op per request.\n\n")
	} else {
		fmt.Fprintf(w, "\nMiddleware: ns/op in process, trivial handler\n")
	}
	gs := mwGoroutines()
	header := []string{"case"}
	for _, g := range gs {
		header = append(header, fmt.Sprintf("g=%d", g))
	}
	header = append(header, "allocs/op")
	if md {
		header = append(header, "what")
	}
	var rows [][]string
	for i := 0; i+len(gs) <= len(r.middleware); i += len(gs) {
		cells := []string{r.middleware[i].name}
		var allocs float64
		for _, x := range r.middleware[i : i+len(gs)] {
			cells = append(cells, fmt.Sprintf("%.1f", x.nsPerOp))
			allocs = max(allocs, x.allocs)
		}
		cells = append(cells, fmt.Sprintf("%.2f", allocs))
		if md {
			cells = append(cells, r.middleware[i].note)
		}
		rows = append(rows, cells)
	}
	table(w, md, header, rows)
}

// mwCaseCount is len(mwCases()), for the progress bar.
const mwCaseCount = 9
