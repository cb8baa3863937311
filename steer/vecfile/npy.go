package vecfile

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/shmsteer/shmsteer/steer"
)

// NumPy .npy, from numpy's format specification (numpy.lib.format): magic "\x93NUMPY", major
// and minor version bytes, header length (u16 little-endian for 1.x, u32 for 2.x and 3.x),
// then an ASCII (3.x: UTF-8) Python dict literal {'descr': ..., 'fortran_order': ...,
// 'shape': (...), } padded with spaces and ended by '\n', then the raw array data.
var npyMagic = []byte("\x93NUMPY")

const npyMaxHeader = 1 << 20

type npyArray struct {
	dt      dtype
	fortran bool
	shape   []int
	data    []byte
}

func readNpy(b []byte) (*npyArray, error) {
	if !bytes.HasPrefix(b, npyMagic) || len(b) < 10 {
		return nil, fmt.Errorf("%w: no NumPy magic", ErrCorrupt)
	}
	major := b[6]
	var hlen, pos int
	switch major {
	case 1:
		hlen, pos = int(binary.LittleEndian.Uint16(b[8:])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, fmt.Errorf("%w: truncated NumPy header", ErrCorrupt)
		}
		h := binary.LittleEndian.Uint32(b[8:])
		if h > npyMaxHeader {
			return nil, fmt.Errorf("%w: NumPy header of %d bytes", ErrCorrupt, h)
		}
		hlen, pos = int(h), 12
	default:
		return nil, fmt.Errorf("%w: NumPy format version %d.%d", ErrUnknownFormat, major, b[7])
	}
	if hlen > len(b)-pos {
		return nil, fmt.Errorf("%w: NumPy header of %d bytes, %d left", ErrCorrupt, hlen, len(b)-pos)
	}
	a, err := parseNpyHeader(string(b[pos : pos+hlen]))
	if err != nil {
		return nil, err
	}
	a.data = b[pos+hlen:]
	n := uint64(a.dt.size())
	for _, d := range a.shape {
		if d != 0 && n > (1<<62)/uint64(d) {
			return nil, fmt.Errorf("%w: shape %s overflows", ErrCorrupt, shapeString(a.shape))
		}
		n *= uint64(d)
	}
	if n != uint64(len(a.data)) {
		return nil, fmt.Errorf("%w: shape %s of %v needs %d data bytes, the file has %d", ErrCorrupt, shapeString(a.shape), a.dt, n, len(a.data))
	}
	return a, nil
}

// parseNpyHeader parses the dict literal: keys descr, fortran_order, shape in any order.
func parseNpyHeader(h string) (*npyArray, error) {
	bad := func(why string) error { return fmt.Errorf("%w: NumPy header %q: %s", ErrCorrupt, clip(h), why) }
	h = strings.TrimRight(h, " \t\n\x00")
	if !strings.HasPrefix(h, "{") || !strings.HasSuffix(h, "}") {
		return nil, bad("not a dict")
	}
	body := strings.TrimSpace(h[1 : len(h)-1])
	a := &npyArray{}
	var have [3]bool
	for body != "" {
		key, rest, err := npyString(body)
		if err != nil {
			return nil, bad(err.Error())
		}
		rest = strings.TrimSpace(rest)
		if !strings.HasPrefix(rest, ":") {
			return nil, bad("missing ':'")
		}
		rest = strings.TrimSpace(rest[1:])
		switch key {
		case "descr":
			var descr string
			if descr, rest, err = npyString(rest); err != nil {
				return nil, bad(err.Error())
			}
			if a.dt, err = npyDtype(descr); err != nil {
				return nil, err
			}
			have[0] = true
		case "fortran_order":
			switch {
			case strings.HasPrefix(rest, "True"):
				a.fortran, rest = true, rest[4:]
			case strings.HasPrefix(rest, "False"):
				rest = rest[5:]
			default:
				return nil, bad("fortran_order is not True or False")
			}
			have[1] = true
		case "shape":
			if !strings.HasPrefix(rest, "(") {
				return nil, bad("shape is not a tuple")
			}
			end := strings.IndexByte(rest, ')')
			if end < 0 {
				return nil, bad("unterminated shape")
			}
			for _, tok := range strings.Split(rest[1:end], ",") {
				tok = strings.TrimSpace(tok)
				if tok == "" {
					continue
				}
				tok = strings.TrimSuffix(tok, "L")
				d, err := strconv.Atoi(tok)
				if err != nil || d < 0 || d > math.MaxInt32 || len(a.shape) >= 32 {
					return nil, bad("bad shape")
				}
				a.shape = append(a.shape, d)
			}
			rest = rest[end+1:]
			have[2] = true
		default:
			return nil, bad("unexpected key " + strconv.Quote(key))
		}
		rest = strings.TrimSpace(rest)
		if strings.HasPrefix(rest, ",") {
			rest = strings.TrimSpace(rest[1:])
		} else if rest != "" {
			return nil, bad("missing ','")
		}
		body = rest
	}
	if have != [3]bool{true, true, true} {
		return nil, bad("needs descr, fortran_order and shape")
	}
	return a, nil
}

