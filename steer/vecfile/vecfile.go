package vecfile

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/shmsteer/shmsteer/steer"
)

// Format is a vector file format.
type Format string

// The formats. FormatAuto detects the format from the magic bytes (then the extension).
const (
	FormatAuto        Format = ""
	FormatGGUF        Format = "gguf"
	FormatNpy         Format = "npy"
	FormatNpz         Format = "npz"
	FormatSafetensors Format = "safetensors"
)

// DefaultMaxBytes is the size cap when ImportOptions.MaxBytes is 0.
const DefaultMaxBytes int64 = 4 << 30

// DefaultHook is the hook that GGUF control vectors, plain arrays and "layers.N" tensors steer
// unless ImportOptions.Hook says otherwise: llama.cpp adds a control vector to the block output.
const DefaultHook = "post_block"

// LayerRange is an inclusive range of layer indexes, as llama.cpp's
// --control-vector-layer-range START END (same numbering: see the package doc).
type LayerRange struct{ First, Last int }

// ParseLayerRange parses "A-B" (inclusive) or "A" (one layer).
func ParseLayerRange(s string) (LayerRange, error) {
	a, b, found := strings.Cut(strings.TrimSpace(s), "-")
	first, err1 := strconv.Atoi(strings.TrimSpace(a))
	last, err2 := first, error(nil)
	if found {
		last, err2 = strconv.Atoi(strings.TrimSpace(b))
	}
	r := LayerRange{first, last}
	if err1 != nil || err2 != nil {
		return r, fmt.Errorf("%w: layer range %q: want A-B or A (layer indexes)", ErrBadOptions, s)
	}
	return r, r.check()
}

func (r LayerRange) check() error {
	if r.First < 0 || r.First > r.Last {
		return fmt.Errorf("%w: layer range %d-%d: want 0 <= A <= B", ErrBadOptions, r.First, r.Last)
	}
	return nil
}

func (r *LayerRange) contains(layer int) bool {
	return r == nil || (layer >= r.First && layer <= r.Last)
}

// ImportOptions control Import. The zero value imports every tensor of a detected format at
// scale 1 with the default cap.
type ImportOptions struct {
	// Format forces a format; FormatAuto detects it.
	Format Format
	// Scale multiplies every value (llama.cpp's --control-vector-scaled). 0 means 1.
	Scale float32
	// Layers keeps only the layers in the range (llama.cpp's --control-vector-layer-range);
	// nil keeps every layer. A [hidden] array is applied to every layer of the range.
	Layers *LayerRange
	// Hook is the hook that GGUF control vectors, plain .npy arrays, a lone unnamed .npz array
	// and "layers.N" safetensors tensors steer; "" means DefaultHook (post_block).
	Hook string
	// MaxBytes caps the input size, checked before reading (and, for .npz, the decompressed
	// size of its arrays). 0 means DefaultMaxBytes.
	MaxBytes int64
}

func (o *ImportOptions) scale() float32 {
	if o.Scale == 0 {
		return 1
	}
	return o.Scale
}

func (o *ImportOptions) maxBytes() int64 {
	if o.MaxBytes <= 0 {
		return DefaultMaxBytes
	}
	return o.MaxBytes
}

func (o *ImportOptions) hook() string {
	if o.Hook == "" {
		return DefaultHook
	}
	return o.Hook
}

func (o *ImportOptions) check(cfg steer.ModelConfig) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if s := o.scale(); s-s != 0 {
		return fmt.Errorf("%w (%w): scale %v", ErrBadOptions, steer.ErrNonFinite, s)
	}
	if o.Layers != nil {
		if err := o.Layers.check(); err != nil {
			return err
		}
	}
	switch o.Format {
	case FormatAuto, FormatGGUF, FormatNpy, FormatNpz, FormatSafetensors:
	default:
		return fmt.Errorf("%w: %q (want gguf, npy, npz or safetensors)", ErrUnknownFormat, o.Format)
	}
	return nil
}

