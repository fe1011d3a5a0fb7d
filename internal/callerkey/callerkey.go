// Package callerkey bounds caller keys read from outside (headers,
// metadata, any key function of an adapter): a key longer than MaxLen
// bytes becomes its first bytes and a hash of the whole, so that every
// key is at most MaxLen bytes while distinct keys stay distinct.
package callerkey

import (
	"crypto/sha256"
	"encoding/hex"
	"unicode/utf8"
)

// MaxLen is the longest key kept as it is (bytes).
const MaxLen = 256

// keep is how much of a longer key is kept before its hash.
const keep = 64

// Bound returns s if it is at most MaxLen bytes, else its first bytes (at
// most 64, cut at a character boundary), "~sha256:" and the hex of the
// first 16 bytes of its SHA-256: the same for every instance and process,
// so that a global per-key limit sees the same key everywhere.
func Bound(s string) string {
	if len(s) <= MaxLen {
		return s
	}
	cut := keep
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	sum := sha256.Sum256([]byte(s))
	return s[:cut] + "~sha256:" + hex.EncodeToString(sum[:16])
}
