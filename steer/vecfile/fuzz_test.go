package vecfile

import (
	"archive/zip"
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// fuzzImport imports b as format f; on success the vectors must pass the model's checks and
// survive export → import bit for bit.
func fuzzImport(t *testing.T, f Format, b []byte, opts ImportOptions) {
	opts.Format = f
	opts.MaxBytes = 1 << 20
	vecs, err := ImportBytes(b, "fuzz", testCfg, opts)
	if err != nil {
		require.NotContains(t, err.Error(), parserPanicked)
		require.Contains(t, err.Error(), "shmsteer:")
		return
	}
	require.NotEmpty(t, vecs)
	require.NoError(t, checkExport(testCfg, vecs))
	if f == FormatNpy && len(onlyHook(vecs, vecs[0].Hook)) != len(vecs) {
		f = FormatNpz
	}
	var buf bytes.Buffer
	require.NoError(t, Export(&buf, f, testCfg, vecs, ExportOptions{Hook: opts.Hook}))
	again, err := ImportBytes(buf.Bytes(), "again", testCfg, opts)
	require.NoError(t, err)
	requireBitwise(t, vecs, again)
}

func exported(f Format, vecs []steer.Vector) []byte {
	var buf bytes.Buffer
	if err := Export(&buf, f, testCfg, vecs, ExportOptions{ModelHint: "llama"}); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

func FuzzGGUF(f *testing.F) {
	set := exampleSet(newRand(21))
	f.Add(exported(FormatGGUF, onlyHook(set, "post_block")), uint8(0))
	f.Add(controlVector(8, map[int][]float32{1: ones(8), 4: ones(8)}), uint8(1))
	f.Add(buildGGUF([]ggufKV{kvU32("general.alignment", 64), {"a", ggufArray, binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint32(nil, ggufString), 1)}}, nil, 64), uint8(2))
	f.Add(oneDir("direction.1", []uint64{8, 1}, 0, f32Bytes(ones(8))), uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, sel uint8) {
		opts := ImportOptions{}
		if sel&1 != 0 {
			opts.Layers = &LayerRange{1, 3}
		}
		if sel&2 != 0 {
			opts.Hook = "mlp_out"
		}
		fuzzImport(t, FormatGGUF, b, opts)
	})
}

func FuzzNpy(f *testing.F) {
	set := exampleSet(newRand(22))
	f.Add(exported(FormatNpy, onlyHook(set, "post_block")))
	f.Add(buildNpy("<f2", "(8,)", make([]byte, 16)))
	f.Add(buildNpy(">f8", "(6, 8)", make([]byte, 6*8*8)))
	f.Add([]byte("\x93NUMPY\x02\x00\x10\x00\x00\x00{'descr': '<f4'}\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzImport(t, FormatNpy, b, ImportOptions{Layers: &LayerRange{0, 5}})
	})
}

func FuzzNpz(f *testing.F) {
	set := exampleSet(newRand(23))
	f.Add(exported(FormatNpz, set))
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	w, _ := zw.CreateHeader(&zip.FileHeader{Name: "mlp_in.npy", Method: zip.Deflate})
	_, _ = w.Write(exported(FormatNpy, onlyHook(set, "mlp_in")))
	_ = zw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzImport(t, FormatNpz, b, ImportOptions{})
	})
}

func FuzzSafetensors(f *testing.F) {
	set := exampleSet(newRand(24))
	f.Add(exported(FormatSafetensors, set))
	f.Add(buildSafetensors([]stTensor{{"layers.2", "BF16", []int{8}, make([]byte, 16)}, {"mlp_out", "F16", []int{6, 8}, make([]byte, 96)}}))
	f.Add(buildSafetensors([]stTensor{{"layers.1.pre_attn", "F64", []int{1, 8}, make([]byte, 64)}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzImport(t, FormatSafetensors, b, ImportOptions{})
	})
}
