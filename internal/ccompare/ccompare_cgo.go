//go:build cgo

package ccompare

/*
#cgo CFLAGS: -O3 -march=native

// The same plain C loop, compiled four ways: gcc's -O3 -march=native default (on this
// generation of CPUs it may keep to 256-bit vectors), with 512-bit vectors preferred, and each
// of those with the row length D a compile-time constant (the loop bound known, so gcc can
// unroll fully and drop the remainder loop). The bench races the fastest of them, so the C
// contender is the best gcc offers, not a handicapped one. noinline plus the compiler barrier
// in the repeat loops keep gcc from interchanging or fusing the repetitions, so every
// iteration really streams over h like one call would.
#define ADD_ROWS_BODY(D) \
	for (long t = 0; t < T; t++) { \
		float *restrict row = h + t * (D); \
		for (long i = 0; i < (D); i++) { \
			row[i] += s * v[i]; \
		} \
	}

__attribute__((noinline))
static void add_rows(float *restrict h, long T, long d, float s, const float *restrict v) {
	ADD_ROWS_BODY(d)
}

__attribute__((noinline, target("prefer-vector-width=512")))
static void add_rows_512(float *restrict h, long T, long d, float s, const float *restrict v) {
	ADD_ROWS_BODY(d)
}

__attribute__((noinline))
static void add_rows_d4096(float *restrict h, long T, float s, const float *restrict v) {
	ADD_ROWS_BODY(4096L)
}

__attribute__((noinline, target("prefer-vector-width=512")))
static void add_rows_512_d4096(float *restrict h, long T, float s, const float *restrict v) {
	ADD_ROWS_BODY(4096L)
}

// add_rows_repeat amortizes the cgo call overhead over iters calls of variant.
static void add_rows_repeat(int variant, float *h, long T, long d, float s, const float *v, long iters) {
	for (long k = 0; k < iters; k++) {
		switch (variant) {
		case 0: add_rows(h, T, d, s, v); break;
		case 1: add_rows_512(h, T, d, s, v); break;
		case 2: add_rows_d4096(h, T, s, v); break;
		case 3: add_rows_512_d4096(h, T, s, v); break;
		}
		__asm__ __volatile__("" ::: "memory");
	}
}
*/
import "C"

import "unsafe"

const cAvailable = true

// cAddRowsRepeat runs C variant iters times over h in one cgo call. The C side does not retain
// the pointers, as cgo's pointer rules require.
func cAddRowsRepeat(variant int, h []float32, d int, s float32, v []float32, iters int) {
	if len(h) == 0 || iters <= 0 {
		return
	}
	C.add_rows_repeat(C.int(variant), (*C.float)(unsafe.Pointer(&h[0])), C.long(len(h)/d), C.long(d),
		C.float(s), (*C.float)(unsafe.Pointer(&v[0])), C.long(iters))
}
