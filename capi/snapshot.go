package main

// shmsteer_snapshot_t: a pinned version of the region, and the named vectors read at it.

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

type snapshot struct {
	inst *instance
	snap shm.Snapshot
}

//export shmsteerGo_snapshot_open
func shmsteerGo_snapshot_open(h C.uint64_t, version C.uint64_t, out *C.uint64_t, pinned *C.uint64_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	var s shm.Snapshot
	var err error
	if version == 0 {
		s, err = inst.region.Snapshot()
	} else {
		s, err = inst.region.SnapshotAt(uint64(version))
	}
	if err != nil {
		return fail(err)
	}
	sn := &snapshot{inst: inst, snap: s}
	if rc := store(sn, out); rc != C.SHMSTEER_OK {
		s.Close()
		return rc
	}
	if pinned != nil {
		*pinned = C.uint64_t(s.Version())
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_snapshot_close
func shmsteerGo_snapshot_close(h C.uint64_t) C.int {
	sn, ok := getAs[*snapshot](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_snapshot_close")
	}
	sn.snap.Close()
	return C.SHMSTEER_OK
}

//export shmsteerGo_vector_view
func shmsteerGo_vector_view(h C.uint64_t, name *C.char, nameLen C.size_t, info *C.shmsteer_vector_info, entries *C.shmsteer_vector_entry, capacity C.size_t) C.int {
	return vectorView(steer.VectorSteer, h, name, nameLen, info, entries, capacity)
}

// vectorView views a named vector of kind (steering vector or probe) at a snapshot.
func vectorView(kind steer.VectorKind, h C.uint64_t, name *C.char, nameLen C.size_t, info *C.shmsteer_vector_info, entries *C.shmsteer_vector_entry, capacity C.size_t) C.int {
	sn, ok := getAs[*snapshot](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_snapshot_t")
	}
	if sn.inst.eng == nil {
		return fail(fmt.Errorf("the region records no steering model: %w", sn.inst.engErr))
	}
	sname, ok := cstr(name, nameLen)
	if !ok || info == nil || (entries == nil && capacity > 0) || uint64(capacity) > math.MaxInt32 {
		return badArg("name, info, entries or cap")
	}
	read := sn.inst.eng.Vector
	if kind == steer.VectorProbe {
		read = sn.inst.eng.Probe
	}
	nv, err := read(&sn.snap, sname)
	if err != nil {
		return fail(err)
	}
	info.version = C.uint64_t(nv.Version)
	for i, b := range nv.Digest {
		info.digest[i] = C.uint8_t(b)
	}
	info.n_entries = C.size_t(len(nv.Vectors))
	if len(nv.Vectors) > int(capacity) {
		return failCode(ErrBufferTooSmall, fmt.Sprintf("vector %q has %d entries, room for %d", sname, len(nv.Vectors), capacity))
	}
	var out []C.shmsteer_vector_entry
	if capacity > 0 {
		out = unsafe.Slice(entries, int(capacity))
	}
	for i, v := range nv.Vectors {
		hook, err := sn.inst.cfg.Hook(v.Hook)
		if err != nil {
			return fail(err)
		}
		e := &out[i]
		e.hook, e.layer, e.scale, e.len = C.uint32_t(hook), C.int32_t(v.Layer), C.float(v.Scale), C.size_t(len(v.Data))
		e.data = nil
		if len(v.Data) > 0 {
			e.data = (*C.float)(unsafe.Pointer(&v.Data[0])) // into the mapping, not the Go heap
		}
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_vector_list_json
func shmsteerGo_vector_list_json(h C.uint64_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	return vectorListJSON(steer.VectorSteer, h, buf, capacity, n)
}

//export shmsteerGo_vector_model_hint
func shmsteerGo_vector_model_hint(h C.uint64_t, name *C.char, nameLen C.size_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	sn, ok := getAs[*snapshot](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_snapshot_t")
	}
	if sn.inst.eng == nil {
		return fail(fmt.Errorf("the region records no steering model: %w", sn.inst.engErr))
	}
	sname, ok := cstr(name, nameLen)
	if !ok {
		return badArg("name")
	}
	if _, _, err := sn.snap.View(steer.KindVector, sname); err != nil {
		if errors.Is(err, shm.ErrNotFound) {
			err = fmt.Errorf("%w: named vector %q", steer.ErrUnknownVector, sname)
		}
		return fail(err)
	}
	m, err := sn.inst.eng.VectorMeta(&sn.snap, sname)
	if err != nil {
		return fail(err)
	}
	return writeOut([]byte(m.ModelHint), buf, capacity, n)
}
