package steer

// This is the only file of package steer that imports unsafe: one comparison of two batches'
// bytes, for Stepper.sameBatch. It reads both slices within their lengths and writes nothing.

import "unsafe"

// spansEqual reports whether a and b hold the same bytes: the same integers, the same padding,
// and ids with the same pointer and length, hence the same ids (a Go string's bytes never
// change, and b keeps its strings alive, so a pointer cannot have been reused for other
// bytes). It does not report whether they differ: equal spans with other padding or other
// strings compare unequal here (sameBatch then compares them field by field).
func spansEqual(a, b []Span) bool {
	if len(a) != len(b) {
		return false
	}
	n := len(a) * int(unsafe.Sizeof(Span{}))
	return string(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(a))), n)) ==
		string(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), n))
}
