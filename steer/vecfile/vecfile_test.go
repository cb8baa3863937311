package vecfile

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

var testCfg = steer.ModelConfig{Hidden: 8, Layers: 6}

func TestImportGGUFMapsDirectionNToPostBlockLayerN(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	dirs := map[int][]float32{1: randVec(r, 8), 2: randVec(r, 8), 5: randVec(r, 8)}
	dirs[2][3] = float32(math.Copysign(0, -1)) // -0 must survive bit for bit
	path := writeTemp(t, "cv.gguf", controlVector(8, dirs))

	vecs, err := Import(path, testCfg, ImportOptions{})
	require.NoError(t, err)
	require.Len(t, vecs, 3)
	for i, l := range []int{1, 2, 5} {
		requireBitwise(t, []steer.Vector{{Hook: "post_block", Layer: l, Scale: 1, Data: dirs[l]}}, vecs[i:i+1])
	}
}

func TestImportOptions(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	dirs := map[int][]float32{1: randVec(r, 8), 2: randVec(r, 8), 3: randVec(r, 8), 4: randVec(r, 8)}
	path := writeTemp(t, "cv.gguf", controlVector(8, dirs))

	vecs, err := Import(path, testCfg, ImportOptions{Scale: 0.5, Layers: &LayerRange{2, 3}, Hook: "mlp_out"})
	require.NoError(t, err)
	require.Len(t, vecs, 2)
	for i, l := range []int{2, 3} {
		require.Equal(t, "mlp_out", vecs[i].Hook)
		require.Equal(t, l, vecs[i].Layer)
		require.Equal(t, float32(1), vecs[i].Scale)
		for j, x := range dirs[l] {
			require.Equal(t, float32(x*0.5), vecs[i].Data[j])
		}
	}

	lr, err := ParseLayerRange("10-20")
	require.NoError(t, err)
	require.Equal(t, LayerRange{10, 20}, lr)
	lr, err = ParseLayerRange("7")
	require.NoError(t, err)
	require.Equal(t, LayerRange{7, 7}, lr)
	for _, bad := range []string{"", "a-b", "5-3", "-1-2", "1-"} {
		_, err := ParseLayerRange(bad)
		require.ErrorIs(t, err, ErrBadOptions, bad)
	}
}

// TestImportFilesSumsLikeLlamaCpp checks the sum of two control vectors against llama.cpp's
// loop: data[j] += tensor[j] * strength for each file in order, over zero-initialised layers.
func TestImportFilesSumsLikeLlamaCpp(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	a := map[int][]float32{1: randVec(r, 8), 2: randVec(r, 8)}
	b := map[int][]float32{2: randVec(r, 8), 4: randVec(r, 8)}
	pa := writeTemp(t, "a.gguf", controlVector(8, a))
	pb := writeTemp(t, "b.gguf", controlVector(8, b))

	vecs, err := ImportFiles([]Source{{pa, 0.8}, {pb, -1.5}}, testCfg, ImportOptions{})
	require.NoError(t, err)

	ref := map[int][]float32{}
	for _, f := range []struct {
		dirs  map[int][]float32
		scale float32
	}{{a, 0.8}, {b, -1.5}} {
		for l, d := range f.dirs {
			if ref[l] == nil {
				ref[l] = make([]float32, 8)
			}
			for j := range d {
				ref[l][j] += float32(d[j] * f.scale)
			}
		}
	}
	want := []steer.Vector{
		{Hook: "post_block", Layer: 1, Scale: 1, Data: ref[1]},
		{Hook: "post_block", Layer: 2, Scale: 1, Data: ref[2]},
		{Hook: "post_block", Layer: 4, Scale: 1, Data: ref[4]},
	}
	requireBitwise(t, want, vecs)
}

