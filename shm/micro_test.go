package shm

import (
	"fmt"
	"testing"
)

func BenchmarkMicro(b *testing.B) {
	r := newTestRegion(b, Config{IndexSlots: 2048, ArenaBytes: 1 << 20})
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("%08x-1234-5678-9abc-%012x", i, i*7919)
		r.Put(1, keys[i], make([]byte, 32))
	}
	var sink uint64
	b.Run("hash", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			sink += keyHash(1, 2, 1, stringBytes(keys[i&1023]))
		}
	})
	b.Run("pin", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			s, v, _ := r.pinCurrent()
			sink += v
			r.unpin(s)
		}
	})
	b.Run("lookup", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			bl, _ := r.lookup(1, stringBytes(keys[i&1023]), 100000)
			sink += bl.off
		}
	})
	b.Run("load", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			sink += load64(r.index, uint64(i&255)*8)
		}
	})
	_ = sink
}

func BenchmarkFind(b *testing.B) {
	for _, nk := range []int{16, 1024} {
		r := newTestRegion(b, Config{IndexSlots: 2048, ArenaBytes: 1 << 20})
		keys := make([]string, nk)
		for i := range keys {
			keys[i] = fmt.Sprintf("%08x-1234-5678-9abc-%012x", i, i*7919)
			r.Put(1, keys[i], make([]byte, 32))
		}
		var sink uint64
		b.Run(fmt.Sprint("find", nk), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				o, _ := r.find(1, stringBytes(keys[i%nk]))
				sink += o
			}
		})
		buf := make([]byte, 0, 64)
		b.Run(fmt.Sprint("get", nk), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				buf, _ = r.Get(1, keys[i%nk], buf[:0])
			}
		})
		m := map[string][]byte{}
		for _, k := range keys {
			m[k] = make([]byte, 32)
		}
		b.Run(fmt.Sprint("map", nk), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				buf = append(buf[:0], m[keys[i%nk]]...)
			}
		})
	}
}

func BenchmarkReaderGet(b *testing.B) {
	r := newTestRegion(b, Config{IndexSlots: 2048, ArenaBytes: 1 << 20})
	keys := make([]string, 1024)
	for i := range keys {
		keys[i] = fmt.Sprintf("%08x-1234-5678-9abc-%012x", i, i*7919)
		r.Put(1, keys[i], make([]byte, 32))
	}
	rd, _ := r.NewReader()
	buf := make([]byte, 0, 64)
	b.Run("reader", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf, _ = rd.Get(1, keys[i&1023], buf[:0])
		}
	})
	b.Run("region", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf, _ = r.Get(1, keys[i&1023], buf[:0])
		}
	})
	m := map[string][]byte{}
	for _, k := range keys {
		m[k] = make([]byte, 32)
	}
	b.Run("gomap", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			buf = append(buf[:0], m[keys[i&1023]]...)
		}
	})
}