// Import reads the steering vectors in the file at path for a model of config cfg. The file
// size is checked against opts.MaxBytes before anything is read; the file is memory-mapped
// read-only and each tensor is converted straight into the result, so a large file is not
// held in memory twice. The vectors are sorted by (hook order in cfg, layer), have Scale 1
// (opts.Scale is multiplied into Data, as llama.cpp does at load) and pass
// steer.Engine.Register's checks.
func Import(path string, cfg steer.ModelConfig, opts ImportOptions) ([]steer.Vector, error) {
	return ImportFiles([]Source{{Path: path, Scale: 1}}, cfg, opts)
}

// Source is one file of ImportFiles with its own scale (llama.cpp's --control-vector FILE is
// Scale 1, --control-vector-scaled FILE S is Scale S; 0 means 1).
type Source struct {
	Path  string
	Scale float32
}

// ImportFiles reads several files and sums them, each multiplied by its Scale and by
// opts.Scale, into one set, as llama.cpp sums several --control-vector files: vectors at the
// same (hook, layer) are added in file order (in float32, each product rounded before the
// add, as llama.cpp's loop does); a (hook, layer) present in one file only is that file's
// vector times its scale. Every file must match cfg.
func ImportFiles(srcs []Source, cfg steer.ModelConfig, opts ImportOptions) ([]steer.Vector, error) {
	if err := opts.check(cfg); err != nil {
		return nil, err
	}
	if len(srcs) == 0 {
		return nil, fmt.Errorf("%w: no files", ErrNoVectors)
	}
	acc := newAccumulator(cfg, &opts)
	for _, s := range srcs {
		if s.Scale-s.Scale != 0 {
			return nil, fmt.Errorf("%w (%w): %s: scale %v", ErrBadOptions, steer.ErrNonFinite, s.Path, s.Scale)
		}
		scale := s.Scale
		if scale == 0 {
			scale = 1
		}
		if err := importPath(acc, s.Path, scale*opts.scale()); err != nil {
			return nil, err
		}
	}
	return acc.finish(fileList(srcs))
}

func fileList(srcs []Source) string {
	names := make([]string, len(srcs))
	for i, s := range srcs {
		names[i] = s.Path
	}
	return strings.Join(names, ", ")
}

func importPath(acc *accumulator, path string, scale float32) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("vecfile: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("vecfile: %s: %w", path, err)
	}
	name := filepath.Base(path)
	if !st.Mode().IsRegular() {
		// A pipe or device: read it under the cap.
		b, err := readCapped(f, acc.opts.maxBytes(), path)
		if err != nil {
			return err
		}
		return parseInto(acc, name, path, b, nil, scale)
	}
	if st.Size() > acc.opts.maxBytes() {
		return fmt.Errorf("%w: %s is %d bytes, the cap is %d (ImportOptions.MaxBytes)", ErrTooLarge, path, st.Size(), acc.opts.maxBytes())
	}
	m, err := mapFile(f, st.Size())
	if err != nil {
		return fmt.Errorf("vecfile: %s: %w", path, err)
	}
	defer m.close()
	return m.guard(path, func() error { return parseInto(acc, name, path, m.data, m.release, scale) })
}

// ImportBytes reads the vectors of one file held in memory (an upload). name is used for
// format detection by extension and in error messages; b is not retained.
func ImportBytes(b []byte, name string, cfg steer.ModelConfig, opts ImportOptions) ([]steer.Vector, error) {
	if err := opts.check(cfg); err != nil {
		return nil, err
	}
	if int64(len(b)) > opts.maxBytes() {
		return nil, fmt.Errorf("%w: %s is %d bytes, the cap is %d (ImportOptions.MaxBytes)", ErrTooLarge, name, len(b), opts.maxBytes())
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: %s: empty (0 bytes)", ErrCorrupt, name)
	}
	acc := newAccumulator(cfg, &opts)
	if err := parseInto(acc, name, name, b, nil, opts.scale()); err != nil {
		return nil, err
	}
	return acc.finish(name)
}

