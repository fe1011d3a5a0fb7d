package httpflow

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"reflect"
	"sync"
	"time"
)

// The HTTP/1 server's ResponseWriter gets a wrapper of our own, pooled
// with its tracker, so that a request allocates nothing for it; every
// other writer goes through httpsnoop (two allocations). The wrapper has
// exactly the optional interfaces that writer has, of those httpsnoop
// knows; a writer with any other set of them is wrapped by httpsnoop.
// TestHTTP1WriterKeepsEveryInterface checks the set against the server's.

type (
	flushError interface{ FlushError() error }
	deadliner  interface {
		SetReadDeadline(time.Time) error
		SetWriteDeadline(time.Time) error
	}
	fullDuplexEnabler interface{ EnableFullDuplex() error }
)

// http1Types caches, per writer type, whether it has the HTTP/1 set.
var http1Types sync.Map // reflect.Type -> bool

// isHTTP1 reports whether w has exactly the optional interfaces of
// http1Writer.
func isHTTP1(w http.ResponseWriter) bool {
	t := reflect.TypeOf(w)
	if v, ok := http1Types.Load(t); ok {
		return v.(bool)
	}
	_, f := w.(http.Flusher)
	_, fe := w.(flushError)
	_, cn := w.(http.CloseNotifier) //nolint:staticcheck // kept as the server has it
	_, hj := w.(http.Hijacker)
	_, rf := w.(io.ReaderFrom)
	_, dl := w.(deadliner)
	_, fd := w.(fullDuplexEnabler)
	_, ws := w.(io.StringWriter)
	_, push := w.(http.Pusher)
	ok := f && fe && cn && hj && rf && dl && fd && ws && !push
	http1Types.Store(t, ok)
	return ok
}

// http1Writer is a tracker seen as the ResponseWriter it wraps.
type http1Writer tracker

func (h *http1Writer) Header() http.Header { return h.w.Header() }

func (h *http1Writer) WriteHeader(code int) {
	if !h.sent && code >= 200 {
		h.status, h.sent = code, true
	}
	h.w.WriteHeader(code)
}

func (h *http1Writer) Write(b []byte) (int, error) {
	h.sent = true // a Write with no header sends 200
	return h.w.Write(b)
}

func (h *http1Writer) WriteString(s string) (int, error) {
	h.sent = true
	return h.w.(io.StringWriter).WriteString(s)
}

func (h *http1Writer) ReadFrom(r io.Reader) (int64, error) {
	h.sent = true
	return h.w.(io.ReaderFrom).ReadFrom(r)
}

// Flush and FlushError send the status (200 if none was set).
func (h *http1Writer) Flush() {
	h.sent = true
	h.w.(http.Flusher).Flush()
}

func (h *http1Writer) FlushError() error {
	h.sent = true
	return h.w.(flushError).FlushError()
}

func (h *http1Writer) CloseNotify() <-chan bool {
	return h.w.(http.CloseNotifier).CloseNotify() //nolint:staticcheck // kept as the server has it
}

func (h *http1Writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return h.w.(http.Hijacker).Hijack()
}

func (h *http1Writer) SetReadDeadline(t time.Time) error { return h.w.(deadliner).SetReadDeadline(t) }

func (h *http1Writer) SetWriteDeadline(t time.Time) error { return h.w.(deadliner).SetWriteDeadline(t) }

func (h *http1Writer) EnableFullDuplex() error { return h.w.(fullDuplexEnabler).EnableFullDuplex() }

// Unwrap is for http.ResponseController.
func (h *http1Writer) Unwrap() http.ResponseWriter { return h.w }