func TestImportNpyShapesAndDtypes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	rows := make([][]float32, testCfg.Layers)
	var all []byte
	for l := range rows {
		if l%2 == 1 {
			rows[l] = randVec(r, 8)
		} else {
			rows[l] = make([]float32, 8) // zero rows are dropped
		}
		all = append(all, f32Bytes(rows[l])...)
	}
	vecs, err := ImportBytes(buildNpy("<f4", "(6, 8)", all), "x.npy", testCfg, ImportOptions{})
	require.NoError(t, err)
	require.Len(t, vecs, 3)
	for i, l := range []int{1, 3, 5} {
		requireBitwise(t, []steer.Vector{{Hook: "post_block", Layer: l, Scale: 1, Data: rows[l]}}, vecs[i:i+1])
	}

	// [hidden] with a range; float64 and float16 converted.
	one := randVec(r, 8)
	var f64 []byte
	for _, x := range one {
		f64 = binary.LittleEndian.AppendUint64(f64, math.Float64bits(float64(x)))
	}
	vecs, err = ImportBytes(buildNpy("<f8", "(8,)", f64), "x.npy", testCfg, ImportOptions{Layers: &LayerRange{2, 3}})
	require.NoError(t, err)
	require.Len(t, vecs, 2)
	requireBitwise(t, []steer.Vector{{Hook: "post_block", Layer: 2, Scale: 1, Data: one}, {Hook: "post_block", Layer: 3, Scale: 1, Data: one}}, vecs)

	halves := []uint16{0x3c00, 0xc000, 0x0001, 0x8000, 0x7bff, 0x3555, 0x0400, 0x83ff}
	want := []float32{1, -2, 5.9604645e-08, float32(math.Copysign(0, -1)), 65504, 0.33325195, 6.1035156e-05, -6.097555e-05}
	var f16 []byte
	for _, h := range halves {
		f16 = binary.LittleEndian.AppendUint16(f16, h)
	}
	vecs, err = ImportBytes(buildNpy("<f2", "(8,)", f16), "x.npy", testCfg, ImportOptions{Layers: &LayerRange{0, 0}})
	require.NoError(t, err)
	requireBitwise(t, []steer.Vector{{Hook: "post_block", Layer: 0, Scale: 1, Data: want}}, vecs)
}

func TestImportSafetensorsNames(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	v := [][]float32{randVec(r, 8), randVec(r, 8), randVec(r, 8), randVec(r, 8)}
	b := buildSafetensors([]stTensor{
		{"layers.3", "F32", []int{8}, f32Bytes(v[0])},
		{"mlp_out.2", "F32", []int{1, 8}, f32Bytes(v[1])},
		{"layers.0.pre_attn", "F32", []int{8}, f32Bytes(v[2])},
		{"post_attn.5", "F32", []int{8}, f32Bytes(v[3])},
	})
	vecs, err := ImportBytes(b, "x.safetensors", testCfg, ImportOptions{})
	require.NoError(t, err)
	requireBitwise(t, []steer.Vector{
		{Hook: "pre_attn", Layer: 0, Scale: 1, Data: v[2]},
		{Hook: "post_attn", Layer: 5, Scale: 1, Data: v[3]},
		{Hook: "post_block", Layer: 3, Scale: 1, Data: v[0]},
		{Hook: "mlp_out", Layer: 2, Scale: 1, Data: v[1]},
	}, vecs)
}

// exampleSet is a set touching every hook, for the round trips.
func exampleSet(r *rand.Rand) []steer.Vector {
	var vs []steer.Vector
	for _, h := range steer.DefaultHooks {
		for _, l := range []int{1, 3, 5} {
			vs = append(vs, steer.Vector{Hook: h, Layer: l, Scale: 1, Data: randVec(r, 8)})
		}
	}
	vs[0].Data[0] = float32(math.Copysign(0, -1))
	vs[1].Data[1] = math.SmallestNonzeroFloat32
	vs[2].Data[2] = math.MaxFloat32
	return vs
}

func onlyHook(vs []steer.Vector, hook string) []steer.Vector {
	var out []steer.Vector
	for _, v := range vs {
		if v.Hook == hook {
			out = append(out, v)
		}
	}
	return out
}

