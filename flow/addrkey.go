package flow

import (
	"net/netip"
)

// defaultIPv6PrefixBits is how AddrKey groups IPv6 addresses: one key per
// /64, the smallest block a site is usually given. A per-IP limit keyed
// by the full address is no limit for a caller who rotates addresses
// within its /64 (2^64 of them).
const defaultIPv6PrefixBits = 64

// AddrKey returns the per-key limit key of a client address: an IPv4
// address (or an IPv4-mapped IPv6 one) as itself, an IPv6 address as its
// /64 ("2001:db8:1:2::/64"); the zone is dropped. The zero Addr gives "".
func AddrKey(a netip.Addr) string { return AddrKeyBits(a, 32, defaultIPv6PrefixBits) }

// AddrKeyBits is AddrKey with the prefix lengths to group IPv4 and IPv6
// addresses by (clamped to 0-32 and 0-128): 24 gives one key per IPv4 /24,
// 128 one per IPv6 address, 48 one per IPv6 /48.
func AddrKeyBits(a netip.Addr, v4Bits, v6Bits int) string {
	var buf [64]byte // the longest key, an IPv6 prefix, is 43 bytes
	return string(AppendAddrKey(buf[:0], a, v4Bits, v6Bits))
}

// AppendAddrKey appends the key AddrKeyBits returns to dst (no allocation
// when dst has room).
func AppendAddrKey(dst []byte, a netip.Addr, v4Bits, v6Bits int) []byte {
	if !a.IsValid() {
		return dst
	}
	a = a.Unmap().WithZone("")
	bits := min(max(v6Bits, 0), 128)
	if a.Is4() {
		bits = min(max(v4Bits, 0), 32)
	}
	if bits == a.BitLen() {
		return a.AppendTo(dst)
	}
	p, _ := a.Prefix(bits) // bits is within the address's length
	return p.AppendTo(dst)
}
