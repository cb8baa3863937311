package kernels

import (
	"slices"
	"testing"
	"unsafe"
)

// TestPrefetchPages: PrefetchPages touches the first float of v and of every later page v
// enters, in order, each inside v, for every length 0-4096 at every page offset; and it
// changes nothing.
func TestPrefetchPages(t *testing.T) {
	for _, off := range []int{0, 1, 2, 16, 255, 511, 512, 1000, 1022, 1023} {
		for n := 1; n <= 4096; n++ {
			var got []int
			for i := 0; i < n; i = nextPage(i, off) {
				got = append(got, i)
			}
			want := []int{0}
			for i := 1; i < n; i++ {
				if (i+off)%pageFloats == 0 {
					want = append(want, i)
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("offset %d, %d floats: prefetched %v, want %v", off, n, got, want)
			}
		}
	}
	buf := make([]float32, 3*pageFloats+64)
	for i := range buf {
		buf[i] = float32(i)
	}
	before := slices.Clone(buf)
	for start := range 64 {
		if got := pageOffset(buf[start:]); got != (pageOffset(buf)+start)%pageFloats {
			t.Fatalf("page offset of buf[%d:] = %d", start, got)
		}
		for n := 0; n <= len(buf)-start; n += 1 + n/8 {
			PrefetchPages(buf[start : start+n])
		}
	}
	if !slices.Equal(buf, before) {
		t.Fatal("PrefetchPages changed its slice")
	}
}

// TestPrefetch: Prefetch reads and changes nothing, whatever slice it is handed
// (empty, one byte, at any offset of a line).
func TestPrefetch(t *testing.T) {
	buf := make([]byte, 256)
	for i := range buf {
		buf[i] = byte(i)
	}
	before := slices.Clone(buf)
	Prefetch(nil)
	Prefetch(buf[:0])
	for i := range buf {
		Prefetch(buf[i:])
		Prefetch(buf[i : i+1])
	}
	if !slices.Equal(buf, before) {
		t.Fatal("Prefetch changed its slice")
	}
}

// TestFollows: a slice follows the one before it exactly when it starts at that one's end
// rounded up to 64 bytes (the next cell of a pool of 64-byte-aligned cells).
func TestFollows(t *testing.T) {
	buf := make([]float32, 4096+64)
	off := (64 - int(uintptr(unsafe.Pointer(&buf[0]))%64)%64) / 4 // buf[off] is 64-byte aligned
	b := buf[off:]
	for _, c := range []struct {
		prev, v []float32
		want    bool
	}{
		{b[:16], b[16:32], true},   // 64 bytes, then the next 64
		{b[:10], b[16:32], true},   // 40 bytes, rounded up to 64
		{b[:10], b[10:20], false},  // right after, but not at the rounded end
		{b[:16], b[32:48], false},  // a cell further
		{b[:1024], b[1024:], true}, // 4 KiB cells
		{b[16:32], b[:16], false},  // before
		{nil, b[:16], false},       // empty prev
		{b[:16], b[16:16], false},  // empty v
		{b[:16], nil, false},       // nil v
	} {
		if got := Follows(c.prev, c.v); got != c.want {
			t.Errorf("Follows(len %d, len %d at +%d floats) = %v, want %v", len(c.prev), len(c.v), len(b)-len(c.v), got, c.want)
		}
	}
}
