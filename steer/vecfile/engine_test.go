package vecfile_test

import (
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// TestSteerWithImportedControlVector is the README's flow: a llama.cpp control vector is
// imported at a scale, registered as a named vector, referenced by a request, and a step adds
// scale × direction.N to that request's rows at (post_block, layer N) and nowhere else.
func TestSteerWithImportedControlVector(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 16, Layers: 4}
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 10, ArenaBytes: 4 << 20, ReaderSlots: 8})
	require.NoError(t, err)
	region, err := shm.Create(rc)
	require.NoError(t, err)
	defer region.Close()
	eng, err := steer.Open(region, &cfg, steer.Options{Logf: t.Logf})
	require.NoError(t, err)

	// A control vector as llama.cpp's cvector-generator writes it (via our exporter), with
	// directions for layers 1..3.
	dirs := map[int][]float32{}
	var vecs []steer.Vector
	for l := 1; l < cfg.Layers; l++ {
		d := make([]float32, cfg.Hidden)
		for i := range d {
			d[i] = float32(l*100 + i)
		}
		dirs[l] = d
		vecs = append(vecs, steer.Vector{Hook: "post_block", Layer: l, Scale: 1, Data: d})
	}
	path := filepath.Join(t.TempDir(), "happy.gguf")
	require.NoError(t, vecfile.ExportFile(path, vecfile.FormatAuto, cfg, vecs, vecfile.ExportOptions{ModelHint: "llama"}))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "GGUF", string(b[:4]))
	require.Equal(t, uint32(3), binary.LittleEndian.Uint32(b[4:]))

	imported, err := vecfile.Import(path, cfg, vecfile.ImportOptions{Scale: 0.5, Layers: &vecfile.LayerRange{First: 2, Last: 3}})
	require.NoError(t, err)
	_, err = eng.Register("happy", imported)
	require.NoError(t, err)
	_, err = eng.Admit(steer.Admission{RequestID: "r1", Override: &steer.Steering{Base: steer.Tier{Refs: []steer.Ref{{Name: "happy", Strength: 1}}}}})
	require.NoError(t, err)

	post, err := cfg.Hook("post_block")
	require.NoError(t, err)
	st := eng.NewStepper()
	defer st.Close()
	require.NoError(t, st.Begin(0))
	batch := []steer.Span{{ID: "r1", Start: 0, End: 1, Phase: steer.PhaseDecode}}
	for l := range cfg.Layers {
		h := make([]float32, cfg.Hidden)
		require.NoError(t, st.Apply(post, l, h, batch))
		for i := range h {
			want := float32(0)
			if l >= 2 {
				want = float32(dirs[l][i] * 0.5)
			}
			require.Equal(t, math.Float32bits(want), math.Float32bits(h[i]), "layer %d element %d", l, i)
		}
	}
	st.End()
}
