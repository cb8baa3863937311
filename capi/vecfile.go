package main

/*
#include <stdint.h>
#include "shmsteer.h"
*/
import "C"

import (
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
	"github.com/shmsteer/shmsteer/steer/vecfile"
)

// importOptionsJSON is the options JSON of shmsteer_vector_import (vecfile.ImportOptions).
type importOptionsJSON struct {
	Scale     *float64 `json:"scale"`
	Layers    string   `json:"layers"`
	Hook      string   `json:"hook"`
	Format    string   `json:"format"`
	MaxBytes  int64    `json:"max_bytes"`
	ModelHint *string  `json:"model_hint"` // replaces the GGUF's hint when given
}

// parseImportOptions turns the options JSON (empty: defaults) into vecfile.ImportOptions and
// the model hint given (nil: the file's).
func parseImportOptions(js string) (vecfile.ImportOptions, *string, error) {
	var o importOptionsJSON
	if strings.TrimSpace(js) != "" {
		if err := decodeJSONString(js, &o); err != nil {
			return vecfile.ImportOptions{}, nil, err
		}
	}
	opts, err := o.options()
	if err == nil && o.ModelHint != nil {
		err = steer.CheckModelHint(*o.ModelHint)
	}
	return opts, o.ModelHint, err
}

func (o importOptionsJSON) options() (vecfile.ImportOptions, error) {
	opts := vecfile.ImportOptions{Format: vecfile.Format(o.Format), Hook: o.Hook, MaxBytes: o.MaxBytes}
	if o.MaxBytes < 0 {
		return opts, fmt.Errorf("%w: max_bytes %d is negative (0 means the default cap)", vecfile.ErrBadOptions, o.MaxBytes)
	}
	if o.Scale != nil {
		// A scale beyond float32 would become Inf: vecfile refuses a non-finite scale.
		if math.Abs(*o.Scale) > math.MaxFloat32 && !math.IsInf(*o.Scale, 0) {
			return opts, fmt.Errorf("%w: scale %v does not fit float32", vecfile.ErrBadOptions, *o.Scale)
		}
		opts.Scale = float32(*o.Scale)
		// vecfile reads Scale 0 as 1: a 0 (or a scale that rounds to 0 in float32) is refused.
		if opts.Scale == 0 {
			return opts, fmt.Errorf("%w: scale %v is 0 in float32 and would steer nothing (omit scale for 1)", vecfile.ErrBadOptions, *o.Scale)
		}
	}
	if o.Layers != "" {
		r, err := vecfile.ParseLayerRange(o.Layers)
		if err != nil {
			return opts, err
		}
		opts.Layers = &r
	}
	return opts, nil
}

//export shmsteerGo_vector_import
func shmsteerGo_vector_import(h C.uint64_t, name *C.char, nameLen C.size_t, path *C.char, opts *C.char, optsLen C.size_t, version *C.uint64_t, digest *C.uint8_t) C.int {
	if path == nil {
		return badArg("path")
	}
	return importVectors(h, name, nameLen, opts, optsLen, version, digest, func(cfg steer.ModelConfig, o vecfile.ImportOptions) ([]steer.Vector, string, error) {
		p := C.GoString(path)
		vecs, err := vecfile.Import(p, cfg, o)
		if err != nil {
			return nil, "", err
		}
		return vecs, vecfile.FileModelHint(p), nil
	})
}

//export shmsteerGo_vector_import_bytes
func shmsteerGo_vector_import_bytes(h C.uint64_t, name *C.char, nameLen C.size_t, data unsafe.Pointer, dataLen C.size_t, fileName *C.char, opts *C.char, optsLen C.size_t, version *C.uint64_t, digest *C.uint8_t) C.int {
	if (data == nil && dataLen != 0) || dataLen > C.size_t(math.MaxInt) || fileName == nil {
		return badArg("data or file_name")
	}
	return importVectors(h, name, nameLen, opts, optsLen, version, digest, func(cfg steer.ModelConfig, o vecfile.ImportOptions) ([]steer.Vector, string, error) {
		// Viewed in place: ImportBytes does not retain b, and the vectors it returns are copies.
		b := unsafe.Slice((*byte)(data), int(dataLen))
		vecs, err := vecfile.ImportBytes(b, C.GoString(fileName), cfg, o)
		return vecs, vecfile.ModelHint(b), err
	})
}

// importVectors is shmsteer_vector_import and _import_bytes after their source: parse the
// options, read the vectors (and the file's model hint) for the region's model, register them
// under name with the hint (the options' model_hint replaces the file's).
func importVectors(h C.uint64_t, name *C.char, nameLen C.size_t, opts *C.char, optsLen C.size_t, version *C.uint64_t, digest *C.uint8_t,
	read func(steer.ModelConfig, vecfile.ImportOptions) ([]steer.Vector, string, error)) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sname, ok := cstr(name, nameLen)
	sopts, ok2 := cstr(opts, optsLen)
	if !ok || !ok2 {
		return badArg("name or options")
	}
	o, given, err := parseImportOptions(sopts)
	if err != nil {
		return fail(err)
	}
	vecs, hint, err := read(inst.cfg, o)
	if err != nil {
		return fail(err)
	}
	if given != nil {
		hint = *given
	} else if err := steer.CheckModelHint(hint); err != nil {
		return fail(fmt.Errorf("the file's controlvector.model_hint: %w (give options' model_hint to replace it)", err))
	}
	vi, err := inst.eng.Register(strings.Clone(sname), vecs, steer.ModelHint(hint))
	if err != nil {
		return fail(err)
	}
	if version != nil {
		*version = C.uint64_t(vi.Version)
	}
	if digest != nil {
		d := unsafe.Slice(digest, len(vi.Digest))
		for i, b := range vi.Digest {
			d[i] = C.uint8_t(b)
		}
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_vector_export
func shmsteerGo_vector_export(h C.uint64_t, name *C.char, nameLen C.size_t, path *C.char, format *C.char, modelHint *C.char) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sname, ok := cstr(name, nameLen)
	if !ok || path == nil {
		return badArg("name or path")
	}
	f := vecfile.Format(goString(format))
	var hint *string // NULL: the stored hint
	if modelHint != nil {
		s := C.GoString(modelHint)
		if err := steer.CheckModelHint(s); err != nil {
			return fail(err)
		}
		hint = &s
	}
	snap, err := inst.region.Snapshot()
	if err != nil {
		return fail(err)
	}
	// The vectors' data alias the mapping: the snapshot stays pinned until the file is written.
	defer snap.Close()
	if err := exportAt(inst, &snap, sname, C.GoString(path), f, hint); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

func exportAt(inst *instance, snap *shm.Snapshot, name, path string, f vecfile.Format, hint *string) error {
	nv, err := inst.eng.Vector(snap, name)
	if err != nil {
		return err
	}
	m, err := inst.eng.VectorMeta(snap, name)
	if err != nil {
		return err
	}
	if hint != nil {
		m.ModelHint = *hint
	}
	return vecfile.ExportFile(path, f, inst.cfg, nv.Vectors, vecfile.ExportOptions{ModelHint: m.ModelHint})
}
