package vecfile

import (
	"encoding/base64"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

func TestHalfToFloat32(t *testing.T) {
	for _, tc := range []struct {
		h    uint16
		want float32
	}{
		{0x3c00, 1}, {0xc000, -2}, {0x3555, 0.333251953125}, {0x7bff, 65504}, {0x0001, 5.960464477539063e-08},
		{0x8001, -5.960464477539063e-08}, {0x0000, 0}, {0x8000, float32(math.Copysign(0, -1))}, {0x7c00, float32(math.Inf(1))},
	} {
		require.Equal(t, math.Float32bits(tc.want), math.Float32bits(halfToFloat32(tc.h)), "%#x", tc.h)
	}
	require.True(t, math.IsNaN(float64(halfToFloat32(0x7e00))))
}

// Packed blobs decode per dtype; a malformed one is a PackedError wrapping ErrDtype or
// ErrCorrupt, with the fork's message.
func TestPackedVectors(t *testing.T) {
	raw := []byte{0x00, 0x3c, 0x00, 0xc0} // float16 1, -2
	p := Packed{Dtype: "float16", Shape: []int{2, 1}, LayerIndices: []int{3, 5}, Data: base64.StdEncoding.EncodeToString(raw), Scales: []float64{0.5, 2}}
	vs, err := p.Vectors("post_block")
	require.NoError(t, err)
	require.Len(t, vs, 2)
	require.Equal(t, []float32{1}, vs[0].Data)
	require.Equal(t, 3, vs[0].Layer)
	require.Equal(t, float32(0.5), vs[0].Scale)
	require.Equal(t, []float32{-2}, vs[1].Data)
	for _, tc := range []struct {
		p    Packed
		want error
		msg  string
	}{
		{Packed{Dtype: "int8", Shape: []int{1, 1}, LayerIndices: []int{0}, Data: "AA=="}, ErrDtype, "SteeringHookPacked.dtype 'int8'"},
		{Packed{Dtype: "float32", Shape: []int{1}, LayerIndices: []int{0}, Data: "AAAAAA=="}, ErrCorrupt, "must be 2-D"},
		{Packed{Dtype: "float32", Shape: []int{1, 2}, LayerIndices: []int{0}, Data: "AAAAAA=="}, ErrCorrupt, "data length 4 != expected 8"},
		{Packed{Dtype: "float32", Shape: []int{1, 1}, LayerIndices: []int{0, 1}, Data: "AAAAAA=="}, ErrCorrupt, "layer_indices length (2)"},
		{Packed{Dtype: "float32", Shape: []int{1, 1}, LayerIndices: []int{-1}, Data: "AAAAAA=="}, ErrCorrupt, "non-negative"},
	} {
		_, err := tc.p.Vectors("post_block")
		require.ErrorIs(t, err, tc.want)
		var pe *PackedError
		require.True(t, errors.As(err, &pe))
		require.Contains(t, pe.Msg, tc.msg)
	}
}

// The fork's "steering" with inline packed sources decodes through UnpackHook.
func TestUnpackHookDecodesGates(t *testing.T) {
	blob := `{"dtype": "float32", "shape": [1, 2], "layer_indices": [1], "data": "AACAPwAAAEA="}`
	gates, err := steer.DecodeGates([]byte(`[{"when": {"kind": "probe", "probe": {"kind": "inline", "packed": {"post_block": `+blob+`}}, "threshold": 0},
		"scope": "next_step", "apply": {"kind": "attenuate", "strength": 0.5}}]`), UnpackHook)
	require.NoError(t, err)
	require.Equal(t, []steer.Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: []float32{1, 2}}}, gates[0].When.Probe.Vectors)
	_, err = UnpackHook("post_block", []byte(`{"dtype": "float32", "extra": 1}`))
	require.ErrorIs(t, err, ErrCorrupt)
}
