package vecfile

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/nlpodyssey/safetensors"

	"github.com/shmsteer/shmsteer/steer"
)

// parseSafetensors reads b with github.com/nlpodyssey/safetensors, which validates the JSON
// header, the dtypes, the shapes against the byte ranges and that the ranges tile the data
// section exactly (so no tensor is read twice). Tensors are converted in file order and
// release is told after each, so pages of a mapped file can be dropped as the import goes.
func parseSafetensors(acc *accumulator, b []byte, release func(int)) error {
	st, err := deserializeSafetensors(b)
	if err != nil {
		if name, dt, ok := unknownSafetensorsDtype(b); ok {
			// The parser refuses dtypes it does not know (F8_E4M3, say) as a bad header; the
			// file is well formed, its element type is what is unsupported.
			return acc.errf(ErrDtype, name, "dtype %q, want F16, BF16, F32 or F64", dt)
		}
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, acc.file, err)
	}
	dataStart := len(b) - dataLen(st)
	end := dataStart
	for _, t := range st.Tensors() {
		end += len(t.TensorView.Data())
		if err := addSafetensor(acc, t); err != nil {
			return err
		}
		if release != nil {
			release(end)
		}
	}
	return nil
}

// unknownSafetensorsDtype finds, in a header that is valid JSON, the first tensor (by name)
// whose dtype the parser does not know.
func unknownSafetensorsDtype(b []byte) (name, dt string, ok bool) {
	if len(b) < 8 {
		return "", "", false
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return "", "", false
	}
	var hdr map[string]json.RawMessage
	if json.Unmarshal(b[8:8+n], &hdr) != nil {
		return "", "", false
	}
	names := make([]string, 0, len(hdr))
	for k := range hdr {
		if k != "__metadata__" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		var t struct {
			Dtype string `json:"dtype"`
		}
		if json.Unmarshal(hdr[k], &t) != nil {
			continue
		}
		if _, err := safetensors.ParseDType(t.Dtype); err != nil {
			return k, t.Dtype, true
		}
	}
	return "", "", false
}

func dataLen(st safetensors.SafeTensors) int {
	n := 0
	for _, t := range st.Tensors() {
		n += len(t.TensorView.Data())
	}
	return n
}

// deserializeSafetensors turns a panic inside the third-party parser into an error: the input
// is untrusted and the fuzz target checks this never happens, but a server must not die if it
// does.
func deserializeSafetensors(b []byte) (st safetensors.SafeTensors, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: %v", parserPanicked, r)
		}
	}()
	return safetensors.Deserialize(b)
}

func safetensorsDtype(d safetensors.DType) (dtype, bool) {
	switch d {
	case safetensors.F16:
		return dtF16, true
	case safetensors.BF16:
		return dtBF16, true
	case safetensors.F32:
		return dtF32, true
	case safetensors.F64:
		return dtF64, true
	}
	return dtype{}, false
}

// tensorTarget parses a tensor name: "<hook>.<N>", "layers.<N>.<hook>", "layers.<N>" (the
// default hook) or "<hook>" (a whole [layers, hidden] array). layer is -1 for the last form.
func tensorTarget(name, defaultHook string) (hook string, layer int, ok bool) {
	parts := strings.Split(name, ".")
	num := func(s string) (int, bool) {
		if s == "" || (s[0] == '0' && s != "0") || strings.Trim(s, "0123456789") != "" {
			return 0, false
		}
		n, err := strconv.Atoi(s)
		return n, err == nil
	}
	switch {
	case len(parts) == 1 && parts[0] != "":
		return parts[0], -1, true
	case len(parts) == 2 && parts[0] == "layers":
		n, ok := num(parts[1])
		return defaultHook, n, ok
	case len(parts) == 2:
		n, ok := num(parts[1])
		return parts[0], n, ok
	case len(parts) == 3 && parts[0] == "layers":
		n, ok := num(parts[1])
		return parts[2], n, ok
	}
	return "", 0, false
}

func addSafetensor(acc *accumulator, t safetensors.NamedTensorView) error {
	hookName, layer, ok := tensorTarget(t.Name, acc.opts.hook())
	if !ok {
		return acc.errf(ErrTensorName, t.Name, "want <hook>.<layer>, layers.<layer>.<hook>, layers.<layer> (%s) or <hook> ([layers, hidden])", acc.opts.hook())
	}
	dt, ok := safetensorsDtype(t.TensorView.DType())
	if !ok {
		return acc.errf(ErrDtype, t.Name, "dtype %v, want F16, BF16, F32 or F64", t.TensorView.DType())
	}
	shape := make([]int, 0, len(t.TensorView.Shape()))
	for _, d := range t.TensorView.Shape() {
		if d > math.MaxInt32 {
			return acc.errf(ErrShape, t.Name, "shape %s", shapeString(t.TensorView.Shape()))
		}
		shape = append(shape, int(d))
	}
	a := &npyArray{dt: dt, shape: shape, data: t.TensorView.Data()}
	if layer < 0 {
		return addArray(acc, t.Name, hookName, a)
	}
	if len(shape) == 2 && shape[0] == 1 {
		a.shape = shape[1:]
	}
	if len(a.shape) != 1 || a.shape[0] != acc.cfg.Hidden {
		return fmt.Errorf("%w (%w): %s: tensor %q: shape %s, want [%d] (the model's hidden size)", ErrShape, steer.ErrHiddenSize, acc.file, t.Name, shapeString(shape), acc.cfg.Hidden)
	}
	hook, err := acc.hookID(t.Name, hookName)
	if err != nil {
		return err
	}
	keep, err := acc.wantLayer(t.Name, layer)
	if err != nil || !keep {
		return err
	}
	return acc.add(t.Name, hook, layer, dt, a.data, false)
}

// writeSafetensors writes one F32 [hidden] tensor per vector, named "<hook>.<layer>", with
// metadata {"format": "pt"} so safetensors.torch loads it.
func writeSafetensors(w io.Writer, vecs []steer.Vector) error {
	views := make(map[string]safetensors.TensorView, len(vecs))
	for _, v := range vecs {
		name := v.Hook + "." + strconv.Itoa(v.Layer)
		if _, dup := views[name]; dup {
			return fmt.Errorf("%w: %s layer %d twice", steer.ErrDuplicate, v.Hook, v.Layer)
		}
		data := make([]byte, 4*len(v.Data))
		for i, f := range scaled(v) {
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(f))
		}
		tv, err := safetensors.NewTensorView(safetensors.F32, []uint64{uint64(len(v.Data))}, data)
		if err != nil {
			return err
		}
		views[name] = tv
	}
	bw := bufio.NewWriterSize(w, 1<<16)
	if err := safetensors.SerializeToWriter(views, map[string]string{"format": "pt"}, bw); err != nil {
		return err
	}
	return bw.Flush()
}

// parserPanicked marks a recovered panic of the safetensors library; the fuzz target fails on it.
const parserPanicked = "safetensors parser panicked"
