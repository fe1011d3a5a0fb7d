package httpflow

import (
	"net"
	"net/http"
	"net/netip"
	"strings"

	"github.com/leapflow/leapflow/flow"
)

// ClientIP returns a key function naming each request's client by its
// address, grouped as flow.AddrKey groups them (IPv6 by /64). The peer's
// address is the client's unless the peer is one of trusted (prefixes of
// your own proxies and load balancers): then the client is the nearest
// address, walking X-Forwarded-For from the right, that is not trusted. A
// header that an untrusted peer sent is never read, so a client cannot
// name itself; nor can it through a header your proxies do not write:
// ClientIP reads only X-Forwarded-For, ClientIPForwarded only Forwarded
// (RFC 7239). Use the one your proxies set.
func ClientIP(trusted ...netip.Prefix) func(*http.Request) string {
	return clientIP(false, trusted)
}

// ClientIPForwarded is ClientIP for proxies that write the Forwarded
// header's for= values instead of X-Forwarded-For.
func ClientIPForwarded(trusted ...netip.Prefix) func(*http.Request) string {
	return clientIP(true, trusted)
}

func clientIP(useForwarded bool, trusted []netip.Prefix) func(*http.Request) string {
	isTrusted := func(a netip.Addr) bool {
		a = a.Unmap().WithZone("") // a zoned address is in no prefix

		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) string {
		peer, ok := remoteAddr(r.RemoteAddr)
		if !ok {
			return ""
		}
		if !isTrusted(peer) {
			return flow.AddrKey(peer)
		}
		hops := forwardedFor(r.Header, useForwarded)
		for i := len(hops) - 1; i >= 0; i-- {
			if !isTrusted(hops[i]) {
				return flow.AddrKey(hops[i])
			}
		}
		if len(hops) > 0 {
			return flow.AddrKey(hops[0])
		}
		return flow.AddrKey(peer)
	}
}

// Header returns a key function naming each request's caller by a header
// (an API key, a tenant ID); "" when absent.
func Header(name string) func(*http.Request) string {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string { return r.Header.Get(name) }
}

func remoteAddr(s string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

// forwardedFor lists the addresses the proxies recorded, nearest last: the
// for= values of Forwarded (RFC 7239) or X-Forwarded-For. Values that are
// not addresses (obfuscated identifiers, "unknown") end the list there:
// nothing left of them can be trusted.
func forwardedFor(h http.Header, useForwarded bool) []netip.Addr {
	var out []netip.Addr
	if useForwarded {
		fw := h.Values("Forwarded")
		for _, line := range fw {
			for _, elem := range strings.Split(line, ",") {
				for _, pair := range strings.Split(elem, ";") {
					k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
					if !ok || !strings.EqualFold(k, "for") {
						continue
					}
					a, ok := forwardedAddr(v)
					if !ok {
						out = out[:0]
						continue
					}
					out = append(out, a)
				}
			}
		}
		return out
	}
	for _, line := range h.Values("X-Forwarded-For") {
		for _, v := range strings.Split(line, ",") {
			a, ok := remoteAddr(strings.TrimSpace(v))
			if !ok {
				out = out[:0]
				continue
			}
			out = append(out, a)
		}
	}
	return out
}

// forwardedAddr parses a Forwarded for= value: a bare IPv4, or a quoted
// "[IPv6]" or "IPv4:port" / "[IPv6]:port".
func forwardedAddr(v string) (netip.Addr, bool) {
	v = strings.Trim(v, `"`)
	if strings.HasPrefix(v, "[") {
		end := strings.IndexByte(v, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(v[1:end])
		return a, err == nil
	}
	return remoteAddr(v)
}
