package names

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestAbbrevAndValue(t *testing.T) {
	assert.Equal(t, `"api"`, Abbrev("api"))
	long := strings.Repeat("x", 1000)
	assert.Equal(t, `"`+long[:64]+`"... (1000 bytes)`, Abbrev(long))
	assert.Equal(t, "1.5", Value(1.5))
	assert.Equal(t, long[:64]+"... (1000 bytes)", Value(long))
}
