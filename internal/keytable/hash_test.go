package keytable

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// A key's identity is two hashes under seeds of its table's own: another
// table (another process) places and names the same keys otherwise, and
// the two hashes of one table are not one function.
func TestEachTableHashesKeysUnderItsOwnSeeds(t *testing.T) {
	var now int64
	a, b := newWindowTable(1024, &now), newWindowTable(1024, &now)
	sameAcross, sameWithin := 0, 0
	for i := range 1000 {
		k := fmt.Sprint("user-", i)
		assert.Equal(t, a.hash(k), a.hash(k), "a key hashes alike each time")
		assert.Equal(t, a.check(k), a.check(k))
		assert.NotZero(t, a.hash(k)&1, "a tag is never 0")
		if a.hash(k) == b.hash(k) {
			sameAcross++
		}
		if a.hash(k)|1 == a.check(k)|1 {
			sameWithin++
		}
	}
	assert.Zero(t, sameAcross, "two tables' hashes of the same keys")
	assert.Zero(t, sameWithin, "a table's two hashes of the same keys")
	// Keys as long as WithKey takes, and longer, hash whole.
	long := string(make([]byte, 4096))
	assert.NotEqual(t, a.hash(long), a.hash(long[:4095]))
}
