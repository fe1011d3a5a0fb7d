package grpcflow

import (
	"context"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/leapflow/leapflow/flow"
)

// MetadataKey returns a key function naming a server call's caller by the
// first value of the incoming metadata field name (such as an API key
// header): "" when the call has none. Names are not case-sensitive.
func MetadataKey(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) string {
		md, ok := metadata.FromIncomingContext(ctx)
		if !ok {
			return ""
		}
		if v := md[name]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
}

// PeerKey returns a key function naming a server call's caller by the
// address of its connection's peer, as flow.AddrKey groups it (IPv6 by
// /64): "" when the peer is not an IP address (a Unix socket, an
// in-memory listener). Behind a proxy every call has the proxy's address:
// name callers by what the proxy forwards instead (MetadataKey, or a
// KeyFunc of your own that trusts only the proxy).
func PeerKey() KeyFunc {
	return func(ctx context.Context, _ string) string {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return ""
		}
		var ip netip.Addr
		switch a := p.Addr.(type) {
		case *net.TCPAddr:
			ip, _ = netip.AddrFromSlice(a.IP)
		default:
			ap, err := netip.ParseAddrPort(a.String())
			if err != nil {
				return ""
			}
			ip = ap.Addr()
		}
		if !ip.IsValid() {
			return ""
		}
		return flow.AddrKey(ip.Unmap())
	}
}
