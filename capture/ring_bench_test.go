//go:build linux

package capture

import (
	"testing"
	"time"
)

// BenchmarkRingAppend: one decode step's capture of one site (64 rows of a 4096-wide bf16
// residual, 512 KiB) framed into the ring while a consumer goroutine reads and releases,
// against a plain copy of the same bytes into a mapping of the same size (memcpy) in the same
// run. Compare the medians of
// `go test -bench RingAppend -count 5 ./capture`.
func BenchmarkRingAppend(b *testing.B) {
	const rows, width = 64, 4096
	rec := Record{Layer: 3, Hook: "post_block", Dtype: BFloat16, Rows: rows, Width: width, Data: make([]byte, rows*width*2)}
	for i := range rows {
		rec.Positions = append(rec.Positions, 100+i)
	}
	for i := range rec.Data {
		rec.Data[i] = byte(i)
	}
	b.Run("memcpy", func(b *testing.B) {
		// The same kind of memory as the ring's: a shared memfd mapping of the same size.
		m, err := CreateRing(64<<20, 1)
		if err != nil {
			b.Fatal(err)
		}
		defer m.Close()
		dst := m.data
		b.SetBytes(int64(len(rec.Data)))
		off := 0
		for b.Loop() {
			if off+len(rec.Data) > len(dst) {
				off = 0
			}
			copy(dst[off:], rec.Data)
			off += len(rec.Data)
		}
	})
	b.Run("ring", func(b *testing.B) {
		r, err := CreateRing(64<<20, 1)
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		c, err := r.Attach(Block)
		if err != nil {
			b.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				if _, ok, err := c.Next(); err != nil {
					panic(err)
				} else if !ok {
					select {
					case <-stop:
						return
					default:
						time.Sleep(time.Microsecond)
					}
				}
			}
		}()
		w := r.Writer(time.Second)
		b.SetBytes(int64(len(rec.Data)))
		for b.Loop() {
			if err := w.Append("req-1", rec); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		close(stop)
		<-done
		if d := r.Stats().Dropped; d != 0 {
			b.Fatalf("%d records dropped", d)
		}
	})
}
