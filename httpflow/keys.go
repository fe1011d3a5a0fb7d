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
		// From the nearest hop outwards: the first the trusted proxies did
		// not add is the client. A value that is no address (an
		// obfuscated identifier, "unknown") ends the walk: nothing beyond
		// it can be trusted, so the hop just inside it is taken.
		client := peer
		rightToLeft(r.Header, useForwarded, func(a netip.Addr, ok bool) bool {
			if !ok {
				return false
			}
			client = a
			return isTrusted(a)
		})
		return flow.AddrKey(client)
	}
}

// Header returns a key function naming each request's caller by a header
// (an API key, a tenant ID); "" when absent.
func Header(name string) func(*http.Request) string {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) string { return r.Header.Get(name) }
}

func remoteAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil { // the common forwarded value: no error made
		return a, true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), true
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(host)
	return a, err == nil
}

// rightToLeft calls fn with each address the proxies recorded, nearest
// first (ok false for a value that is no address), until fn returns false:
// the for= values of Forwarded (RFC 7239) or X-Forwarded-For. It parses
// only the hops it visits, so a client that pads the header pays for it,
// not the server.
func rightToLeft(h http.Header, useForwarded bool, fn func(a netip.Addr, ok bool) bool) {
	name := "X-Forwarded-For"
	if useForwarded {
		name = "Forwarded"
	}
	lines := h.Values(name)
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for {
			j := strings.LastIndexByte(line, ',')
			elem := strings.TrimSpace(line[j+1:])
			if useForwarded {
				if v, found := forValue(elem); found {
					if a, ok := forwardedAddr(v); !fn(a, ok) {
						return
					}
				}
			} else if a, ok := remoteAddr(elem); !fn(a, ok) {
				return
			}
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
}

// forValue returns the for= value of a Forwarded element, if it has one.
func forValue(elem string) (string, bool) {
	for elem != "" {
		var pair string
		pair, elem, _ = strings.Cut(elem, ";")
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if ok && strings.EqualFold(k, "for") {
			return v, true
		}
	}
	return "", false
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
