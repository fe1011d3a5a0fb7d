package global

import (
	"strings"
)

// tagEscaper escapes the characters that would end or confuse a hash tag.
var tagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// hashTag returns the Redis Cluster hash tag of a limit key: the key, with
// '%', '{' and '}' escaped, in braces. Every Redis key of the limit contains
// it, so they all hash to one slot.
func hashTag(key string) string { return "{" + tagEscaper.Replace(key) + "}" }

// keys are the Redis keys of one limit.
type keys struct {
	window string // hash: bucket start (µs) -> count, plus "latest" and the offset
	log    string // sorted set of exact-mode admissions
	meta   string // hash of the exact mode: "seq", "latest" and the offset
	reply  string // prefix of a call's reply key (a call's ID follows)
}

func keysFor(prefix, key, shape string) keys {
	base := prefix + ":" + hashTag(key) + ":" + shape
	return keys{window: base + ":w", log: base + ":log", meta: base + ":meta", reply: base + ":r:"}
}
