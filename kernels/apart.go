package kernels

import "unsafe"

// ScratchPad is how many floats beyond the row length SumAddRows's scratch must hold: room to
// place the sum where it does not alias the rows it is added to.
const ScratchPad = 1024

// apart returns a d-float window of scratch (len(scratch) >= d+ScratchPad) whose start lies,
// modulo 4 KiB, half a page from h's (or, if that is within 256 bytes of where x or y start,
// the next of a few other distances that is not). A loop that stores to the window and loads h,
// x or y at nearby indices then does not stall on 4 KiB aliasing: the CPU holds a load behind
// a pending store whose address has the same low 12 bits. With the sum row at the same page
// offset as the rows, summing and adding ran ~10% slower than the bare add (a prefill step).
func apart(scratch []float32, d int, h, x, y []float32) []float32 {
	base := uintptr(unsafe.Pointer(unsafe.SliceData(scratch)))
	oh := uintptr(unsafe.Pointer(unsafe.SliceData(h)))
	ox := uintptr(unsafe.Pointer(unsafe.SliceData(x)))
	oy := uintptr(unsafe.Pointer(unsafe.SliceData(y)))
	want := (oh + 2048) & 4095
	for _, k := range [...]uintptr{1024, 3072, 512, 1536, 2560, 3584} {
		if far(want, ox) && far(want, oy) {
			break
		}
		want = (oh + k) & 4095
	}
	skip := int((want-base)&4095) / 4
	return scratch[skip : skip+d : skip+d]
}

// far reports whether offsets a and b lie at least 256 bytes apart modulo 4 KiB.
func far(a, b uintptr) bool {
	diff := (a - b) & 4095
	return diff >= 256 && diff <= 4096-256
}
