package vecfile_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// Import a llama.cpp control vector as --control-vector-scaled happy.gguf 0.5 with
// --control-vector-layer-range 2 3 would, then hand it to Engine.Register.
func ExampleImport() {
	dir, _ := os.MkdirTemp("", "vecfile")
	defer os.RemoveAll(dir)
	cfg := steer.ModelConfig{Hidden: 4, Layers: 4}
	path := filepath.Join(dir, "happy.gguf")
	_ = vecfile.ExportFile(path, vecfile.FormatAuto, cfg, []steer.Vector{
		{Hook: "post_block", Layer: 1, Scale: 1, Data: []float32{1, 0, 0, 0}},
		{Hook: "post_block", Layer: 2, Scale: 1, Data: []float32{0, 2, 0, 0}},
		{Hook: "post_block", Layer: 3, Scale: 1, Data: []float32{0, 0, 4, 0}},
	}, vecfile.ExportOptions{ModelHint: "llama"})

	vecs, err := vecfile.Import(path, cfg, vecfile.ImportOptions{Scale: 0.5, Layers: &vecfile.LayerRange{First: 2, Last: 3}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, v := range vecs {
		fmt.Println(v.Hook, v.Layer, v.Data)
	}
	// eng.Register("happy", vecs), then reference it: steer.Ref{Name: "happy", Strength: 1}.

	// Output:
	// post_block 2 [0 1 0 0]
	// post_block 3 [0 0 2 0]
}
