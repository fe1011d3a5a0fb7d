package flow

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAddrKey(t *testing.T) {
	for _, tc := range []struct {
		addr, want string
	}{
		{"192.0.2.7", "192.0.2.7"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"::1", "::/64"},
	} {
		assert.Equal(t, tc.want, AddrKey(netip.MustParseAddr(tc.addr)), tc.addr)
	}
	assert.Equal(t, "", AddrKey(netip.Addr{}))
	a := netip.MustParseAddr("2001:db8:1:2:3:4:5:6")
	assert.Equal(t, "2001:db8:1:2:3:4:5:6", AddrKeyBits(a, 32, 128))
	assert.Equal(t, "2001:db8:1::/48", AddrKeyBits(a, 32, 48))
	assert.Equal(t, "192.0.2.0/24", AddrKeyBits(netip.MustParseAddr("192.0.2.7"), 24, 64))
	assert.Equal(t, "::/0", AddrKeyBits(a, 32, -5), "clamped")
	// Two addresses of one /64 are one key; of two /64s, two.
	assert.Equal(t, AddrKey(netip.MustParseAddr("2001:db8::1")), AddrKey(netip.MustParseAddr("2001:db8::ffff:1")))
	assert.NotEqual(t, AddrKey(netip.MustParseAddr("2001:db8::1")), AddrKey(netip.MustParseAddr("2001:db8:0:1::1")))
	buf := make([]byte, 0, 64)
	assert.Zero(t, testing.AllocsPerRun(100, func() { buf = AppendAddrKey(buf[:0], a, 32, 64) }))
}
