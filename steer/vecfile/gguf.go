package vecfile

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"

	"github.com/shmsteer/shmsteer/steer"
)

// GGUF, from the specification (ggml docs/gguf.md), little-endian only:
//
//	header:  magic "GGUF", version u32 (2 or 3), tensor_count u64, metadata_kv_count u64
//	kv:      key string, value_type u32, value
//	string:  len u64, bytes (no NUL)
//	array:   elem_type u32, count u64, elements
//	tensor:  name string, n_dims u32, dims [n_dims]u64 (ne0 first), ggml_type u32, offset u64
//	then padding to general.alignment (default 32), then the data section; offsets are
//	relative to its start and multiples of the alignment.
const (
	ggufVersion          = 3
	ggufDefaultAlignment = 32
	ggufMaxDims          = 4  // GGML_MAX_DIMS
	ggufMaxName          = 64 // GGML_MAX_NAME
	ggufMaxNesting       = 4  // arrays of arrays
	ggufMaxTensors       = steer.MaxLayers
	ggmlTypeF32          = 0
	ggmlTypeF16          = 1
)

// GGUF metadata value types.
const (
	ggufU8 = iota
	ggufI8
	ggufU16
	ggufI16
	ggufU32
	ggufI32
	ggufF32
	ggufBool
	ggufString
	ggufArray
	ggufU64
	ggufI64
	ggufF64
)

var ggufScalarSize = map[uint32]uint64{
	ggufU8: 1, ggufI8: 1, ggufBool: 1, ggufU16: 2, ggufI16: 2,
	ggufU32: 4, ggufI32: 4, ggufF32: 4, ggufU64: 8, ggufI64: 8, ggufF64: 8,
}

type ggufTensor struct {
	name   string
	dims   []uint64
	typ    uint32
	offset uint64
}

type ggufFile struct {
	arch      string
	hasArch   bool
	modelHint string
	alignment uint64
	tensors   []ggufTensor
	data      []byte // the data section
}

// ggufCursor reads the header; every length is checked against what is left before use.
type ggufCursor struct {
	b   []byte
	off uint64
}

func (c *ggufCursor) left() uint64 { return uint64(len(c.b)) - c.off }

func (c *ggufCursor) take(n uint64, what string) ([]byte, error) {
	if n > c.left() {
		return nil, fmt.Errorf("%w: %s: needs %d bytes at offset %d, %d left", ErrCorrupt, what, n, c.off, c.left())
	}
	s := c.b[c.off : c.off+n]
	c.off += n
	return s, nil
}

func (c *ggufCursor) u32(what string) (uint32, error) {
	s, err := c.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(s), nil
}

func (c *ggufCursor) u64(what string) (uint64, error) {
	s, err := c.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(s), nil
}

func (c *ggufCursor) str(what string) ([]byte, error) {
	n, err := c.u64(what + " length")
	if err != nil {
		return nil, err
	}
	return c.take(n, what)
}

