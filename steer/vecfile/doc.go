// Package vecfile imports and exports steering vectors in the files steering tools already
// write: llama.cpp GGUF control vectors (cvector-generator, repeng), NumPy .npy/.npz and
// safetensors. It owns only file parsing and writing: it returns []steer.Vector for
// steer.Engine.Register and takes them back for export; it does not touch the region, the
// engine or any socket, and it does not import unsafe (it maps files with mmap-go).
//
// # API
//
//	vecs, err := vecfile.Import("happy.gguf", eng.Config(), vecfile.ImportOptions{Scale: 0.8})
//	info, err := eng.Register("happy", vecs)
//	err = vecfile.ExportFile("happy.npz", vecfile.FormatAuto, eng.Config(), nv.Vectors, vecfile.ExportOptions{})
//
// Import(path, cfg, opts) reads one file; ImportFiles([]Source{{path, scale}, ...}, cfg, opts)
// sums several as llama.cpp does with repeated --control-vector / --control-vector-scaled
// (opts applies to every file; a forced Format too);
// ImportBytes and ImportReader (capped at opts.MaxBytes) serve uploads; Detect names a
// format. ImportOptions: Format (auto: magic bytes, then extension), Scale (0 means 1),
// Layers (*LayerRange, inclusive, as --control-vector-layer-range A B; ParseLayerRange parses
// "A-B"), Hook (the hook GGUF and plain arrays steer, default post_block) and MaxBytes (the
// size cap, checked before reading; default 4 GiB). Export(w, format, cfg, vecs, opts) and
// ExportFile(path, format or auto by extension, ...) write gguf, npy, npz or safetensors.
// Import → Export → Import is bitwise lossless in every format.
//
// The imported vectors are sorted by (hook order, layer), have Scale 1 (the scales are
// multiplied into Data as llama.cpp does at load), and pass Register's checks: hidden size,
// known hook, layer in 0..Layers-1, finite values, no (hook, layer) twice. Rows that are all
// zero steer nothing and are dropped (a [layers, hidden] array usually has some); a file that
// steers nothing is ErrNoVectors.
//
// # Hooks: what each steers
//
// Layer L is the L-th transformer block counted from 0, the same index llama.cpp's graph uses
// (il in build_cvec). Per block, with h the residual stream entering the block:
//
//	pre_attn    h, the residual entering the attention sub-block (before its norm)
//	post_attn   h + attn(norm(h)): the residual after the attention output is added
//	mlp_in      norm(h + attn(...)): the normalised input of the MLP
//	mlp_out     mlp(mlp_in): the MLP branch output, before it is added to the residual
//	post_block  the block output, h + attn + mlp (llama.cpp's "l_out"), which is the next
//	            block's input
//
// # GGUF control vectors (llama.cpp)
//
// llama.cpp writes general.architecture = "controlvector", controlvector.model_hint (the
// model's architecture: ModelHint reads it; Import returns vectors only, so a caller keeps
// it with the vector, steer.ModelHint, and passes it back in ExportOptions.ModelHint, as
// `shmsteer vectors import/export` and serve's API do), controlvector.layer_count and one F32 tensor "direction.N" of the
// hidden size per layer. Its loader rejects direction.0 and non-F32 or non-1-D tensors, and
// its graph adds tensors[N] = direction.N to the output of block N (0-based: cur =
// build_cvec(cur, il) after the FFN residual add), so block 0's output is never steered. So
// direction.N maps to (post_block, layer N) here — or to (opts.Hook, N) — and the layer range
// A-B keeps N in [A, B] exactly as --control-vector-layer-range does. Differences from
// llama.cpp, all refusals of what it accepts silently: a direction for a layer the model does
// not have is ErrLayerRange (llama.cpp ignores it); N must be written without leading zeros;
// general.architecture, if present, must be "controlvector" (a model file is refused);
// tensors must not overlap. Metadata other than general.alignment is not needed. Export
// writes GGUF v3 with the three keys above (layer_count = number of directions, int32, as
// cvector-generator) and refuses vectors at layer 0 or at another hook (ErrUnrepresentable).
// Only little-endian GGUF v2/v3 is read.
//
// # NumPy .npy / .npz
//
// An .npy holds float16, float32 or float64 (either byte order, C or Fortran order) values,
// converted to float32 (float64 values beyond float32's range are ErrValueRange), of shape
// [layers, hidden] (row L is layer L; layers must be the model's) or [hidden] (one vector,
// applied to every layer of opts.Layers that the model has, which is then required:
// ErrNeedLayers). It steers
// opts.Hook (default post_block). An .npz (np.savez, or np.savez_compressed: a decompressed
// array may not exceed the cap) holds one such array per hook, named by the hook
// (np.savez(f, post_block=a, mlp_out=b)); an .npz with a single array of another name (arr_0)
// is read like an .npy. Export writes float32, little-endian, [layers, hidden] with zero rows
// where there is no vector.
//
// # safetensors
//
// Read with github.com/nlpodyssey/safetensors over the mapped file. Tensor names:
//
//	"<hook>.<L>"          e.g. "post_block.12", shape [hidden] or [1, hidden]
//	"layers.<L>.<hook>"   e.g. "layers.12.mlp_out"
//	"layers.<L>"          repeng / EasySteer style: opts.Hook (default post_block) at layer L
//	"<hook>"              a whole [layers, hidden] array (or [hidden] with a layer range)
//
// with dtype F16, BF16, F32 or F64. Export writes "<hook>.<L>" F32 [hidden] tensors with
// metadata {"format": "pt"}.
//
// # Untrusted input
//
// Files are untrusted: the size is checked against the cap before anything is read; every
// count, length and offset in a header is checked against the bytes that remain before it is
// used or anything is allocated for it (allocations are bounded by the file size and the
// model's [layers, hidden]); a truncated or corrupt file is ErrCorrupt, never a panic. A file
// is memory-mapped read-only; if another process truncates it during the import the fault
// becomes ErrCorrupt. Errors name the file, the tensor and the expected shape, and wrap one of
// this package's sentinels and, where one fits, steer's (ErrHiddenSize, ErrLayerRange,
// ErrUnknownHook, ErrNonFinite, ErrDuplicate). The parsers are fuzzed (FuzzGGUF, FuzzNpy,
// FuzzNpz, FuzzSafetensors).
//
// # Memory
//
// A safetensors import converts tensor by tensor from the mapping into the result and drops
// the mapped pages already converted (MADV_DONTNEED), so a 1 GiB file costs about 1 GiB of
// result plus one tensor, not 2 GiB. Export of safetensors builds each tensor's bytes before
// writing (the library takes byte views), so it holds the vectors twice.
package vecfile
