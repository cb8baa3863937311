//go:build linux

package shm

import "testing"

// BenchmarkParts splits a Get into its parts (hash, probe, decode and copy, pin), to see where
// the nanoseconds go.
func BenchmarkParts(b *testing.B) {
	r := benchRegion(b)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = benchKey(i)
	}
	var sink uint64
	b.Run("hash", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			sink += keyHashFrom(r.m.seeds[1], r.m.hashK1, r.m.hashK2, stringBytes(keys[i&(benchKeys-1)]))
		}
	})
	b.Run("find", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			o, _, _ := r.find(1, stringBytes(keys[i&(benchKeys-1)]))
			sink += o
		}
	})
	b.Run("getAt", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			_, o, _ := getAt(&r.m, 1, stringBytes(keys[i&(benchKeys-1)]), 1<<40)
			sink += o
		}
	})
	buf := make([]byte, 0, 64)
	rd, _ := r.NewReader()
	b.Run("readerGet", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf, _ = rd.Get(1, keys[i&(benchKeys-1)], buf[:0])
		}
	})
	b.Run("readerGetSame", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf, _ = rd.Get(1, keys[5], buf[:0])
		}
	})
	_ = sink
}