// value reads (or skips) one metadata value of type typ.
func (c *ggufCursor) value(typ uint32, depth int, what string) ([]byte, error) {
	if sz, ok := ggufScalarSize[typ]; ok {
		return c.take(sz, what)
	}
	switch typ {
	case ggufString:
		return c.str(what)
	case ggufArray:
		if depth >= ggufMaxNesting {
			return nil, fmt.Errorf("%w: %s: arrays nested deeper than %d", ErrCorrupt, what, ggufMaxNesting)
		}
		et, err := c.u32(what + " element type")
		if err != nil {
			return nil, err
		}
		n, err := c.u64(what + " count")
		if err != nil {
			return nil, err
		}
		if sz, ok := ggufScalarSize[et]; ok {
			if n > c.left()/sz {
				return nil, fmt.Errorf("%w: %s: %d elements of %d bytes, %d bytes left", ErrCorrupt, what, n, sz, c.left())
			}
			return c.take(n*sz, what)
		}
		// Strings and arrays take at least 8 bytes each: bound the loop by what is left.
		if n > c.left()/8 {
			return nil, fmt.Errorf("%w: %s: %d elements, %d bytes left", ErrCorrupt, what, n, c.left())
		}
		for range n {
			if _, err := c.value(et, depth+1, what); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}
	return nil, fmt.Errorf("%w: %s: unknown value type %d", ErrCorrupt, what, typ)
}

// kv reads one metadata entry.
func (c *ggufCursor) kv() (key []byte, typ uint32, v []byte, err error) {
	if key, err = c.str("key"); err != nil {
		return nil, 0, nil, err
	}
	if typ, err = c.u32("type"); err != nil {
		return key, 0, nil, err
	}
	v, err = c.value(typ, 0, "value")
	return key, typ, v, err
}

// tensorInfo reads one tensor info.
func (c *ggufCursor) tensorInfo() (t ggufTensor, err error) {
	name, err := c.str("name")
	if err != nil {
		return t, err
	}
	t.name = string(name)
	if len(name) > ggufMaxName {
		return t, fmt.Errorf("%w: name is %d bytes, GGUF allows %d", ErrCorrupt, len(name), ggufMaxName)
	}
	nd, err := c.u32("n_dims")
	if err != nil {
		return t, err
	}
	if nd < 1 || nd > ggufMaxDims {
		return t, fmt.Errorf("%w: %d dimensions, GGUF allows 1..%d", ErrCorrupt, nd, ggufMaxDims)
	}
	t.dims = make([]uint64, nd)
	for i := range t.dims {
		if t.dims[i], err = c.u64("dims"); err != nil {
			return t, err
		}
	}
	if t.typ, err = c.u32("type"); err != nil {
		return t, err
	}
	t.offset, err = c.u64("offset")
	return t, err
}

func readGGUF(b []byte) (*ggufFile, error) {
	c := &ggufCursor{b: b}
	magic, err := c.take(4, "magic")
	if err != nil || string(magic) != "GGUF" {
		return nil, fmt.Errorf("%w: no GGUF magic", ErrCorrupt)
	}
	version, err := c.u32("version")
	if err != nil {
		return nil, err
	}
	if version != 2 && version != 3 {
		if version&0xffff == 0 {
			return nil, fmt.Errorf("%w: big-endian GGUF (version bytes %#x) is not supported", ErrUnknownFormat, version)
		}
		return nil, fmt.Errorf("%w: GGUF version %d, want 2 or 3", ErrUnknownFormat, version)
	}
	nTensors, err := c.u64("tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := c.u64("metadata count")
	if err != nil {
		return nil, err
	}
	// A kv takes at least 13 bytes, a tensor info at least 24: refuse counts the file cannot
	// hold before looping.
	if nKV > c.left()/13 || nTensors > c.left()/24 {
		return nil, fmt.Errorf("%w: %d metadata entries and %d tensors do not fit in %d bytes", ErrCorrupt, nKV, nTensors, len(b))
	}
	if nTensors > ggufMaxTensors {
		return nil, fmt.Errorf("%w: %d tensors, a control vector has at most %d", ErrCorrupt, nTensors, ggufMaxTensors)
	}
	g := &ggufFile{alignment: ggufDefaultAlignment}
	names := map[string]struct{}{}
	for i := range nKV {
		key, typ, v, err := c.kv()
		if err != nil {
			return nil, rewrap(fmt.Sprintf("metadata entry %d %q", i, clip(string(key))), err)
		}
		switch string(key) {
		case "general.architecture":
			if typ != ggufString {
				return nil, fmt.Errorf("%w: general.architecture has type %d, want string", ErrCorrupt, typ)
			}
			g.arch, g.hasArch = string(v), true
		case "controlvector.model_hint":
			if typ == ggufString {
				g.modelHint = string(v)
			}
		case "general.alignment":
			if typ != ggufU32 {
				return nil, fmt.Errorf("%w: general.alignment has type %d, want uint32", ErrCorrupt, typ)
			}
			a := binary.LittleEndian.Uint32(v)
			if a == 0 || a&(a-1) != 0 {
				return nil, fmt.Errorf("%w: general.alignment %d is not a power of two", ErrCorrupt, a)
			}
			g.alignment = uint64(a)
		}
	}
	for i := range nTensors {
		t, err := c.tensorInfo()
		if err != nil {
			return nil, rewrap(fmt.Sprintf("tensor info %d %q", i, clip(t.name)), err)
		}
		if _, dup := names[t.name]; dup {
			return nil, fmt.Errorf("%w: tensor name %q appears twice", ErrCorrupt, t.name)
		}
		names[t.name] = struct{}{}
		g.tensors = append(g.tensors, t)
	}
	start := alignUp(c.off, g.alignment)
	if start > uint64(len(b)) {
		if len(g.tensors) > 0 {
			return nil, fmt.Errorf("%w: data section starts at %d, past the end (%d bytes)", ErrCorrupt, start, len(b))
		}
		start = uint64(len(b))
	}
	g.data = b[start:]
	return g, nil
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

// tensorBytes returns the data of t if its type is F32 or F16 and it lies within the data
// section.
func (g *ggufFile) tensorBytes(t *ggufTensor) ([]byte, error) {
	var size uint64
	switch t.typ {
	case ggmlTypeF32:
		size = 4
	case ggmlTypeF16:
		size = 2
	default:
		return nil, fmt.Errorf("%w: ggml type %d (llama.cpp control vectors are F32, type 0)", ErrDtype, t.typ)
	}
	for _, d := range t.dims {
		if d != 0 && size > math.MaxUint64/d {
			return nil, fmt.Errorf("%w: shape %s overflows", ErrCorrupt, shapeString(t.dims))
		}
		size *= d
	}
	if t.offset%g.alignment != 0 {
		return nil, fmt.Errorf("%w: offset %d is not a multiple of the alignment %d", ErrCorrupt, t.offset, g.alignment)
	}
	if t.offset > uint64(len(g.data)) || size > uint64(len(g.data))-t.offset {
		return nil, fmt.Errorf("%w: %d bytes at data offset %d, the data section has %d", ErrCorrupt, size, t.offset, len(g.data))
	}
	return g.data[t.offset : t.offset+size], nil
}

// checkDisjoint refuses tensors whose data overlap (GGUF lays them out one after the other), so
// the vectors a file yields are never larger than the file.
func (g *ggufFile) checkDisjoint() error {
	type span struct {
		start, end uint64
		name       string
	}
	spans := make([]span, 0, len(g.tensors))
	for i := range g.tensors {
		t := &g.tensors[i]
		raw, err := g.tensorBytes(t)
		if err != nil {
			return rewrap(fmt.Sprintf("tensor %q", t.name), err)
		}
		spans = append(spans, span{t.offset, t.offset + uint64(len(raw)), t.name})
	}
	slices.SortFunc(spans, func(a, b span) int {
		if a.start < b.start {
			return -1
		}
		if a.start > b.start {
			return 1
		}
		return 0
	})
	for i := 1; i < len(spans); i++ {
		if spans[i].start < spans[i-1].end {
			return fmt.Errorf("%w: tensors %q and %q overlap", ErrCorrupt, spans[i-1].name, spans[i].name)
		}
	}
	return nil
}

// directionLayer parses llama.cpp's "direction.N" (N ≥ 1, decimal digits only).
func directionLayer(name string) (int, bool) {
	const prefix = "direction."
	if len(name) <= len(prefix) || name[:len(prefix)] != prefix {
		return 0, false
	}
	digits := name[len(prefix):]
	for _, ch := range digits {
		if ch < '0' || ch > '9' {
			return 0, false
		}
	}
	if digits[0] == '0' { // no leading zeros: one name per layer
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil && n >= 1
}

// ModelHint is the controlvector.model_hint of a GGUF control vector in b (the model
// architecture llama.cpp's generator records, e.g. "llama"), "" when b is not a GGUF file or
// has no hint. Import returns vectors only; a caller that re-exports them passes the hint back
// in ExportOptions.ModelHint to carry it through.
func ModelHint(b []byte) string {
	if !bytes.HasPrefix(b, []byte("GGUF")) {
		return ""
	}
	g, err := readGGUF(b)
	if err != nil {
		return ""
	}
	return g.modelHint
}

// FileModelHint is the first GGUF model hint among the files at paths ("" if none), for a
// caller that imported them already: a file that is not GGUF (by its magic) is not read
// further, and a read error just means no hint.
func FileModelHint(paths ...string) string {
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var magic [4]byte
		_, err = io.ReadFull(f, magic[:])
		f.Close()
		if err != nil || string(magic[:]) != "GGUF" {
			continue
		}
		if b, err := os.ReadFile(p); err == nil {
			if h := ModelHint(b); h != "" {
				return h
			}
		}
	}
	return ""
}

func parseGGUF(acc *accumulator, b []byte) error {
	g, err := readGGUF(b)
	if err != nil {
		return rewrap(acc.file, err)
	}
	if g.hasArch && g.arch != "controlvector" {
		return fmt.Errorf("%w: %s: general.architecture is %q: a model, not a llama.cpp control vector (\"controlvector\")", ErrUnknownFormat, acc.file, g.arch)
	}
	hook, err := acc.hookID("direction.*", acc.opts.hook())
	if err != nil {
		return err
	}
	want := "[" + strconv.Itoa(acc.cfg.Hidden) + "]"
	if err := g.checkDisjoint(); err != nil {
		return rewrap(acc.file, err)
	}
	for i := range g.tensors {
		t := &g.tensors[i]
		layer, ok := directionLayer(t.name)
		if !ok {
			return acc.errf(ErrTensorName, t.name, "want direction.N with N ≥ 1 (llama.cpp never steers layer 0)")
		}
		raw, err := g.tensorBytes(t)
		if err != nil {
			return rewrap(fmt.Sprintf("%s: tensor %q (want F32 %s)", acc.file, t.name, want), err)
		}
		if t.typ != ggmlTypeF32 {
			return acc.errf(ErrDtype, t.name, "ggml type F16, llama.cpp control vectors are F32 %s", want)
		}
		dims := t.dims
		for len(dims) > 1 && dims[len(dims)-1] == 1 {
			dims = dims[:len(dims)-1]
		}
		if len(dims) != 1 || dims[0] != uint64(acc.cfg.Hidden) {
			return fmt.Errorf("%w (%w): %s: tensor %q: shape %s, want %s (the model's hidden size)", ErrShape, steer.ErrHiddenSize, acc.file, t.name, shapeString(t.dims), want)
		}
		keep, err := acc.wantLayer(t.name, layer)
		if err != nil {
			return err
		}
		if !keep {
			continue
		}
		if err := acc.add(t.name, hook, layer, dtF32, raw, true); err != nil {
			return err
		}
	}
	return nil
}

// writeGGUF writes vecs of hook as a llama.cpp control vector: direction.N for the vector at
// layer N.
func writeGGUF(w io.Writer, cfg steer.ModelConfig, vecs []steer.Vector, hook, modelHint string) error {
	byLayer := map[int][]float32{}
	for _, v := range vecs {
		if v.Hook != hook {
			return fmt.Errorf("%w: GGUF control vectors hold one hook (%s, llama.cpp's block output); vector at %s layer %d: export it to npz or safetensors", ErrUnrepresentable, hook, v.Hook, v.Layer)
		}
		if v.Layer < 1 {
			return fmt.Errorf("%w: GGUF has no direction.0 (llama.cpp never steers layer 0's output); vector at %s layer %d: export it to npz or safetensors", ErrUnrepresentable, v.Hook, v.Layer)
		}
		if _, dup := byLayer[v.Layer]; dup {
			return fmt.Errorf("%w: %s layer %d twice", steer.ErrDuplicate, v.Hook, v.Layer)
		}
		byLayer[v.Layer] = scaled(v)
	}
	layers := make([]int, 0, len(byLayer))
	for l := range byLayer {
		layers = append(layers, l)
	}
	slices.Sort(layers)

	le := binary.LittleEndian
	putStr := func(b []byte, s string) []byte { return append(le.AppendUint64(b, uint64(len(s))), s...) }
	h := append([]byte("GGUF"), 0, 0, 0, 0)
	le.PutUint32(h[4:], ggufVersion)
	h = le.AppendUint64(h, uint64(len(layers)))
	h = le.AppendUint64(h, 3)
	h = le.AppendUint32(putStr(h, "general.architecture"), ggufString)
	h = putStr(h, "controlvector")
	h = le.AppendUint32(putStr(h, "controlvector.model_hint"), ggufString)
	h = putStr(h, modelHint)
	h = le.AppendUint32(putStr(h, "controlvector.layer_count"), ggufI32)
	h = le.AppendUint32(h, uint32(len(layers)))
	stride := alignUp(uint64(cfg.Hidden)*4, ggufDefaultAlignment)
	for i, l := range layers {
		h = putStr(h, "direction."+strconv.Itoa(l))
		h = le.AppendUint32(h, 1)
		h = le.AppendUint64(h, uint64(cfg.Hidden))
		h = le.AppendUint32(h, ggmlTypeF32)
		h = le.AppendUint64(h, uint64(i)*stride)
	}
	h = append(h, make([]byte, alignUp(uint64(len(h)), ggufDefaultAlignment)-uint64(len(h)))...)
	bw := bufio.NewWriterSize(w, 1<<16)
	if _, err := bw.Write(h); err != nil {
		return err
	}
	pad := make([]byte, stride-uint64(cfg.Hidden)*4)
	for _, l := range layers {
		if err := writeF32(bw, byLayer[l]); err != nil {
			return err
		}
		if _, err := bw.Write(pad); err != nil {
			return err
		}
	}
	return bw.Flush()
}