func clip(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// npyString reads a quoted Python string (no escapes: none appear in npy headers).
func npyString(s string) (string, string, error) {
	if s == "" || (s[0] != '\'' && s[0] != '"') {
		return "", s, errors.New("expected a quoted string")
	}
	end := strings.IndexByte(s[1:], s[0])
	if end < 0 {
		return "", s, errors.New("unterminated string")
	}
	return s[1 : 1+end], s[2+end:], nil
}

func npyDtype(descr string) (dtype, error) {
	if len(descr) == 3 {
		var dt dtype
		switch descr[1:] {
		case "f2":
			dt = dtF16
		case "f4":
			dt = dtF32
		case "f8":
			dt = dtF64
		default:
			return dt, fmt.Errorf("%w: NumPy dtype %q (want float16, float32 or float64)", ErrDtype, descr)
		}
		switch descr[0] {
		case '<', '=', '|':
		case '>':
			dt.bigEndian = true
		default:
			return dt, fmt.Errorf("%w: NumPy dtype %q", ErrDtype, descr)
		}
		return dt, nil
	}
	return dtype{}, fmt.Errorf("%w: NumPy dtype %q (want float16, float32 or float64)", ErrDtype, descr)
}

// row returns row i of a 2-D array as contiguous bytes (a copy for Fortran order).
func (a *npyArray) row(i int) []byte {
	sz := a.dt.size()
	if len(a.shape) == 1 {
		return a.data
	}
	rows, cols := a.shape[0], a.shape[1]
	if !a.fortran || rows == 1 {
		return a.data[i*cols*sz : (i+1)*cols*sz]
	}
	out := make([]byte, cols*sz)
	for j := range cols {
		copy(out[j*sz:(j+1)*sz], a.data[(j*rows+i)*sz:])
	}
	return out
}

// addArray adds a [layers, hidden] or [hidden] array of hook to the accumulator.
func addArray(acc *accumulator, tensor, hookName string, a *npyArray) error {
	hook, err := acc.hookID(tensor, hookName)
	if err != nil {
		return err
	}
	H, L := acc.cfg.Hidden, acc.cfg.Layers
	want := fmt.Sprintf("[%d, %d] (layers, hidden) or [%d] with a layer range", L, H, H)
	switch {
	case len(a.shape) == 2 && a.shape[0] == L && a.shape[1] == H:
		for l := range L {
			if keep, err := acc.wantLayer(tensor, l); err != nil {
				return err
			} else if keep {
				if err := acc.add(fmt.Sprintf("%s[%d]", tensor, l), hook, l, a.dt, a.row(l), false); err != nil {
					return err
				}
			}
		}
		return nil
	case len(a.shape) == 1 && a.shape[0] == H:
		r := acc.opts.Layers
		if r == nil {
			return fmt.Errorf("%w: %s: tensor %q: shape [%d] is one vector: give the layers it steers (--layers A-B; layers=A-B in the API and Python; ImportOptions.Layers in Go)", ErrNeedLayers, acc.file, tensor, H)
		}
		for l := r.First; l <= r.Last && l < L; l++ {
			if err := acc.add(tensor, hook, l, a.dt, a.row(0), false); err != nil {
				return err
			}
		}
		if r.First >= L {
			return fmt.Errorf("%w: %s: layer range %d-%d, the model has layers 0..%d", steer.ErrLayerRange, acc.file, r.First, r.Last, L-1)
		}
		return nil
	}
	err = ErrShape
	if len(a.shape) >= 1 && a.shape[len(a.shape)-1] != H {
		err = fmt.Errorf("%w (%w)", ErrShape, steer.ErrHiddenSize)
	}
	return fmt.Errorf("%w: %s: tensor %q: shape %s, want %s", err, acc.file, tensor, shapeString(a.shape), want)
}

func parseNpyFile(acc *accumulator, b []byte) error {
	a, err := readNpy(b)
	if err != nil {
		return rewrap(acc.file, err)
	}
	return addArray(acc, "array", acc.opts.hook(), a)
}

// parseNpz reads an .npz (a zip of .npy members, stored or deflated, as np.savez and
// np.savez_compressed write): one array per hook, named by the hook; a lone array with another
// name (np.savez(f, a) names it arr_0) steers ImportOptions.Hook.
func parseNpz(acc *accumulator, b []byte) error {
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil && !errors.Is(err, zip.ErrInsecurePath) {
		return fmt.Errorf("%w: %s: not a valid .npz (zip): %v", ErrCorrupt, acc.file, err)
	}
	if len(zr.File) == 0 {
		return fmt.Errorf("%w: %s: empty .npz", ErrNoVectors, acc.file)
	}
	budget := uint64(acc.opts.maxBytes())
	for _, f := range zr.File {
		name := strings.TrimSuffix(path.Base(f.Name), ".npy")
		hook := name
		if _, err := acc.cfg.Hook(name); err != nil {
			if len(zr.File) != 1 {
				return fmt.Errorf("%w (%w): %s: array %q is not one of the model's hooks (an .npz holds one [layers, hidden] array per hook)", ErrTensorName, steer.ErrUnknownHook, acc.file, f.Name)
			}
			hook = acc.opts.hook()
		}
		// No array of the model is larger than [layers, hidden] float64 plus its header: refuse
		// to decompress more (a zip bomb), whatever the cap.
		if limit := uint64(acc.cfg.Layers)*uint64(acc.cfg.Hidden)*8 + npyMaxHeader + 16; f.UncompressedSize64 > limit {
			return fmt.Errorf("%w: %s: array %q is %d bytes uncompressed, more than a [%d, %d] float64 array", ErrShape, acc.file, f.Name, f.UncompressedSize64, acc.cfg.Layers, acc.cfg.Hidden)
		}
		if f.UncompressedSize64 > budget {
			return fmt.Errorf("%w: %s: array %q is %d bytes uncompressed, over the cap (ImportOptions.MaxBytes)", ErrTooLarge, acc.file, f.Name, f.UncompressedSize64)
		}
		budget -= f.UncompressedSize64
		data, err := npzMember(b, f)
		if err != nil {
			return fmt.Errorf("%w: %s: array %q: %v", ErrCorrupt, acc.file, f.Name, err)
		}
		a, err := readNpy(data)
		if err != nil {
			return rewrap(fmt.Sprintf("%s: array %q", acc.file, f.Name), err)
		}
		if err := addArray(acc, name, hook, a); err != nil {
			return err
		}
	}
	return nil
}

// npzMember returns a member's bytes: a slice of b when stored, else decompressed into a buffer
// of its declared size (never more).
func npzMember(b []byte, f *zip.File) ([]byte, error) {
	if f.Method == zip.Store && f.CompressedSize64 == f.UncompressedSize64 {
		off, err := f.DataOffset()
		if err != nil {
			return nil, err
		}
		if off < 0 || uint64(off) > uint64(len(b)) || f.UncompressedSize64 > uint64(len(b))-uint64(off) {
			return nil, errors.New("member data beyond the end of the file")
		}
		data := b[off : uint64(off)+f.UncompressedSize64]
		return data, nil
	}
	rc, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	buf := make([]byte, 0, min(f.UncompressedSize64, 1<<20))
	w := bytes.NewBuffer(buf)
	n, err := w.ReadFrom(io.LimitReader(rc, int64(f.UncompressedSize64)+1))
	if err != nil {
		return nil, err
	}
	if uint64(n) != f.UncompressedSize64 {
		return nil, fmt.Errorf("decompressed to %d bytes, the zip says %d", n, f.UncompressedSize64)
	}
	return w.Bytes(), nil
}

// npyHeader returns the .npy 1.0 header for a little-endian float32 array of shape, padded so
// the data starts at a multiple of 64 bytes as numpy does.
func npyHeader(shape []int) []byte {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = strconv.Itoa(d)
	}
	tuple := strings.Join(dims, ", ")
	if len(shape) == 1 {
		tuple += ","
	}
	dict := fmt.Sprintf("{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }", tuple)
	total := len(npyMagic) + 4 + len(dict) + 1
	padded := (total + 63) / 64 * 64
	h := append([]byte(nil), npyMagic...)
	h = append(h, 1, 0)
	h = binary.LittleEndian.AppendUint16(h, uint16(padded-len(npyMagic)-4))
	h = append(h, dict...)
	h = append(h, bytes.Repeat([]byte(" "), padded-total)...)
	return append(h, '\n')
}