// ImportReader reads at most opts.MaxBytes from r (ErrTooLarge beyond, before parsing) and
// imports it as ImportBytes does. For an HTTP upload pass the request body; set MaxBytes to the
// service's limit.
func ImportReader(r io.Reader, name string, cfg steer.ModelConfig, opts ImportOptions) ([]steer.Vector, error) {
	if err := opts.check(cfg); err != nil {
		return nil, err
	}
	b, err := readCapped(r, opts.maxBytes(), name)
	if err != nil {
		return nil, err
	}
	return ImportBytes(b, name, cfg, opts)
}

func readCapped(r io.Reader, capBytes int64, name string) ([]byte, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, capBytes+1))
	if err != nil {
		return nil, fmt.Errorf("vecfile: %s: %w", name, err)
	}
	if n > capBytes {
		return nil, fmt.Errorf("%w: %s is more than %d bytes (ImportOptions.MaxBytes)", ErrTooLarge, name, capBytes)
	}
	return buf.Bytes(), nil
}

// Detect names the format of b from its magic bytes, falling back to name's extension.
func Detect(b []byte, name string) (Format, error) {
	switch {
	case bytes.HasPrefix(b, []byte("GGUF")):
		return FormatGGUF, nil
	case bytes.HasPrefix(b, npyMagic):
		return FormatNpy, nil
	case bytes.HasPrefix(b, []byte("PK\x03\x04")), bytes.HasPrefix(b, []byte("PK\x05\x06")):
		return FormatNpz, nil
	case len(b) >= 9 && b[8] == '{':
		return FormatSafetensors, nil
	}
	if f, ok := formatOfExt(name); ok {
		return f, nil
	}
	return "", fmt.Errorf("%w: %s: no GGUF, NumPy, zip or safetensors magic and extension %q unknown", ErrUnknownFormat, name, filepath.Ext(name))
}

func formatOfExt(name string) (Format, bool) {
	switch strings.ToLower(filepath.Ext(name)) {
	case ".gguf":
		return FormatGGUF, true
	case ".npy":
		return FormatNpy, true
	case ".npz":
		return FormatNpz, true
	case ".safetensors", ".st":
		return FormatSafetensors, true
	}
	return "", false
}

func parseInto(acc *accumulator, name, path string, b []byte, release func(int), scale float32) error {
	f := acc.opts.Format
	if f == FormatAuto {
		var err error
		if f, err = Detect(b, name); err != nil {
			return err
		}
	}
	acc.begin(path, scale)
	switch f {
	case FormatGGUF:
		return parseGGUF(acc, b)
	case FormatNpy:
		return parseNpyFile(acc, b)
	case FormatNpz:
		return parseNpz(acc, b)
	default:
		return parseSafetensors(acc, b, release)
	}
}

// accumulator collects (hook, layer) vectors from one or more files, applying the scale, the
// layer range and the model's checks, and sums repeated (hook, layer) entries.
type accumulator struct {
	cfg  steer.ModelConfig
	opts *ImportOptions

	file  string  // current file, for messages
	scale float32 // current file's total scale
	seen  map[slotKey]bool

	slots map[slotKey][]float32
	order []slotKey
}

type slotKey struct {
	hook  steer.HookID
	layer int
}

func newAccumulator(cfg steer.ModelConfig, opts *ImportOptions) *accumulator {
	return &accumulator{cfg: cfg, opts: opts, slots: map[slotKey][]float32{}}
}

func (a *accumulator) begin(file string, scale float32) {
	a.file, a.scale, a.seen = file, scale, map[slotKey]bool{}
}

func (a *accumulator) errf(sentinel error, tensor, format string, args ...any) error {
	return fmt.Errorf("%w: %s: tensor %q: %s", sentinel, a.file, tensor, fmt.Sprintf(format, args...))
}

// hookID resolves a hook name against the model.
func (a *accumulator) hookID(tensor, hook string) (steer.HookID, error) {
	id, err := a.cfg.Hook(hook)
	if err != nil {
		hooks := make([]string, a.cfg.NumHooks())
		for i := range hooks {
			hooks[i] = a.cfg.HookName(steer.HookID(i))
		}
		return 0, fmt.Errorf("%w: %s: tensor %q: hook %q is not one of the model's hooks %v (set the hook option)", steer.ErrUnknownHook, a.file, tensor, hook, hooks)
	}
	return id, nil
}

