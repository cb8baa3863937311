//go:build linux

package capture

import (
	"bytes"
	"errors"
	"testing"

	"github.com/shmsteer/shmsteer/steer"
)

// RingSink frames a hook's record into the ring with exactly the selected rows' bytes.
func TestRingSinkRows(t *testing.T) {
	r, err := CreateRing(1<<16, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := r.Attach(Block)
	if err != nil {
		t.Fatal(err)
	}
	sink := NewRingSink(r.Writer(0))
	const width = 6
	for _, d := range []steer.CaptureDtype{steer.CaptureF32, steer.CaptureBF16, steer.CaptureF16} {
		rowBytes := width * d.Size()
		src := make([]byte, 9*rowBytes)
		for i := range src {
			src[i] = byte(i*7 + int(d))
		}
		rows := []int{0, 2, 3, 4, 8} // runs of one and three rows
		rec := steer.CaptureRecord{RequestID: "req", Layer: 3, Hook: "post_block", Dtype: d, Width: width,
			Positions: []int{10, 12, 13, 14, 18}, Rows: rows, Src: src}
		if err := sink.Capture(&rec); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := c.Next(); ok {
			t.Fatal("a record was published before Flush")
		}
		sink.Flush()
		got, ok, err := c.Next()
		if err != nil || !ok {
			t.Fatal(ok, err)
		}
		var want []byte
		for _, i := range rows {
			want = append(want, src[i*rowBytes:(i+1)*rowBytes]...)
		}
		if got.RequestID != "req" || got.Layer != 3 || got.Hook != "post_block" || got.Dtype != sinkDtypes[d] || got.Width != width ||
			got.Rows != len(rows) || !equalInts(got.Positions, rec.Positions) || !bytes.Equal(got.Data, want) {
			t.Fatalf("%s: read %+v", d, got.Record)
		}
	}
	// Bad records are refused before anything is written.
	for _, rec := range []steer.CaptureRecord{
		{RequestID: "q", Layer: 0, Hook: "h", Dtype: 9, Width: 1, Positions: []int{0}, Rows: []int{0}, Src: make([]byte, 4)},
		{RequestID: "q", Layer: 0, Hook: "h", Dtype: steer.CaptureF32, Width: 1, Positions: []int{0, 1}, Rows: []int{0}, Src: make([]byte, 8)},
		{RequestID: "q", Layer: 0, Hook: "h", Dtype: steer.CaptureF32, Width: 1, Positions: []int{0}, Rows: []int{2}, Src: make([]byte, 8)},
		{RequestID: "q", Layer: 0, Hook: "h", Dtype: steer.CaptureF32, Width: 1, Positions: []int{0, 1}, Rows: []int{1, 0}, Src: make([]byte, 8)},
	} {
		if err := sink.Capture(&rec); !errors.Is(err, ErrBadRecord) {
			t.Errorf("%+v: %v", rec, err)
		}
	}
	sink.Flush()
	if _, ok, _ := c.Next(); ok {
		t.Fatal("a refused record reached the ring")
	}
}

// Held appends are published together by Flush, counted then; a consumer attaching while
// records are held reads them once flushed.
func TestRingHoldFlush(t *testing.T) {
	r := newRing(t, 1<<16, 2)
	a, _ := r.Attach(Block)
	w := r.Writer(0)
	w.Hold()
	for seq := range uint64(3) {
		id, rec := genRecord(seq, 64)
		if err := w.Append(id, rec); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := r.Attach(Block) // attaches mid-hold
	if _, ok, _ := a.Next(); ok {
		t.Fatal("a held record is visible")
	}
	if st := r.Stats(); st.Records != 0 || st.Occupancy != 0 {
		t.Fatalf("held records counted: %+v", st)
	}
	w.Flush()
	if st := r.Stats(); st.Records != 3 {
		t.Fatalf("after Flush: %+v", st)
	}
	for _, c := range []*RingReader{a} {
		for seq := range uint64(3) {
			got, ok, err := c.Next()
			if err != nil || !ok {
				t.Fatal(seq, ok, err)
			}
			if checkGen(t, got, 64) != seq {
				t.Fatalf("record %d out of order", seq)
			}
		}
	}
	// b's read position was set by the writer's next look at it: the published position.
	id, rec := genRecord(3, 64)
	if err := w.Append(id, rec); err != nil {
		t.Fatal(err)
	}
	got, ok, err := b.Next()
	if err != nil || !ok || checkGen(t, got, 64) != 3 {
		t.Fatalf("late consumer: %v %v", ok, err)
	}
}
