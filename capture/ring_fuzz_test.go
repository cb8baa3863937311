//go:build linux

package capture

import (
	"errors"
	"slices"
	"testing"
)

// FuzzRingFrames: arbitrary bytes as a ring's data and arbitrary positions never make the
// reader panic or return a record outside the published bytes; a frame decodes or is
// ErrRingCorrupt.
func FuzzRingFrames(f *testing.F) {
	r, err := CreateRing(4096, 1)
	if err != nil {
		f.Fatal(err)
	}
	c, err := r.Attach(Block)
	if err != nil {
		f.Fatal(err)
	}
	w := r.Writer(0)
	for seq := range uint64(12) {
		id, rec := genRecord(seq, 40)
		if err := w.Append(id, rec); err != nil {
			f.Fatal(err)
		}
	}
	f.Add(slices.Clone(r.data), uint64(0), word(r.mem, offWrite).Load())
	f.Add([]byte{24, 0, 0, 0, 1, 0, 0, 0}, uint64(0), uint64(24))
	f.Add([]byte{8, 0, 0, 0, 2, 0, 0, 0}, uint64(4088), uint64(4096))
	f.Fuzz(func(t *testing.T, data []byte, rp, wp uint64) {
		var rec RingRecord
		if n, _, err := decodeFrame(data, nil, &rec); err == nil {
			if n > uint64(len(data)) || len(rec.Data) > len(data) {
				t.Fatalf("frame of %d bytes from %d", n, len(data))
			}
		} else if !errors.Is(err, ErrRingCorrupt) {
			t.Fatalf("untyped %v", err)
		}
		clear(r.data)
		copy(r.data, data)
		word(r.mem, offWrite).Store(wp)
		word(r.mem, c.so+8).Store(rp)
		c.pending = 0
		for range 64 {
			got, ok, err := c.Next()
			if err != nil {
				if !errors.Is(err, ErrRingCorrupt) {
					t.Fatalf("untyped %v", err)
				}
				return
			}
			if !ok {
				return
			}
			if got.Rows != len(got.Positions) || len(got.Data) != got.Rows*got.Width*got.Dtype.Size() {
				t.Fatalf("inconsistent record %+v", got.Record)
			}
			// The offsets name the views inside the ring's data.
			if got.DataOff < 0 || got.DataOff+len(got.Data) > len(r.data) || &r.data[got.DataOff] != &got.Data[0] ||
				&r.data[got.PositionsOff] != &got.PositionsLE[0] {
				t.Fatalf("offsets %d, %d do not name the record's views", got.DataOff, got.PositionsOff)
			}
		}
	})
}
