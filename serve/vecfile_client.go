package serve

import (
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// ImportFlags are the options of `shmsteer vectors import`, as llama.cpp names them.
type ImportFlags struct {
	Scale   float32 // --scale (llama.cpp's --control-vector-scaled); 0 is refused, 1 by default
	Layers  string  // --layers A-B (llama.cpp's --control-vector-layer-range), "" = all
	Hook    string  // --hook, "" = post_block
	Format  string  // --format, "" = detect
	MaxSize int64   // --max-bytes, 0 = vecfile.DefaultMaxBytes
	// ModelHint (--model-hint) replaces the files' GGUF model hint when not nil.
	ModelHint *string
}

// VectorImport reads the vector files paths (several GGUF control vectors are summed, as
// llama.cpp sums repeated --control-vector flags) and registers the result as name.
func (cs *ClientSession) VectorImport(w io.Writer, name string, paths []string, f ImportFlags) error {
	if f.Scale == 0 {
		return fmt.Errorf("%w: --scale 0 would steer nothing; give a non-zero scale (default 1)", vecfile.ErrBadOptions)
	}
	opts := vecfile.ImportOptions{Scale: 1, Hook: f.Hook, Format: vecfile.Format(strings.ToLower(f.Format)), MaxBytes: f.MaxSize}
	if f.Layers != "" {
		r, err := vecfile.ParseLayerRange(f.Layers)
		if err != nil {
			return err
		}
		opts.Layers = &r
	}
	srcs := make([]vecfile.Source, len(paths))
	for i, p := range paths {
		srcs[i] = vecfile.Source{Path: p, Scale: f.Scale}
	}
	vecs, err := vecfile.ImportFiles(srcs, cs.Engine.Config(), opts)
	if err != nil {
		return err
	}
	hint := vecfile.FileModelHint(paths...)
	if f.ModelHint != nil {
		hint = *f.ModelHint
	} else if err := steer.CheckModelHint(hint); err != nil {
		return fmt.Errorf("the files' controlvector.model_hint: %w (give --model-hint to replace it)", err)
	}
	info, err := cs.Engine.Register(name, vecs, steer.ModelHint(hint))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "registered %s: %d vectors, version %d, digest %s\n", info.Name, len(vecs), info.Version, hex.EncodeToString(info.Digest[:]))
	if hint != "" {
		fmt.Fprintf(w, "model hint %q stored with it (GGUF controlvector.model_hint; export writes it back)\n", hint)
	}
	return nil
}

// VectorExport writes a named vector to path in format (detected from the extension when
// empty), read at one snapshot, with its stored model hint unless modelHint is not nil.
func (cs *ClientSession) VectorExport(w io.Writer, name, path, format, hook string, modelHint *string) error {
	snap, err := cs.Engine.Region().Snapshot()
	if err != nil {
		return err
	}
	defer snap.Close() // the vectors alias the region until then
	nv, err := cs.Engine.Vector(&snap, name)
	if err != nil {
		return err
	}
	m, err := cs.Engine.VectorMeta(&snap, name)
	if err != nil {
		return err
	}
	if modelHint != nil {
		m.ModelHint = *modelHint
	}
	err = vecfile.ExportFile(path, vecfile.Format(strings.ToLower(format)), cs.Engine.Config(), nv.Vectors, vecfile.ExportOptions{Hook: hook, ModelHint: m.ModelHint})
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "exported %s (version %d) to %s\n", name, nv.Version, path)
	return nil
}