// wantLayer reports whether layer passes the layer range; a layer outside the model is an
// error.
func (a *accumulator) wantLayer(tensor string, layer int) (bool, error) {
	if !a.opts.Layers.contains(layer) {
		return false, nil
	}
	if layer < 0 || layer >= a.cfg.Layers {
		return false, a.errf(steer.ErrLayerRange, tensor, "layer %d, the model has layers 0..%d", layer, a.cfg.Layers-1)
	}
	return true, nil
}

// add converts n = cfg.Hidden elements of kind dt from raw into the slot (hook, layer), scaled
// by the file's scale. sum says whether a repeated (hook, layer) within this file is summed
// (GGUF, as llama.cpp) or refused (named tensors of the other formats).
func (a *accumulator) add(tensor string, hook steer.HookID, layer int, dt dtype, raw []byte, sum bool) error {
	k := slotKey{hook, layer}
	if a.seen[k] && !sum {
		return fmt.Errorf("%w (%w): %s: tensor %q: %s layer %d given twice", steer.ErrDuplicate, ErrTensorName, a.file, tensor, a.cfg.HookName(hook), layer)
	}
	a.seen[k] = true
	dst, existed := a.slots[k]
	tmp := make([]float32, a.cfg.Hidden)
	if err := dt.decode(tmp, raw); err != nil {
		return rewrap(fmt.Sprintf("%s: tensor %q", a.file, tensor), err)
	}
	if i := firstNonFinite(tmp); i >= 0 {
		return a.errf(steer.ErrNonFinite, tensor, "element %d is %v", i, tmp[i])
	}
	if !existed {
		dst = tmp
		if a.scale != 1 {
			for i := range dst {
				dst[i] = float32(dst[i] * a.scale)
			}
		}
		a.slots[k] = dst
		a.order = append(a.order, k)
	} else {
		for i := range dst {
			dst[i] += float32(tmp[i] * a.scale)
		}
	}
	if existed || a.scale != 1 {
		if i := firstNonFinite(dst); i >= 0 {
			return a.errf(steer.ErrNonFinite, tensor, "element %d overflows float32 after scale %v (and sum)", i, a.scale)
		}
	}
	return nil
}

// finish returns the vectors, dropping all-zero ones (they steer nothing), sorted by hook
// order then layer.
func (a *accumulator) finish(what string) ([]steer.Vector, error) {
	keys := slices.Clone(a.order)
	slices.SortFunc(keys, func(x, y slotKey) int {
		if x.hook != y.hook {
			return int(x.hook) - int(y.hook)
		}
		return x.layer - y.layer
	})
	out := make([]steer.Vector, 0, len(keys))
	for _, k := range keys {
		d := a.slots[k]
		if allZero(d) {
			continue
		}
		out = append(out, steer.Vector{Hook: a.cfg.HookName(k.hook), Layer: k.layer, Scale: 1, Data: d})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s: no tensors, or only all-zero ones (after the layer range, if any)", ErrNoVectors, what)
	}
	return out, nil
}

func firstNonFinite(v []float32) int {
	for i, f := range v {
		if f-f != 0 {
			return i
		}
	}
	return -1
}

func allFinite(v []float32) bool {
	for _, f := range v {
		if f-f != 0 {
			return false
		}
	}
	return true
}

func allZero(v []float32) bool {
	for _, f := range v {
		if f != 0 {
			return false
		}
	}
	return true
}

// shapeString formats a shape as [a, b].
func shapeString[T int | uint64](dims []T) string {
	s := make([]string, len(dims))
	for i, d := range dims {
		s[i] = strconv.FormatUint(uint64(d), 10)
	}
	return "[" + strings.Join(s, ", ") + "]"
}

// f32Range says x converts to a finite float32: up to MaxFloat32 and the values just above it
// that round to it (below MaxFloat32 + half its ulp, 2^103), as numpy's astype(float32) does.
func f32Range(x float64) bool { return !math.IsInf(float64(float32(x)), 0) }
