package vecfile

import (
	"encoding/binary"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

const python = "/usr/bin/python3"

func requireNumpy(t *testing.T) {
	t.Helper()
	if err := exec.Command(python, "-c", "import numpy").Run(); err != nil {
		t.Skipf("skipped: %s with numpy is not available (%v); apt-get install python3-numpy", python, err)
	}
}

func runPython(t *testing.T, dir, script string) {
	t.Helper()
	cmd := exec.Command(python, "-c", script)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "python: %s", out)
}

func readRawF32(t *testing.T, path string) []float32 {
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// TestNumpyWritesWeRead: arrays written by numpy (np.save, np.savez, np.savez_compressed, in
// float16/32/64, C and Fortran order, either byte order) import to numpy's own float32
// conversion, bit for bit.
func TestNumpyWritesWeRead(t *testing.T) {
	requireNumpy(t)
	dir := t.TempDir()
	runPython(t, dir, `
import numpy as np
rng = np.random.default_rng(7)
a = rng.standard_normal((6, 8))
a[0] = 0
np.save("f32.npy", a.astype(np.float32))
np.save("f64.npy", a)
np.save("f16.npy", a.astype(np.float16))
np.save("be.npy", a.astype(">f4"))
np.save("fortran.npy", np.asfortranarray(a.astype(np.float32)))
np.save("one.npy", a[3].astype(np.float32))
np.savez("set.npz", post_block=a.astype(np.float32), mlp_out=(2 * a).astype(np.float32))
np.savez_compressed("setz.npz", post_block=a.astype(np.float32), mlp_out=(2 * a).astype(np.float32))
np.savez("positional.npz", a.astype(np.float32))
for name, x in [("f32", a.astype(np.float32)), ("f64", a.astype(np.float32)), ("f16", a.astype(np.float16).astype(np.float32)), ("mlp", (2 * a).astype(np.float32))]:
    x.astype("<f4").tofile(name + ".raw")
`)
	cfg := steer.ModelConfig{Hidden: 8, Layers: 6}
	rows := func(raw string, hook string, layers ...int) []steer.Vector {
		all := readRawF32(t, filepath.Join(dir, raw))
		var vs []steer.Vector
		for _, l := range layers {
			vs = append(vs, steer.Vector{Hook: hook, Layer: l, Scale: 1, Data: all[l*8 : (l+1)*8]})
		}
		return vs
	}
	cases := []struct {
		file string
		opts ImportOptions
		want []steer.Vector
	}{
		{"f32.npy", ImportOptions{}, rows("f32.raw", "post_block", 1, 2, 3, 4, 5)},
		{"f64.npy", ImportOptions{}, rows("f64.raw", "post_block", 1, 2, 3, 4, 5)},
		{"f16.npy", ImportOptions{Hook: "mlp_in"}, rows("f16.raw", "mlp_in", 1, 2, 3, 4, 5)},
		{"be.npy", ImportOptions{}, rows("f32.raw", "post_block", 1, 2, 3, 4, 5)},
		{"fortran.npy", ImportOptions{Layers: &LayerRange{2, 4}}, rows("f32.raw", "post_block", 2, 3, 4)},
		{"set.npz", ImportOptions{}, append(rows("f32.raw", "post_block", 1, 2, 3, 4, 5), rows("mlp.raw", "mlp_out", 1, 2, 3, 4, 5)...)},
		{"setz.npz", ImportOptions{}, append(rows("f32.raw", "post_block", 1, 2, 3, 4, 5), rows("mlp.raw", "mlp_out", 1, 2, 3, 4, 5)...)},
		{"positional.npz", ImportOptions{Hook: "pre_attn"}, rows("f32.raw", "pre_attn", 1, 2, 3, 4, 5)},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			got, err := Import(filepath.Join(dir, c.file), cfg, c.opts)
			require.NoError(t, err)
			requireBitwise(t, c.want, got)
		})
	}
	one := rows("f32.raw", "post_block", 3)[0].Data
	got, err := Import(filepath.Join(dir, "one.npy"), cfg, ImportOptions{Layers: &LayerRange{1, 2}})
	require.NoError(t, err)
	requireBitwise(t, []steer.Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: one}, {Hook: "post_block", Layer: 2, Scale: 1, Data: one}}, got)
}

// TestNumpyReadsWhatWeWrite: numpy loads our .npy and .npz exports with the exact bits.
func TestNumpyReadsWhatWeWrite(t *testing.T) {
	requireNumpy(t)
	dir := t.TempDir()
	set := exampleSet(newRand(31))
	cfg := testCfg
	require.NoError(t, ExportFile(filepath.Join(dir, "pb.npy"), FormatAuto, cfg, onlyHook(set, "post_block"), ExportOptions{}))
	require.NoError(t, ExportFile(filepath.Join(dir, "all.npz"), FormatAuto, cfg, set, ExportOptions{}))
	// The expected arrays, as raw little-endian float32 [layers, hidden] per hook.
	for _, h := range steer.DefaultHooks {
		raw := make([]byte, cfg.Layers*cfg.Hidden*4)
		for _, v := range onlyHook(set, h) {
			copy(raw[v.Layer*cfg.Hidden*4:], f32Bytes(v.Data))
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, h+".raw"), raw, 0o644))
	}
	// np.save of the same array writes the same bytes as our export.
	runPython(t, dir, `
import numpy as np
np.save("np_pb.npy", np.fromfile("post_block.raw", dtype="<f4").reshape(6, 8))
`)
	ours, err := os.ReadFile(filepath.Join(dir, "pb.npy"))
	require.NoError(t, err)
	theirs, err := os.ReadFile(filepath.Join(dir, "np_pb.npy"))
	require.NoError(t, err)
	require.Equal(t, theirs, ours)

	runPython(t, dir, `
import numpy as np
def raw(h):
    return np.fromfile(h + ".raw", dtype="<f4").reshape(6, 8)
pb = np.load("pb.npy")
assert pb.dtype == np.float32 and pb.shape == (6, 8), (pb.dtype, pb.shape)
assert pb.view(np.uint32).tobytes() == raw("post_block").view(np.uint32).tobytes()
z = np.load("all.npz")
assert sorted(z.files) == sorted(["pre_attn", "post_attn", "post_block", "mlp_in", "mlp_out"]), z.files
for h in z.files:
    assert z[h].dtype == np.float32 and z[h].shape == (6, 8)
    assert z[h].tobytes() == raw(h).tobytes(), h
`)
}
