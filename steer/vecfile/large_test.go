package vecfile

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// The large-file measurements run in a child process (this test binary re-executed), so the
// peak resident set (VmHWM) is the import's alone. They write a 1 GiB file, so they run only
// with SHMSTEER_VECFILE_LARGE=1:
//
//	SHMSTEER_VECFILE_LARGE=1 go test -run TestLargeImport -v ./steer/vecfile/

const largeEnv = "SHMSTEER_VECFILE_LARGE"

func vmHWMKiB(t testing.TB) int64 {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			n, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// TestLargeImportChild is the child: it imports one file and prints its figures.
func TestLargeImportChild(t *testing.T) {
	path := os.Getenv("VECFILE_CHILD_FILE")
	if path == "" {
		t.Skip("skipped: runs only as the child of TestLargeImport")
	}
	hidden, _ := strconv.Atoi(os.Getenv("VECFILE_CHILD_HIDDEN"))
	layers, _ := strconv.Atoi(os.Getenv("VECFILE_CHILD_LAYERS"))
	releaseMapped = os.Getenv("VECFILE_CHILD_NORELEASE") == ""
	before := vmHWMKiB(t)
	start := time.Now()
	vecs, err := Import(path, steer.ModelConfig{Hidden: hidden, Layers: layers}, ImportOptions{})
	elapsed := time.Since(start)
	require.NoError(t, err)
	var sum float64
	for _, v := range vecs {
		sum += float64(v.Data[len(v.Data)-1])
	}
	fmt.Printf("RESULT vectors=%d import_ms=%.1f hwm_before_kib=%d hwm_after_kib=%d check=%g\n",
		len(vecs), float64(elapsed.Microseconds())/1000, before, vmHWMKiB(t), sum)
}

type childFigures struct {
	vectors             int
	importMs            float64
	hwmBefore, hwmAfter int64
}

func runChild(t *testing.T, path string, hidden, layers int, noRelease bool) childFigures {
	cmd := exec.Command(os.Args[0], "-test.run=^TestLargeImportChild$", "-test.v")
	cmd.Env = append(os.Environ(), "VECFILE_CHILD_FILE="+path, "VECFILE_CHILD_HIDDEN="+strconv.Itoa(hidden), "VECFILE_CHILD_LAYERS="+strconv.Itoa(layers))
	if noRelease {
		cmd.Env = append(cmd.Env, "VECFILE_CHILD_NORELEASE=1")
	}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var f childFigures
	var check float64
	i := bytes.Index(out, []byte("RESULT "))
	require.GreaterOrEqual(t, i, 0, "%s", out)
	_, err = fmt.Sscanf(string(out[i:]), "RESULT vectors=%d import_ms=%g hwm_before_kib=%d hwm_after_kib=%d check=%g", &f.vectors, &f.importMs, &f.hwmBefore, &f.hwmAfter, &check)
	require.NoError(t, err, "%s", out)
	return f
}

// writeLargeSafetensors streams a safetensors file of layers F32 [hidden] tensors
// "layers.N" without holding it in memory.
func writeLargeSafetensors(t *testing.T, path string, hidden, layers int) {
	hdr := map[string]any{}
	size := hidden * 4
	for l := range layers {
		hdr["layers."+strconv.Itoa(l)] = map[string]any{"dtype": "F32", "shape": []int{hidden}, "data_offsets": []int{l * size, (l + 1) * size}}
	}
	j, err := json.Marshal(hdr)
	require.NoError(t, err)
	f, err := os.Create(path)
	require.NoError(t, err)
	w := bufio.NewWriterSize(f, 1<<20)
	_, _ = w.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(j))))
	_, _ = w.Write(j)
	row := make([]byte, size)
	for l := range layers {
		for i := 0; i < hidden; i++ {
			binary.LittleEndian.PutUint32(row[4*i:], math.Float32bits(float32(l+1)+float32(i)/float32(hidden)))
		}
		_, err := w.Write(row)
		require.NoError(t, err)
	}
	require.NoError(t, w.Flush())
	require.NoError(t, f.Close())
}

