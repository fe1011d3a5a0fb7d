// Package names keeps user-supplied names out of messages at full length.
package names

import "fmt"

// Abbrev quotes s for a message, cut to its first 64 bytes if longer.
func Abbrev(s string) string {
	if len(s) <= 64 {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:64], len(s))
}

// Value formats v for a message, cut the same way.
func Value(v any) string {
	s := fmt.Sprint(v)
	if len(s) <= 64 {
		return s
	}
	return fmt.Sprintf("%s... (%d bytes)", s[:64], len(s))
}