// writeNpy writes the vectors of one hook as a [layers, hidden] float32 array (zero rows for
// layers without a vector).
func writeNpy(w io.Writer, cfg steer.ModelConfig, vecs []steer.Vector) error {
	rows := make([][]float32, cfg.Layers)
	for _, v := range vecs {
		if rows[v.Layer] != nil {
			return fmt.Errorf("%w: %s layer %d twice", steer.ErrDuplicate, v.Hook, v.Layer)
		}
		rows[v.Layer] = scaled(v)
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	if _, err := bw.Write(npyHeader([]int{cfg.Layers, cfg.Hidden})); err != nil {
		return err
	}
	zero := make([]float32, cfg.Hidden)
	for _, r := range rows {
		if r == nil {
			r = zero
		}
		if err := writeF32(bw, r); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// writeNpz writes one stored (uncompressed) "<hook>.npy" member per hook, as np.savez does.
func writeNpz(w io.Writer, cfg steer.ModelConfig, vecs []steer.Vector) error {
	zw := zip.NewWriter(w)
	for id := range cfg.NumHooks() {
		hook := cfg.HookName(steer.HookID(id))
		var mine []steer.Vector
		for _, v := range vecs {
			if v.Hook == hook {
				mine = append(mine, v)
			}
		}
		if len(mine) == 0 {
			continue
		}
		fw, err := zw.CreateHeader(&zip.FileHeader{Name: hook + ".npy", Method: zip.Store, Modified: time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)})
		if err != nil {
			return err
		}
		if err := writeNpy(fw, cfg, mine); err != nil {
			return err
		}
	}
	return zw.Close()
}
