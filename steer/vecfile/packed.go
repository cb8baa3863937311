package vecfile

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/shmsteer/shmsteer/steer"
)

// Packed is the vLLM fork's packed vectors of one hook (its SteeringHookPacked JSON): Shape
// [rows, hidden] little-endian rows of Dtype (float16, bfloat16, float32 or float64), base64 in
// Data, row r for layer LayerIndices[r] with scale Scales[r] (1 without Scales). serve reads it
// in its control API and the C ABI in inline gate sources.
type Packed struct {
	Dtype        string    `json:"dtype"`
	Shape        []int     `json:"shape"`
	LayerIndices []int     `json:"layer_indices"`
	Data         string    `json:"data"`
	Scales       []float64 `json:"scales,omitempty"`
}

// PackedError is a malformed packed blob. Msg is the reason in the fork's words (serve's
// API answers with it); it wraps ErrDtype for a dtype it does not read, else ErrCorrupt.
type PackedError struct {
	Msg string
	err error
}

func (e *PackedError) Error() string { return e.err.Error() + ": " + e.Msg }
func (e *PackedError) Unwrap() error { return e.err }

func packedErr(err error, format string, args ...any) error {
	return &PackedError{Msg: fmt.Sprintf(format, args...), err: err}
}

var packedDtypeSize = map[string]int{"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}

// pyStr and pyTuple quote as Python's repr does, as the fork's messages do.
func pyStr(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`, "\n", `\n`).Replace(s) + "'"
}

func pyTuple(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	if len(xs) == 1 {
		return "(" + s[0] + ",)"
	}
	return "(" + strings.Join(s, ", ") + ")"
}

// DecodePackedRows decodes base64 little-endian rows of shape [n, width] in dtype to float32
// rows; what names the blob in messages (SteeringHookPacked, ClampHookPacked, ...).
func DecodePackedRows(dtype string, shape []int, data, what string) ([][]float32, error) {
	size, ok := packedDtypeSize[dtype]
	if !ok {
		return nil, packedErr(ErrDtype, "%s.dtype %s: want float16, bfloat16, float32 or float64", what, pyStr(dtype))
	}
	if len(shape) != 2 {
		return nil, packedErr(ErrCorrupt, "%s.shape must be 2-D [num_layers, hidden_size]; got %s", what, pyTuple(shape))
	}
	rows, h := shape[0], shape[1]
	if rows < 1 || h < 1 || rows > 1<<20 || h > 1<<24 {
		return nil, packedErr(ErrCorrupt, "%s.shape entries must be >= 1; got %s", what, pyTuple(shape))
	}
	want := rows * h * size
	if n := base64.StdEncoding.DecodedLen(len(data)); n < want || n > want+3 {
		// the decoded length, from the encoded one (a valid encoding: 4 characters per 3 bytes)
		got := len(data) / 4 * 3
		if len(data)%4 == 0 {
			got -= len(data) - len(strings.TrimRight(data, "="))
		}
		return nil, packedErr(ErrCorrupt, "%s.data length %d != expected %d (shape=%s, dtype=%s)", what, got, want, pyTuple(shape), dtype)
	}
	raw, err := base64.StdEncoding.DecodeString(data)
	if err != nil {
		return nil, packedErr(ErrCorrupt, "%s.data is not base64: %v", what, err)
	}
	if len(raw) != want {
		return nil, packedErr(ErrCorrupt, "%s.data length %d != expected %d (shape=%s, dtype=%s)", what, len(raw), want, pyTuple(shape), dtype)
	}
	flat := make([]float32, rows*h)
	for i := range flat {
		b := raw[i*size:]
		switch dtype {
		case "float16":
			flat[i] = halfToFloat32(binary.LittleEndian.Uint16(b))
		case "bfloat16":
			flat[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(b)) << 16)
		case "float32":
			flat[i] = math.Float32frombits(binary.LittleEndian.Uint32(b))
		case "float64":
			flat[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(b)))
		}
	}
	out := make([][]float32, rows)
	for r := range rows {
		out[r] = flat[r*h : (r+1)*h : (r+1)*h]
	}
	return out, nil
}

// Vectors decodes a packed blob into one vector of hook per row, float32 (the width is for
// the caller to check against the model).
func (p *Packed) Vectors(hook string) ([]steer.Vector, error) {
	rows, err := DecodePackedRows(p.Dtype, p.Shape, p.Data, "SteeringHookPacked")
	if err != nil {
		return nil, err
	}
	if len(p.LayerIndices) != len(rows) {
		return nil, packedErr(ErrCorrupt, "SteeringHookPacked.layer_indices length (%d) must equal shape[0] (%d)", len(p.LayerIndices), len(rows))
	}
	if p.Scales != nil && len(p.Scales) != len(rows) {
		return nil, packedErr(ErrCorrupt, "SteeringHookPacked.scales length (%d) must equal layer_indices length (%d)", len(p.Scales), len(rows))
	}
	out := make([]steer.Vector, len(rows))
	for r := range rows {
		if p.LayerIndices[r] < 0 {
			return nil, packedErr(ErrCorrupt, "SteeringHookPacked.layer_indices entries must be non-negative; got %d", p.LayerIndices[r])
		}
		out[r] = steer.Vector{Hook: hook, Layer: p.LayerIndices[r], Scale: 1, Data: rows[r]}
		if p.Scales != nil {
			out[r].Scale = float32(p.Scales[r])
		}
	}
	return out, nil
}

// UnpackHook decodes one hook's packed blob of an inline gate source (the fork's JSON), a
// steer.Unpacker: steer.DecodeGates(body, vecfile.UnpackHook) reads the fork's "steering". An
// unknown key or a blob that does not decode is a PackedError (ErrCorrupt, ErrDtype).
func UnpackHook(hook string, raw json.RawMessage) ([]steer.Vector, error) {
	var p Packed
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		return nil, packedErr(ErrCorrupt, "SteeringHookPacked of hook %s must be {dtype, shape, layer_indices, data, scales?}: %v", pyStr(hook), err)
	}
	return p.Vectors(hook)
}