// TestRoundTrip: vectors → export → import → export → import, bitwise equal, in every format,
// through a file (mapped) and through bytes.
func TestRoundTrip(t *testing.T) {
	set := exampleSet(rand.New(rand.NewPCG(11, 12)))
	cases := []struct {
		format Format
		vecs   []steer.Vector
	}{
		{FormatGGUF, onlyHook(set, "post_block")},
		{FormatNpy, onlyHook(set, "mlp_in")},
		{FormatNpz, set},
		{FormatSafetensors, set},
	}
	for _, c := range cases {
		t.Run(string(c.format), func(t *testing.T) {
			opts := ImportOptions{}
			if c.format == FormatNpy {
				opts.Hook = "mlp_in"
			}
			var first bytes.Buffer
			require.NoError(t, Export(&first, c.format, testCfg, c.vecs, ExportOptions{ModelHint: "llama"}))
			got, err := ImportBytes(first.Bytes(), "x", testCfg, opts)
			require.NoError(t, err)
			requireBitwise(t, c.vecs, got)

			path := filepath.Join(t.TempDir(), "again."+string(c.format))
			require.NoError(t, ExportFile(path, FormatAuto, testCfg, got, ExportOptions{ModelHint: "llama"}))
			again, err := Import(path, testCfg, opts)
			require.NoError(t, err)
			requireBitwise(t, got, again)
		})
	}
}

func TestExportScaleAndRefusals(t *testing.T) {
	v := []steer.Vector{{Hook: "post_block", Layer: 2, Scale: 2, Data: []float32{1, 2, 3, 4, 5, 6, 7, 8}}}
	var buf bytes.Buffer
	require.NoError(t, Export(&buf, FormatGGUF, testCfg, v, ExportOptions{}))
	got, err := ImportBytes(buf.Bytes(), "x.gguf", testCfg, ImportOptions{})
	require.NoError(t, err)
	require.Equal(t, []float32{2, 4, 6, 8, 10, 12, 14, 16}, got[0].Data)

	data := make([]float32, 8)
	data[0] = 1
	cases := []struct {
		name   string
		format Format
		vecs   []steer.Vector
		want   error
	}{
		{"gguf other hook", FormatGGUF, []steer.Vector{{Hook: "mlp_out", Layer: 1, Scale: 1, Data: data}}, ErrUnrepresentable},
		{"gguf layer 0", FormatGGUF, []steer.Vector{{Hook: "post_block", Layer: 0, Scale: 1, Data: data}}, ErrUnrepresentable},
		{"npy two hooks", FormatNpy, []steer.Vector{{Hook: "mlp_out", Layer: 1, Scale: 1, Data: data}, {Hook: "mlp_in", Layer: 1, Scale: 1, Data: data}}, ErrUnrepresentable},
		{"empty", FormatNpz, nil, steer.ErrEmptySet},
		{"hidden", FormatSafetensors, []steer.Vector{{Hook: "mlp_out", Layer: 1, Scale: 1, Data: data[:7]}}, steer.ErrHiddenSize},
		{"layer", FormatSafetensors, []steer.Vector{{Hook: "mlp_out", Layer: 6, Scale: 1, Data: data}}, steer.ErrLayerRange},
		{"hook", FormatSafetensors, []steer.Vector{{Hook: "nope", Layer: 1, Scale: 1, Data: data}}, steer.ErrUnknownHook},
		{"nan", FormatSafetensors, []steer.Vector{{Hook: "mlp_out", Layer: 1, Scale: float32(math.NaN()), Data: data}}, steer.ErrNonFinite},
		{"dup", FormatNpz, []steer.Vector{{Hook: "mlp_out", Layer: 1, Scale: 1, Data: data}, {Hook: "mlp_out", Layer: 1, Scale: 1, Data: data}}, steer.ErrDuplicate},
		{"format", Format("pt"), []steer.Vector{{Hook: "mlp_out", Layer: 1, Scale: 1, Data: data}}, ErrUnknownFormat},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		err := Export(&buf, c.format, testCfg, c.vecs, ExportOptions{})
		require.ErrorIs(t, err, c.want, c.name)
	}
	path := filepath.Join(t.TempDir(), "x.gguf")
	require.ErrorIs(t, ExportFile(path, FormatAuto, testCfg, cases[0].vecs, ExportOptions{}), ErrUnrepresentable)
	require.NoFileExists(t, path)
}

