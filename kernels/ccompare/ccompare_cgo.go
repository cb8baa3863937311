//go:build cgo

package ccompare

/*
#cgo CFLAGS: -O3 -march=native

// A plain C loop; -O3 -march=native lets gcc vectorize it for this CPU.
// noinline plus the compiler barrier in the repeat loop keep gcc from
// interchanging or fusing the repetitions, so every iteration really
// streams over h like one call would.
__attribute__((noinline))
static void add_rows(float *restrict h, long T, long d, float s, const float *restrict v) {
	for (long t = 0; t < T; t++) {
		float *restrict row = h + t * d;
		for (long i = 0; i < d; i++) {
			row[i] += s * v[i];
		}
	}
}

// add_rows_repeat amortizes the cgo call overhead over iters calls.
static void add_rows_repeat(float *h, long T, long d, float s, const float *v, long iters) {
	for (long k = 0; k < iters; k++) {
		add_rows(h, T, d, s, v);
		__asm__ __volatile__("" ::: "memory");
	}
}
*/
import "C"

import "unsafe"

const cAvailable = true

// cAddRowsRepeat runs the C loop iters times over h in one cgo call. The C
// side does not retain the pointers, as cgo's pointer rules require.
func cAddRowsRepeat(h []float32, d int, s float32, v []float32, iters int) {
	if len(h) == 0 || iters <= 0 {
		return
	}
	C.add_rows_repeat((*C.float)(unsafe.Pointer(&h[0])), C.long(len(h)/d), C.long(d),
		C.float(s), (*C.float)(unsafe.Pointer(&v[0])), C.long(iters))
}
