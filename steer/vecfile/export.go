package vecfile

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"

	"github.com/shmsteer/shmsteer/steer"
)

// ExportOptions control Export.
type ExportOptions struct {
	// ModelHint is written as controlvector.model_hint in GGUF (llama.cpp's generator writes
	// the model's architecture, e.g. "llama").
	ModelHint string
	// Hook is the hook written as GGUF direction.N; "" means DefaultHook (post_block).
	Hook string
}

// Export writes vecs (as steer.Engine.Register takes them, for a model of config cfg) to w in
// format f:
//
//   - FormatGGUF: a llama.cpp control vector, direction.N = the vector at (opts.Hook, layer N);
//     vectors of other hooks, or at layer 0, are ErrUnrepresentable.
//   - FormatNpy: one hook only, a float32 [layers, hidden] array with zero rows where there is
//     no vector.
//   - FormatNpz: one [layers, hidden] float32 array per hook that has vectors, named by the
//     hook ("post_block.npy" in the zip, uncompressed, as np.savez).
//   - FormatSafetensors: one F32 [hidden] tensor per vector named "<hook>.<layer>".
//
// Each vector's Scale is multiplied into the data written (nothing is multiplied when it is
// 1, so imported vectors round-trip bitwise). Nothing is written if vecs fail the checks.
func Export(w io.Writer, f Format, cfg steer.ModelConfig, vecs []steer.Vector, opts ExportOptions) error {
	if err := checkExport(cfg, vecs); err != nil {
		return err
	}
	switch f {
	case FormatGGUF:
		hook := opts.Hook
		if hook == "" {
			hook = DefaultHook
		}
		if _, err := cfg.Hook(hook); err != nil {
			return fmt.Errorf("%w (export hook)", err)
		}
		return writeGGUF(w, cfg, vecs, hook, opts.ModelHint)
	case FormatNpy:
		for _, v := range vecs {
			if v.Hook != vecs[0].Hook {
				return fmt.Errorf("%w: .npy holds one hook, the vectors have %s and %s: use npz or safetensors", ErrUnrepresentable, vecs[0].Hook, v.Hook)
			}
		}
		return writeNpy(w, cfg, vecs)
	case FormatNpz:
		return writeNpz(w, cfg, vecs)
	case FormatSafetensors:
		return writeSafetensors(w, vecs)
	}
	return fmt.Errorf("%w: %q (want gguf, npy, npz or safetensors)", ErrUnknownFormat, f)
}

// ExportFile writes vecs to path (created or truncated, mode 0644) in format f, or, for
// FormatAuto, the format of path's extension (.gguf, .npy, .npz, .safetensors). On error the
// partial file is removed.
func ExportFile(path string, f Format, cfg steer.ModelConfig, vecs []steer.Vector, opts ExportOptions) (err error) {
	if f == FormatAuto {
		var ok bool
		if f, ok = formatOfExt(path); !ok {
			return fmt.Errorf("%w: %s: extension %q (want .gguf, .npy, .npz or .safetensors)", ErrUnknownFormat, path, filepath.Ext(path))
		}
	}
	if err := checkExport(cfg, vecs); err != nil {
		return err
	}
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("vecfile: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	return Export(out, f, cfg, vecs, opts)
}

// checkExport applies steer.Engine.Register's checks, so a file is never written from vectors
// the engine would refuse.
func checkExport(cfg steer.ModelConfig, vecs []steer.Vector) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if len(vecs) == 0 {
		return fmt.Errorf("%w: nothing to export", steer.ErrEmptySet)
	}
	seen := map[[2]int]bool{}
	for _, v := range vecs {
		id, err := cfg.Hook(v.Hook)
		if err != nil {
			return err
		}
		if v.Layer < 0 || v.Layer >= cfg.Layers {
			return fmt.Errorf("%w: %s layer %d, the model has layers 0..%d", steer.ErrLayerRange, v.Hook, v.Layer, cfg.Layers-1)
		}
		if len(v.Data) != cfg.Hidden {
			return fmt.Errorf("%w: %s layer %d has %d values, want %d", steer.ErrHiddenSize, v.Hook, v.Layer, len(v.Data), cfg.Hidden)
		}
		k := [2]int{int(id), v.Layer}
		if seen[k] {
			return fmt.Errorf("%w: %s layer %d", steer.ErrDuplicate, v.Hook, v.Layer)
		}
		seen[k] = true
		if v.Scale-v.Scale != 0 || !allFinite(scaled(v)) {
			return fmt.Errorf("%w: %s layer %d (scale %v times the data)", steer.ErrNonFinite, v.Hook, v.Layer, v.Scale)
		}
	}
	return nil
}

// scaled is Scale*Data (Data itself when Scale is 1).
func scaled(v steer.Vector) []float32 {
	if v.Scale == 1 {
		return v.Data
	}
	out := make([]float32, len(v.Data))
	for i, x := range v.Data {
		out[i] = float32(x * v.Scale)
	}
	return out
}

func writeF32(w *bufio.Writer, v []float32) error {
	var b [4]byte
	for _, f := range v {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(f))
		if _, err := w.Write(b[:]); err != nil {
			return err
		}
	}
	return nil
}
