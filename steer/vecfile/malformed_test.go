package vecfile

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

func ones(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = 1
	}
	return v
}

func oneDir(name string, dims []uint64, typ uint32, data []byte) []byte {
	return buildGGUF([]ggufKV{kvString("general.architecture", "controlvector")}, []ggufT{{name, dims, typ, data}}, 32)
}

func npzOf(t *testing.T, members map[string][]byte, method uint16) []byte {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, b := range members {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: method})
		require.NoError(t, err)
		_, err = w.Write(b)
		require.NoError(t, err)
	}
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

func TestMalformed(t *testing.T) {
	fx := newMalformedFixtures()
	var cases []malformedCase
	for _, part := range [][]malformedCase{
		malformedOptionCases(fx), malformedGGUFCases(fx), malformedNpyCases(fx),
		malformedNpzCases(t, fx), malformedSafetensorsCases(fx),
	} {
		cases = append(cases, part...)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ImportBytes(c.b, c.file, testCfg, c.opts)
			require.Error(t, err)
			for _, w := range c.want {
				require.ErrorIs(t, err, w)
			}
			require.True(t, strings.HasPrefix(err.Error(), "shmsteer: "), err.Error())
			if !strings.HasPrefix(c.name, "bad option") {
				require.Contains(t, err.Error(), ": "+c.file+": ", "the message names the file")
			}
		})
	}
}

// malformedCase is one bad input of TestMalformed: the bytes b under the file name file, the
// options, and the errors the import must wrap.
type malformedCase struct {
	name string
	file string
	b    []byte
	opts ImportOptions
	want []error
}

// malformedFixtures are the valid pieces TestMalformed's cases corrupt: good, one finite vector
// of 8 floats; nan and inf, the same with one non-finite float; valid, a GGUF control vector of
// good at layer 1; allRows, six rows of good; npy68, allRows as a (6, 8) npy file.
type malformedFixtures struct {
	good, nan, inf []float32
	valid          []byte
	allRows, npy68 []byte
}

func newMalformedFixtures() *malformedFixtures {
	fx := &malformedFixtures{good: ones(8), nan: ones(8), inf: ones(8)}
	fx.nan[4] = float32(math.NaN())
	fx.inf[7] = float32(math.Inf(-1))
	fx.valid = controlVector(8, map[int][]float32{1: fx.good})
	for range 6 {
		fx.allRows = append(fx.allRows, f32Bytes(fx.good)...)
	}
	fx.npy68 = buildNpy("<f4", "(6, 8)", fx.allRows)
	return fx
}

// withHeader returns mut applied to a copy of the valid GGUF file.
func (fx *malformedFixtures) withHeader(mut func(b []byte) []byte) []byte {
	return mut(bytes.Clone(fx.valid))
}

// f64Bytes is xs as little-endian float64s.
func f64Bytes(xs ...float64) []byte {
	var b []byte
	for _, x := range xs {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(x))
	}
	return b
}

// eight is eight float64s, the first x and the rest zero.
func eight(x float64) []float64 { v := make([]float64, 8); v[0] = x; return v }

// malformedOptionCases are bad import options and unknown formats.
func malformedOptionCases(fx *malformedFixtures) []malformedCase {
	return []malformedCase{
		{"empty", "x.gguf", nil, ImportOptions{}, []error{ErrCorrupt}},
		{"unknown format", "x.bin", []byte("hello world, not a tensor"), ImportOptions{}, []error{ErrUnknownFormat}},
		{"forced format", "x.gguf", fx.valid, ImportOptions{Format: FormatNpy}, []error{ErrCorrupt}},
		{"bad option format", "x.gguf", fx.valid, ImportOptions{Format: "pt"}, []error{ErrUnknownFormat}},
		{"bad option scale", "x.gguf", fx.valid, ImportOptions{Scale: float32(math.Inf(1))}, []error{ErrBadOptions, steer.ErrNonFinite}},
		{"bad option range", "x.gguf", fx.valid, ImportOptions{Layers: &LayerRange{3, 1}}, []error{ErrBadOptions}},
		{"bad option hook", "x.gguf", fx.valid, ImportOptions{Hook: "attn"}, []error{steer.ErrUnknownHook}},
	}
}

