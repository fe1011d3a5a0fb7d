package keytable

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/internal/window"
)

// A key's window is a compact form of a resource's (internal/window, four
// buckets over the same interval): on the same requests, single file, it
// admits exactly the same ones, counts them in the same bucket, and a
// refusal sees the same count. The two are separate code (a key's state is
// one cache line; a resource's window is striped and leased), so this
// holds them to one meaning.
func TestKeyWindowDecidesAsTheResourceWindow(t *testing.T) {
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 11))
		tbl, st := windowState()
		w, err := window.NewWindow(Buckets, time.Duration(testBucket*Buckets), window.WithStripes(1))
		require.NoError(t, err)
		limit := int64(1 + rng.IntN(20))
		now := int64(rng.IntN(5000))
		for i := range 3000 {
			switch rng.IntN(10) {
			case 0:
				now += int64(rng.IntN(4 * testBucket)) // past a window now and then
			case 1:
				now -= int64(rng.IntN(testBucket / 2)) // a stale caller
			default:
				now += int64(rng.IntN(testBucket / 4))
			}
			now = max(now, 0)
			n := int64(1 + rng.IntN(4))
			b, seen, ok, dead := tbl.Admit(st, st.Life(), now, n, limit)
			require.False(t, dead)
			r, wok := w.AdmitOn(0, now, n, limit)
			require.Equal(t, wok, ok, "seed %d step %d at %d: n %d, limit %d", seed, i, now, n, limit)
			if ok {
				require.Equal(t, r.Start(), b*testBucket, "seed %d step %d: the bucket counted in", seed, i)
			} else if n <= limit {
				require.Equal(t, r.Seen(), seen, "seed %d step %d: the count a refusal saw", seed, i)
			}
		}
	}
}
