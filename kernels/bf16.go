package kernels

import (
	"encoding/binary"
	"math"
)

// BF16ToF32 widens src, len(dst) bfloat16 values as little-endian bytes (2 per value), into
// dst. Widening is exact: a bfloat16 is a float32's upper half.
func BF16ToF32(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
	}
}

// F32ToBF16 narrows src into dst, len(src) bfloat16 values as little-endian bytes, rounding to
// nearest even (as torch's float32 to bfloat16 conversion does). An element whose float32 is
// exactly its old bfloat16 widened keeps its bytes (a row the caller did not change keeps a
// NaN's payload); a NaN keeps its sign and upper payload bits and is made quiet.
func F32ToBF16(dst []byte, src []float32) {
	dst = dst[:2*len(src)]
	for i, f := range src {
		b := math.Float32bits(f)
		old := binary.LittleEndian.Uint16(dst[2*i:])
		if b == uint32(old)<<16 {
			continue
		}
		binary.LittleEndian.PutUint16(dst[2*i:], roundBF16(b))
	}
}

// roundBF16 rounds float32 bits b to bfloat16 bits, to nearest even; a NaN stays a NaN.
func roundBF16(b uint32) uint16 {
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}
