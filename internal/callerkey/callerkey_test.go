package callerkey

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
)

// TestBoundKeepsShortKeysAndBoundsLongOnes: keys up to MaxLen are kept as
// they are; longer ones, however long, binary or sharing a prefix, become
// distinct keys of at most MaxLen bytes, the same on every call.
func TestBoundKeepsShortKeysAndBoundsLongOnes(t *testing.T) {
	short := strings.Repeat("k", MaxLen)
	assert.Equal(t, short, Bound(short))
	assert.Equal(t, "", Bound(""))

	long := strings.Repeat("a", 1<<20)
	b := Bound(long)
	assert.LessOrEqual(t, len(b), MaxLen)
	assert.Equal(t, b, Bound(strings.Clone(long)), "the same key every time")
	assert.True(t, strings.HasPrefix(b, strings.Repeat("a", 64)+"~sha256:"))
	assert.NotEqual(t, b, Bound(long+"b"), "a longer key that shares the prefix is another key")
	assert.NotEqual(t, b, Bound(long[:MaxLen+1]))

	bin := string([]byte{0, 0xff, 0xfe, '\n'}) + strings.Repeat("\x00", 1000)
	assert.LessOrEqual(t, len(Bound(bin)), MaxLen)

	// A multi-byte character across the cut is not split.
	u := strings.Repeat("é", 300) // 2 bytes each
	assert.True(t, utf8.ValidString(Bound(u)))
	assert.LessOrEqual(t, len(Bound(u)), MaxLen)
}
