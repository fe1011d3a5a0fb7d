package keytable

import (
	"fmt"
	"testing"
)

// BenchmarkGet is a key's lookup in a table of 1024: tracked (keys up to
// 1000), or new to a full table, evicting (keys=100000).
func BenchmarkGet(b *testing.B) {
	for _, keys := range []int{1, 512, 1000, 100_000} {
		b.Run(fmt.Sprintf("keys=%d", keys), func(b *testing.B) {
			var now int64
			tbl := newWindowTable(1024, &now)
			names := make([]string, keys)
			for i := range names {
				names[i] = fmt.Sprint("user-", i)
				tbl.Get(names[i])
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				now += 10
				tbl.Get(names[i])
				if i++; i == keys {
					i = 0
				}
			}
		})
	}
}

// BenchmarkAdmit is Admit on a tracked key's state, the clock moving a
// bucket every 25 calls; limit=1 refuses most.
func BenchmarkAdmit(b *testing.B) {
	for _, limit := range []int64{1, 1 << 40} {
		b.Run(fmt.Sprintf("limit=%d", limit), func(b *testing.B) {
			var now int64
			tbl := newWindowTable(64, &now)
			st, stL := tbl.Get("user-1")
			b.ReportAllocs()
			for b.Loop() {
				now += 10
				tbl.Admit(st, stL, now, 1, limit)
			}
		})
	}
}

// BenchmarkAcquireRelease is a Conc key's count in flight, taken and
// given back.
func BenchmarkAcquireRelease(b *testing.B) {
	tbl := newConcTable(64)
	st, stL := tbl.Get("user-1")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok, _ := tbl.Acquire(st, stL, 1, 8); ok {
			tbl.Release(st, 1)
		}
	}
}
