package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// roundBF16Ref rounds through float64 arithmetic: the nearest bfloat16 (ties to even) of a
// finite float32, found by comparing the two candidates' distances (IEEE 754: past the largest
// finite value by half a step or more, +-Inf).
func roundBF16Ref(f float32) uint16 {
	b := math.Float32bits(f)
	lo := uint16(b >> 16)
	hi := lo + 1
	flo := float64(math.Float32frombits(uint32(lo) << 16))
	fhi := float64(math.Float32frombits(uint32(hi) << 16))
	if hi&0x7fff == 0x7f80 { // rounding up past the largest finite: the next step, 2^128, is Inf
		fhi = math.Copysign(math.Ldexp(1, 128), flo)
	}
	dlo, dhi := math.Abs(float64(f)-flo), math.Abs(fhi-float64(f))
	switch {
	case b&0xffff == 0:
		return lo
	case dlo < dhi:
		return lo
	case dhi < dlo:
		return hi
	case lo&1 == 0:
		return lo
	}
	return hi
}

func TestBF16RoundTrip(t *testing.T) {
	cases := []float32{0, 1, -1, 1.00390625, 1.001953125, 1.005859375, 3.4e38, -3.4e38, 1e-40, -1e-45,
		float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, math.SmallestNonzeroFloat32}
	r := rand.New(rand.NewPCG(1, 2))
	for range 100000 {
		cases = append(cases, math.Float32frombits(r.Uint32()))
	}
	for _, f := range cases {
		if f != f {
			continue
		}
		require.Equal(t, roundBF16Ref(f), roundBF16(math.Float32bits(f)), "%v (%#x)", f, math.Float32bits(f))
	}
	// The largest finite float32 rounds to +Inf, as torch gives.
	require.Equal(t, uint16(0x7f80), roundBF16(math.Float32bits(math.MaxFloat32)))
}

func TestBF16NaN(t *testing.T) {
	for _, b := range []uint32{0x7f800001, 0x7fc00000, 0xffffffff, 0xff800001, 0x7fffffff, 0x7f80ffff} {
		got := roundBF16(b)
		f := math.Float32frombits(uint32(got) << 16)
		require.True(t, f != f, "%#x narrowed to %#x, not a NaN", b, got)
		require.Equal(t, b>>31, uint32(got)>>15, "%#x lost its sign", b)
	}
}

func TestBF16Convert(t *testing.T) {
	src := []uint16{0x3f80, 0xbf80, 0x7fc1, 0x7f81, 0x0001, 0x8000, 0x4049, 0xff80}
	raw := make([]byte, 2*len(src))
	for i, v := range src {
		binary.LittleEndian.PutUint16(raw[2*i:], v)
	}
	w := make([]float32, len(src))
	BF16ToF32(w, raw)
	for i, v := range src {
		require.Equal(t, uint32(v)<<16, math.Float32bits(w[i]))
	}
	// Unchanged elements keep their bytes, NaN payloads (signalling 0x7f81 too) included.
	back := append([]byte(nil), raw...)
	F32ToBF16(back, w)
	require.Equal(t, raw, back)
	// A changed element is rounded; its neighbours keep their bytes.
	w[0] = 1.00390625 // halfway between 0x3f80 and 0x3f81: ties to even
	w[6] = 3.140625 + 0.0078125/4
	F32ToBF16(back, w)
	require.Equal(t, uint16(0x3f80), binary.LittleEndian.Uint16(back[0:]))
	require.Equal(t, uint16(0x4049), binary.LittleEndian.Uint16(back[12:]))
	w[0] = 1.01171875 // halfway between 0x3f81 and 0x3f82: ties to even, 0x3f82
	F32ToBF16(back, w)
	require.Equal(t, uint16(0x3f82), binary.LittleEndian.Uint16(back[0:]))
	require.Equal(t, raw[2:12], back[2:12])
}