// malformedGGUFCases are malformed GGUF files.
func malformedGGUFCases(fx *malformedFixtures) []malformedCase {
	le := binary.LittleEndian
	// offset of the tensor count, kv count in the header
	const tensorCountAt, kvCountAt = 8, 16
	return []malformedCase{
		{"gguf v1", "x.gguf", fx.withHeader(func(b []byte) []byte { le.PutUint32(b[4:], 1); return b }), ImportOptions{}, []error{ErrUnknownFormat}},
		{"gguf big-endian", "x.gguf", fx.withHeader(func(b []byte) []byte { binary.BigEndian.PutUint32(b[4:], 3); return b }), ImportOptions{}, []error{ErrUnknownFormat}},
		{"gguf huge tensor count", "x.gguf", fx.withHeader(func(b []byte) []byte { le.PutUint64(b[tensorCountAt:], 1<<62); return b }), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf huge kv count", "x.gguf", fx.withHeader(func(b []byte) []byte { le.PutUint64(b[kvCountAt:], 1<<40); return b }), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf huge key length", "x.gguf", fx.withHeader(func(b []byte) []byte { le.PutUint64(b[24:], 1<<63); return b }), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf huge array", "x.gguf", buildGGUF([]ggufKV{{"a", ggufArray, le.AppendUint64(le.AppendUint32(nil, ggufU64), 1<<61)}}, nil, 32), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf huge string array", "x.gguf", buildGGUF([]ggufKV{{"a", ggufArray, le.AppendUint64(le.AppendUint32(nil, ggufString), 1<<40)}}, nil, 32), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf nested arrays", "x.gguf", buildGGUF([]ggufKV{{"a", ggufArray, bytes.Repeat(le.AppendUint64(le.AppendUint32(nil, ggufArray), 1), 10)}}, nil, 32), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf unknown value type", "x.gguf", buildGGUF([]ggufKV{{"a", 99, nil}}, nil, 32), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf alignment 3", "x.gguf", buildGGUF([]ggufKV{kvU32("general.alignment", 3)}, nil, 32), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf no tensors", "x.gguf", buildGGUF([]ggufKV{kvString("general.architecture", "controlvector")}, nil, 32), ImportOptions{}, []error{ErrNoVectors}},
		{"gguf model file", "x.gguf", buildGGUF([]ggufKV{kvString("general.architecture", "llama")}, nil, 32), ImportOptions{}, []error{ErrUnknownFormat}},
		{"gguf direction.0", "x.gguf", oneDir("direction.0", []uint64{8}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{ErrTensorName}},
		{"gguf direction.01", "x.gguf", oneDir("direction.01", []uint64{8}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{ErrTensorName}},
		{"gguf direction.-1", "x.gguf", oneDir("direction.-1", []uint64{8}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{ErrTensorName}},
		{"gguf other name", "x.gguf", oneDir("blk.1.attn_q", []uint64{8}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{ErrTensorName}},
		{"gguf name too long", "x.gguf", oneDir(string(bytes.Repeat([]byte("d"), 65)), []uint64{8}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf f16", "x.gguf", oneDir("direction.1", []uint64{8}, ggmlTypeF16, make([]byte, 16)), ImportOptions{}, []error{ErrDtype}},
		{"gguf q4_0", "x.gguf", oneDir("direction.1", []uint64{8}, 2, make([]byte, 16)), ImportOptions{}, []error{ErrDtype}},
		{"gguf 2-D", "x.gguf", oneDir("direction.1", []uint64{4, 2}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{ErrShape}},
		{"gguf 5 dims", "x.gguf", oneDir("direction.1", []uint64{8, 1, 1, 1, 1}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf hidden", "x.gguf", oneDir("direction.1", []uint64{7}, 0, f32Bytes(fx.good[:7])), ImportOptions{}, []error{ErrShape, steer.ErrHiddenSize}},
		{"gguf layer beyond model", "x.gguf", oneDir("direction.6", []uint64{8}, 0, f32Bytes(fx.good)), ImportOptions{}, []error{steer.ErrLayerRange}},
		{"gguf nan", "x.gguf", oneDir("direction.1", []uint64{8}, 0, f32Bytes(fx.nan)), ImportOptions{}, []error{steer.ErrNonFinite}},
		{"gguf inf", "x.gguf", oneDir("direction.1", []uint64{8}, 0, f32Bytes(fx.inf)), ImportOptions{}, []error{steer.ErrNonFinite}},
		{"gguf scale overflow", "x.gguf", oneDir("direction.1", []uint64{8}, 0, f32Bytes([]float32{1, 10, 1, 1, 1, 1, 1, 1})), ImportOptions{Scale: 1e38}, []error{steer.ErrNonFinite}},
		{"gguf truncated data", "x.gguf", fx.valid[:len(fx.valid)-1], ImportOptions{}, []error{ErrCorrupt}},
		{"gguf offset beyond", "x.gguf", fx.withHeader(func(b []byte) []byte {
			i := bytes.Index(b, []byte("direction.1")) + len("direction.1") + 4 + 8 + 4
			le.PutUint64(b[i:], 1<<20)
			return b
		}), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf offset misaligned", "x.gguf", fx.withHeader(func(b []byte) []byte {
			i := bytes.Index(b, []byte("direction.1")) + len("direction.1") + 4 + 8 + 4
			le.PutUint64(b[i:], 4)
			return b
		}), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf duplicate name", "x.gguf", buildGGUF(nil, []ggufT{{"direction.1", []uint64{8}, 0, f32Bytes(fx.good)}, {"direction.1", []uint64{8}, 0, f32Bytes(fx.good)}}, 32), ImportOptions{}, []error{ErrCorrupt}},
		{"gguf overlapping tensors", "x.gguf", func() []byte {
			b := buildGGUF(nil, []ggufT{{"direction.1", []uint64{8}, 0, f32Bytes(fx.good)}, {"direction.2", []uint64{8}, 0, f32Bytes(fx.good)}}, 32)
			i := bytes.Index(b, []byte("direction.2")) + len("direction.2") + 4 + 8 + 4
			le.PutUint64(b[i:], 0)
			return b
		}(), ImportOptions{}, []error{ErrCorrupt}},
	}
}

// malformedNpyCases are malformed npy files.
func malformedNpyCases(fx *malformedFixtures) []malformedCase {
	le := binary.LittleEndian
	return []malformedCase{
		{"npy version 9", "x.npy", func() []byte { b := bytes.Clone(fx.npy68); b[6] = 9; return b }(), ImportOptions{}, []error{ErrUnknownFormat}},
		{"npy header beyond", "x.npy", func() []byte { b := bytes.Clone(fx.npy68); le.PutUint16(b[8:], 0xffff); return b }(), ImportOptions{}, []error{ErrCorrupt}},
		{"npy int32", "x.npy", buildNpy("<i4", "(6, 8)", fx.allRows), ImportOptions{}, []error{ErrDtype}},
		{"npy complex", "x.npy", buildNpy("<c8", "(6, 8)", fx.allRows), ImportOptions{}, []error{ErrDtype}},
		{"npy structured", "x.npy", buildNpy("<f4', 'x", "(6, 8)", fx.allRows), ImportOptions{}, []error{ErrCorrupt}},
		{"npy hidden", "x.npy", buildNpy("<f4", "(8, 6)", fx.allRows), ImportOptions{}, []error{ErrShape, steer.ErrHiddenSize}},
		{"npy layers", "x.npy", buildNpy("<f4", "(3, 16)", fx.allRows), ImportOptions{}, []error{ErrShape, steer.ErrHiddenSize}},
		{"npy layers count", "x.npy", buildNpy("<f4", "(4, 8)", fx.allRows[:4*32]), ImportOptions{}, []error{ErrShape}},
		{"npy 3-D", "x.npy", buildNpy("<f4", "(2, 3, 8)", fx.allRows), ImportOptions{}, []error{ErrShape}},
		{"npy scalar", "x.npy", buildNpy("<f4", "()", fx.allRows[:4]), ImportOptions{}, []error{ErrShape}},
		{"npy short data", "x.npy", fx.npy68[:len(fx.npy68)-1], ImportOptions{}, []error{ErrCorrupt}},
		{"npy trailing data", "x.npy", append(bytes.Clone(fx.npy68), 0), ImportOptions{}, []error{ErrCorrupt}},
		{"npy negative dim", "x.npy", buildNpy("<f4", "(-6, 8)", fx.allRows), ImportOptions{}, []error{ErrCorrupt}},
		{"npy huge dims", "x.npy", buildNpy("<f4", "(2147483647, 2147483647, 2147483647)", fx.allRows), ImportOptions{}, []error{ErrCorrupt}},
		{"npy not a dict", "x.npy", func() []byte { b := bytes.Clone(fx.npy68); b[10] = '['; return b }(), ImportOptions{}, []error{ErrCorrupt}},
		{"npy missing key", "x.npy", func() []byte { b := bytes.Clone(fx.npy68); copy(b[11:], "'xescr'"); return b }(), ImportOptions{}, []error{ErrCorrupt}},
		{"npy float64 out of range", "x.npy", buildNpy("<f8", "(8,)", f64Bytes(eight(1e300)...)), ImportOptions{Layers: &LayerRange{1, 1}}, []error{ErrValueRange}},
		{"npy float64 nan", "x.npy", buildNpy("<f8", "(8,)", f64Bytes(eight(math.NaN())...)), ImportOptions{Layers: &LayerRange{1, 1}}, []error{steer.ErrNonFinite}},
		{"npy float16 inf", "x.npy", buildNpy("<f2", "(8,)", append(le.AppendUint16(nil, 0x7c00), make([]byte, 14)...)), ImportOptions{Layers: &LayerRange{1, 1}}, []error{steer.ErrNonFinite}},
		{"npy vector without layers", "x.npy", buildNpy("<f4", "(8,)", f32Bytes(fx.good)), ImportOptions{}, []error{ErrNeedLayers}},
		{"npy vector range beyond", "x.npy", buildNpy("<f4", "(8,)", f32Bytes(fx.good)), ImportOptions{Layers: &LayerRange{6, 9}}, []error{steer.ErrLayerRange}},
		{"npy all zero", "x.npy", buildNpy("<f4", "(6, 8)", make([]byte, len(fx.allRows))), ImportOptions{}, []error{ErrNoVectors}},
	}
}

// malformedNpzCases are malformed npz archives.
func malformedNpzCases(t *testing.T, fx *malformedFixtures) []malformedCase {
	return []malformedCase{
		{"npz not a zip", "x.npz", []byte("PK\x03\x04 not really"), ImportOptions{}, []error{ErrCorrupt}},
		{"npz empty", "x.npz", npzOf(t, nil, zip.Store), ImportOptions{}, []error{ErrNoVectors}},
		{"npz unknown names", "x.npz", npzOf(t, map[string][]byte{"a.npy": fx.npy68, "b.npy": fx.npy68}, zip.Store), ImportOptions{}, []error{ErrTensorName, steer.ErrUnknownHook}},
		{"npz bad member", "x.npz", npzOf(t, map[string][]byte{"post_block.npy": fx.npy68[:100]}, zip.Deflate), ImportOptions{}, []error{ErrCorrupt}},
		{"npz over cap", "x.npz", npzOf(t, map[string][]byte{"post_block.npy": append(bytes.Clone(fx.npy68), make([]byte, 1<<16)...)}, zip.Deflate), ImportOptions{MaxBytes: 4096}, []error{ErrTooLarge}},
		{"npz bomb", "x.npz", npzOf(t, map[string][]byte{"post_block.npy": append(bytes.Clone(fx.npy68), make([]byte, 2<<20)...)}, zip.Deflate), ImportOptions{}, []error{ErrShape}},
		{"npz member hidden", "x.npz", npzOf(t, map[string][]byte{"mlp_in.npy": buildNpy("<f4", "(8, 6)", fx.allRows)}, zip.Store), ImportOptions{}, []error{ErrShape}},
	}
}

// malformedSafetensorsCases are malformed safetensors files.
func malformedSafetensorsCases(fx *malformedFixtures) []malformedCase {
	le := binary.LittleEndian
	return []malformedCase{
		{"st huge header", "x.safetensors", append(le.AppendUint64(nil, 1<<60), '{', '}'), ImportOptions{}, []error{ErrCorrupt}},
		{"st bad json", "x.safetensors", append(le.AppendUint64(nil, 3), "{x}"...), ImportOptions{}, []error{ErrCorrupt}},
		{"st offsets beyond", "x.safetensors", func() []byte {
			b := buildSafetensors([]stTensor{{"layers.1", "F32", []int{8}, f32Bytes(fx.good)}})
			return b[:len(b)-4]
		}(), ImportOptions{}, []error{ErrCorrupt}},
		{"st shape vs bytes", "x.safetensors", buildSafetensors([]stTensor{{"layers.1", "F32", []int{9}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrCorrupt}},
		{"st int dtype", "x.safetensors", buildSafetensors([]stTensor{{"layers.1", "I32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrDtype}},
		{"st bad dtype", "x.safetensors", buildSafetensors([]stTensor{{"layers.1", "F128", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrDtype}},
		{"st name", "x.safetensors", buildSafetensors([]stTensor{{"model.layers.1.mlp", "F32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrTensorName}},
		{"st name layer", "x.safetensors", buildSafetensors([]stTensor{{"post_block.x", "F32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrTensorName}},
		{"st name sign", "x.safetensors", buildSafetensors([]stTensor{{"post_block.-0", "F32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrTensorName}},
		{"st name zeros", "x.safetensors", buildSafetensors([]stTensor{{"layers.01", "F32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrTensorName}},
		{"st unknown hook", "x.safetensors", buildSafetensors([]stTensor{{"attn.1", "F32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{steer.ErrUnknownHook}},
		{"st hidden", "x.safetensors", buildSafetensors([]stTensor{{"layers.1", "F32", []int{2, 4}, f32Bytes(fx.good)}}), ImportOptions{}, []error{ErrShape, steer.ErrHiddenSize}},
		{"st layer", "x.safetensors", buildSafetensors([]stTensor{{"layers.6", "F32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{steer.ErrLayerRange}},
		{"st duplicate", "x.safetensors", buildSafetensors([]stTensor{{"layers.1", "F32", []int{8}, f32Bytes(fx.good)}, {"post_block.1", "F32", []int{8}, f32Bytes(fx.good)}}), ImportOptions{}, []error{steer.ErrDuplicate}},
		{"st bf16 nan", "x.safetensors", buildSafetensors([]stTensor{{"layers.1", "BF16", []int{8}, append(le.AppendUint16(nil, 0x7fc0), make([]byte, 14)...)}}), ImportOptions{}, []error{steer.ErrNonFinite}},
		{"st f64 range", "x.safetensors", buildSafetensors([]stTensor{{"layers.1", "F64", []int{8}, f64Bytes(eight(-1e39)...)}}), ImportOptions{}, []error{ErrValueRange}},
	}
}

// TestTruncatedAnywhere cuts a valid file of each format at every length: always an error,
// never a panic.
func TestTruncatedAnywhere(t *testing.T) {
	set := exampleSet(newRand(13))
	for _, f := range []Format{FormatGGUF, FormatNpy, FormatNpz, FormatSafetensors} {
		vecs := set
		if f == FormatGGUF || f == FormatNpy {
			vecs = onlyHook(set, "post_block")
		}
		var buf bytes.Buffer
		require.NoError(t, Export(&buf, f, testCfg, vecs, ExportOptions{}))
		b := buf.Bytes()
		for n := range len(b) {
			_, err := ImportBytes(b[:n], "x", testCfg, ImportOptions{Format: f})
			require.Error(t, err, "%s cut at %d of %d", f, n, len(b))
		}
	}
}

// An empty file (an upload with an empty body) is named as empty, whatever the format.
func TestEmptyFile(t *testing.T) {
	for _, f := range []Format{FormatAuto, FormatGGUF, FormatNpy, FormatNpz, FormatSafetensors} {
		_, err := ImportBytes(nil, "upload", steer.ModelConfig{Hidden: 4, Layers: 2}, ImportOptions{Format: f})
		require.ErrorIs(t, err, ErrCorrupt, f)
		require.ErrorContains(t, err, "upload: empty (0 bytes)", f)
	}
}

// A float64 just above float32's max that rounds to it (as numpy's astype(float32) rounds it)
// imports as MaxFloat32; past the rounding threshold, MaxFloat32 + 2^103, it is ErrValueRange.
func TestFloat64RoundsToMaxFloat32(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 8, Layers: 6}
	above := math.Nextafter(math.MaxFloat32, math.Inf(1))
	threshold := math.MaxFloat32 + math.Ldexp(1, 103)
	// eight float64s, x first, as little-endian bytes
	eight := func(x float64) []byte {
		return binary.LittleEndian.AppendUint64(make([]byte, 0, 64), math.Float64bits(x))[:8:8]
	}
	f64 := func(b []byte) []byte { return append(b, make([]byte, 56)...) }
	for _, x := range []float64{above, -above, math.Nextafter(threshold, 0)} {
		vs, err := ImportBytes(buildNpy("<f8", "(8,)", f64(eight(x))), "x.npy", cfg, ImportOptions{Layers: &LayerRange{1, 1}})
		require.NoError(t, err, "%g", x)
		require.Equal(t, float32(math.Copysign(math.MaxFloat32, x)), vs[0].Data[0])
	}
	for _, x := range []float64{threshold, 2 * math.MaxFloat32} {
		_, err := ImportBytes(buildNpy("<f8", "(8,)", f64(eight(x))), "x.npy", cfg, ImportOptions{Layers: &LayerRange{1, 1}})
		require.ErrorIs(t, err, ErrValueRange, "%g", x)
	}
}

// A safetensors tensor of a dtype the parser does not know (an 8-bit float) is an unsupported
// dtype naming the tensor, not a corrupt file.
func TestSafetensorsUnknownDtype(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 8, Layers: 6}
	for _, dt := range []string{"F8_E4M3", "F8_E5M2"} {
		b := buildSafetensors([]stTensor{{"layers.1", dt, []int{8}, make([]byte, 8)}})
		_, err := ImportBytes(b, "x.safetensors", cfg, ImportOptions{})
		require.ErrorIs(t, err, ErrDtype, dt)
		require.ErrorContains(t, err, `"layers.1"`, dt)
		require.ErrorContains(t, err, dt, dt)
	}
	// A header that is not JSON stays corrupt.
	b := buildSafetensors([]stTensor{{"layers.1", "F8_E4M3", []int{8}, make([]byte, 8)}})
	b[8] = '['
	_, err := ImportBytes(b, "x.safetensors", cfg, ImportOptions{})
	require.ErrorIs(t, err, ErrCorrupt)
}

// ModelHint reads back what Export wrote as controlvector.model_hint, and is "" for other
// formats and for bytes that are not a GGUF file.
func TestModelHintRoundTrip(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 8, Layers: 4}
	vecs := []steer.Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: ones(8)}}
	for _, hint := range []string{"llama", ""} {
		var buf bytes.Buffer
		require.NoError(t, Export(&buf, FormatGGUF, cfg, vecs, ExportOptions{ModelHint: hint}))
		require.Equal(t, hint, ModelHint(buf.Bytes()))
	}
	var buf bytes.Buffer
	require.NoError(t, Export(&buf, FormatSafetensors, cfg, vecs, ExportOptions{ModelHint: "llama"}))
	require.Equal(t, "", ModelHint(buf.Bytes()))
	require.Equal(t, "", ModelHint([]byte("GGUF truncated")))
}
