package kernels

import (
	"slices"
	"testing"
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

// TestPrefetchLine: PrefetchLine reads and changes nothing, whatever slice it is handed
// (empty, one byte, at any offset of a line).
func TestPrefetchLine(t *testing.T) {
	buf := make([]byte, 256)
	for i := range buf {
		buf[i] = byte(i)
	}
	before := slices.Clone(buf)
	PrefetchLine(nil)
	PrefetchLine(buf[:0])
	for i := range buf {
		PrefetchLine(buf[i:])
		PrefetchLine(buf[i : i+1])
	}
	if !slices.Equal(buf, before) {
		t.Fatal("PrefetchLine changed its slice")
	}
}
