package vecfile

import (
	"encoding/binary"
	"fmt"
	"math"
)

// dtype is an element type this package converts to float32.
type dtype struct {
	kind      byte // 'e' float16, 'b' bfloat16, 'f' float32, 'd' float64
	bigEndian bool
}

var (
	dtF16  = dtype{kind: 'e'}
	dtBF16 = dtype{kind: 'b'}
	dtF32  = dtype{kind: 'f'}
	dtF64  = dtype{kind: 'd'}
)

func (d dtype) size() int {
	switch d.kind {
	case 'e', 'b':
		return 2
	case 'f':
		return 4
	}
	return 8
}

func (d dtype) String() string {
	names := map[byte]string{'e': "float16", 'b': "bfloat16", 'f': "float32", 'd': "float64"}
	if d.bigEndian {
		return names[d.kind] + " big-endian"
	}
	return names[d.kind]
}

func (d dtype) order() binary.ByteOrder {
	if d.bigEndian {
		return binary.BigEndian
	}
	return binary.LittleEndian
}

// element returns element i of raw as float64 (exact for every kind).
func (d dtype) element(raw []byte, i int) float64 {
	o := d.order()
	switch d.kind {
	case 'e':
		return float64(halfToFloat32(o.Uint16(raw[2*i:])))
	case 'b':
		return float64(math.Float32frombits(uint32(o.Uint16(raw[2*i:])) << 16))
	case 'f':
		return float64(math.Float32frombits(o.Uint32(raw[4*i:])))
	}
	return math.Float64frombits(o.Uint64(raw[8*i:]))
}

// decode converts len(dst) elements of raw into dst. float32 bits are copied exactly; float64
// values beyond float32's range are ErrValueRange.
func (d dtype) decode(dst []float32, raw []byte) error {
	if len(raw) != len(dst)*d.size() {
		return fmt.Errorf("%w: %d bytes for %d elements of %v", ErrCorrupt, len(raw), len(dst), d)
	}
	o := d.order()
	switch d.kind {
	case 'f':
		if !d.bigEndian {
			for i := range dst {
				dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
			}
			return nil
		}
		for i := range dst {
			dst[i] = math.Float32frombits(o.Uint32(raw[4*i:]))
		}
	case 'd':
		for i := range dst {
			x := math.Float64frombits(o.Uint64(raw[8*i:]))
			if !f32Range(x) && !math.IsNaN(x) && !math.IsInf(x, 0) {
				return fmt.Errorf("%w: element %d is %g", ErrValueRange, i, x)
			}
			dst[i] = float32(x)
		}
	default:
		for i := range dst {
			dst[i] = float32(d.element(raw, i))
		}
	}
	return nil
}

// halfToFloat32 converts IEEE 754 binary16 bits to float32 (exact).
func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
	case frac == 0: // ±0
		return math.Float32frombits(sign)
	}
	// subnormal half: value = frac * 2^-24, normal in float32
	return math.Float32frombits(sign) + float32(frac)*float32(1.0/(1<<24))*signOne(sign)
}

func signOne(sign uint32) float32 {
	if sign != 0 {
		return -1
	}
	return 1
}