func TestLargeImport(t *testing.T) {
	if os.Getenv(largeEnv) == "" || testing.Short() {
		t.Skipf("skipped: writes a 1 GiB file; set %s=1 to run", largeEnv)
	}
	dir := t.TempDir() // removed (with the files) when the test ends

	// A 32-layer × 4096 llama.cpp control vector: direction.1..31.
	dirs := map[int][]float32{}
	r := newRand(41)
	for l := 1; l < 32; l++ {
		dirs[l] = randVec(r, 4096)
	}
	gg := filepath.Join(dir, "cv.gguf")
	require.NoError(t, os.WriteFile(gg, controlVector(4096, dirs), 0o644))
	g := runChild(t, gg, 4096, 32, false)
	require.Equal(t, 31, g.vectors)
	t.Logf("GGUF 32 layers x 4096 (%d KiB): import %.1f ms, VmHWM %d KiB before, %d KiB after", 31*4096*4/1024, g.importMs, g.hwmBefore, g.hwmAfter)

	// 1 GiB safetensors: 16384 tensors of F32 [16384].
	const hidden, layers = 16384, 16384
	st := filepath.Join(dir, "big.safetensors")
	writeLargeSafetensors(t, st, hidden, layers)
	fi, err := os.Stat(st)
	require.NoError(t, err)
	fileKiB := fi.Size() / 1024
	s := runChild(t, st, hidden, layers, false)
	require.Equal(t, layers, s.vectors)
	t.Logf("safetensors %d MiB (%d x %d F32): import %.0f ms, VmHWM %d MiB before, %d MiB after (growth %.2f x file)",
		fileKiB/1024, layers, hidden, s.importMs, s.hwmBefore/1024, s.hwmAfter/1024, float64(s.hwmAfter-s.hwmBefore)/float64(fileKiB))
	noRel := runChild(t, st, hidden, layers, true)
	t.Logf("  same without releasing mapped pages: import %.0f ms, VmHWM %d MiB after (growth %.2f x file)",
		noRel.importMs, noRel.hwmAfter/1024, float64(noRel.hwmAfter-noRel.hwmBefore)/float64(fileKiB))
	again := runChild(t, st, hidden, layers, false)
	t.Logf("  again with release: import %.0f ms, VmHWM %d MiB after", again.importMs, again.hwmAfter/1024)
	// The result is one copy of the file's floats; the file itself must not be held too.
	require.Less(t, float64(s.hwmAfter-s.hwmBefore), 1.25*float64(fileKiB), "the import held the file in memory twice")
}

// BenchmarkImportGGUF32x4096 imports a 32-layer × 4096 control vector from a file.
//
//	go test -run '^$' -bench ImportGGUF -benchmem ./steer/vecfile/
func BenchmarkImportGGUF32x4096(b *testing.B) {
	dirs := map[int][]float32{}
	r := newRand(42)
	for l := 1; l < 32; l++ {
		dirs[l] = randVec(r, 4096)
	}
	path := filepath.Join(b.TempDir(), "cv.gguf")
	data := controlVector(4096, dirs)
	require.NoError(b, os.WriteFile(path, data, 0o644))
	cfg := steer.ModelConfig{Hidden: 4096, Layers: 32}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		vecs, err := Import(path, cfg, ImportOptions{})
		if err != nil || len(vecs) != 31 {
			b.Fatal(err, len(vecs))
		}
	}
}

// BenchmarkImportSafetensors64MiB imports a 64 MiB safetensors file (1024 × F32 [16384]).
//
//	go test -run '^$' -bench ImportSafetensors -benchmem ./steer/vecfile/
func BenchmarkImportSafetensors64MiB(b *testing.B) {
	const hidden, layers = 16384, 1024
	path := filepath.Join(b.TempDir(), "x.safetensors")
	t := &testing.T{}
	writeLargeSafetensors(t, path, hidden, layers)
	fi, err := os.Stat(path)
	require.NoError(b, err)
	b.SetBytes(fi.Size())
	cfg := steer.ModelConfig{Hidden: hidden, Layers: layers}
	for b.Loop() {
		vecs, err := Import(path, cfg, ImportOptions{})
		if err != nil || len(vecs) != layers {
			b.Fatal(err, len(vecs))
		}
	}
}