func TestSizeCap(t *testing.T) {
	b := controlVector(8, map[int][]float32{1: {1, 2, 3, 4, 5, 6, 7, 8}})
	path := writeTemp(t, "cv.gguf", b)
	_, err := Import(path, testCfg, ImportOptions{MaxBytes: int64(len(b) - 1)})
	require.ErrorIs(t, err, ErrTooLarge)
	_, err = ImportReader(bytes.NewReader(b), "up.gguf", testCfg, ImportOptions{MaxBytes: int64(len(b) - 1)})
	require.ErrorIs(t, err, ErrTooLarge)
	vecs, err := ImportReader(bytes.NewReader(b), "up.gguf", testCfg, ImportOptions{MaxBytes: int64(len(b))})
	require.NoError(t, err)
	require.Len(t, vecs, 1)
}

func TestErrorsNameFileTensorAndShape(t *testing.T) {
	b := controlVector(7, map[int][]float32{3: make([]float32, 7)})
	path := writeTemp(t, "wrong.gguf", b)
	_, err := Import(path, testCfg, ImportOptions{})
	require.ErrorIs(t, err, ErrShape)
	require.ErrorIs(t, err, steer.ErrHiddenSize)
	require.Contains(t, err.Error(), path)
	require.Contains(t, err.Error(), `"direction.3"`)
	require.Contains(t, err.Error(), "[7]")
	require.Contains(t, err.Error(), "want [8]")
}

// TestWritersMatchSpecBuilders: our GGUF and .npy writers produce exactly the bytes of the
// test's byte-by-byte builders written from the specifications.
func TestWritersMatchSpecBuilders(t *testing.T) {
	r := newRand(51)
	dirs := map[int][]float32{1: randVec(r, 8), 3: randVec(r, 8), 5: randVec(r, 8)}
	var vecs []steer.Vector
	rows := make([]byte, 0, 6*8*4)
	for l := range testCfg.Layers {
		if d, ok := dirs[l]; ok {
			vecs = append(vecs, steer.Vector{Hook: "post_block", Layer: l, Scale: 1, Data: d})
			rows = append(rows, f32Bytes(d)...)
		} else {
			rows = append(rows, make([]byte, 8*4)...)
		}
	}
	var buf bytes.Buffer
	require.NoError(t, Export(&buf, FormatGGUF, testCfg, vecs, ExportOptions{ModelHint: "llama"}))
	require.Equal(t, controlVector(8, dirs), buf.Bytes())

	buf.Reset()
	require.NoError(t, Export(&buf, FormatNpy, testCfg, vecs, ExportOptions{}))
	require.Equal(t, buildNpy("<f4", "(6, 8)", rows), buf.Bytes())
}

// TestImportFromPipe: a path that is not a regular file (a pipe, /dev/stdin) is read under the
// cap instead of mapped.
func TestImportFromPipe(t *testing.T) {
	b := controlVector(8, map[int][]float32{2: ones(8)})
	for _, c := range []struct {
		capBytes int64
		want     error
	}{{0, nil}, {int64(len(b) - 1), ErrTooLarge}} {
		r, w, err := os.Pipe()
		require.NoError(t, err)
		go func() {
			_, _ = w.Write(b)
			w.Close()
		}()
		vecs, err := Import(fmt.Sprintf("/proc/self/fd/%d", r.Fd()), testCfg, ImportOptions{Format: FormatGGUF, MaxBytes: c.capBytes})
		r.Close()
		if c.want != nil {
			require.ErrorIs(t, err, c.want)
			continue
		}
		require.NoError(t, err)
		requireBitwise(t, []steer.Vector{{Hook: "post_block", Layer: 2, Scale: 1, Data: ones(8)}}, vecs)
	}
}
