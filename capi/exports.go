package main

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// instance is an attached client or an in-process owner: what a shmsteer_t stands for.
type instance struct {
	owner   *ipc.Owner  // nil in a client
	client  *ipc.Client // nil in an owner
	region  *shm.Region
	keys    *ipc.Registry
	eng     *steer.Engine // nil if the region records no model config
	engErr  error         // why eng is nil
	cfg     steer.ModelConfig
	ownerPD int
}

type snapshot struct {
	inst *instance
	snap shm.Snapshot
}

type stepper struct {
	inst  *instance
	st    *steer.Stepper
	spans []steer.Span
	ids   map[string]string // interned request ids: Stepper keeps the strings it is given
}

type reader struct {
	kr *ipc.KeyReader
}

// cstr views (p, n) as a string without copying; valid only during the call, for callees that
// do not keep it.
func cstr(p *C.char, n C.size_t) (string, bool) {
	if n == 0 {
		return "", true
	}
	if p == nil || uint64(n) > math.MaxInt32 {
		return "", false
	}
	return unsafe.String((*byte)(unsafe.Pointer(p)), int(n)), true
}

func cbytes(p unsafe.Pointer, n C.size_t) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	if p == nil || uint64(n) > math.MaxInt32 {
		return nil, false
	}
	return unsafe.Slice((*byte)(p), int(n)), true
}

func badArg(what string) C.int { return failCode(ErrInvalidArgument, what) }

func badHandle(what string) C.int { return failCode(ErrBadHandle, what) }

// resolveSecret applies the header's rule, ipc's: the bytes or the file, never both
// (ErrSecretConflict); the C wrapper passes SHMSTEER_SECRET as the bytes and
// SHMSTEER_SECRET_FILE as the file when the caller gives neither. The file is read by ipc's
// one reader (one trailing newline stripped), as in every Go process.
func resolveSecret(secret unsafe.Pointer, secretLen C.size_t, secretFile *C.char) (*ipc.Secret, error) {
	switch {
	case secret != nil && secretFile != nil:
		return nil, fmt.Errorf("%w: both a secret and a secret file (as arguments, or SHMSTEER_SECRET and SHMSTEER_SECRET_FILE)", ipc.ErrSecretConflict)
	case secret != nil:
		b, ok := cbytes(secret, secretLen)
		if !ok {
			return nil, fmt.Errorf("%w: secret length", ErrInvalidArgument)
		}
		s := ipc.NewSecret(b) // copies
		return &s, nil
	case secretFile != nil:
		s, err := ipc.SecretFromFile(C.GoString(secretFile), ipc.SecretFileOptions{})
		if err != nil {
			return nil, err
		}
		return &s, nil
	}
	// The C wrapper already looked at SHMSTEER_SECRET and SHMSTEER_SECRET_FILE in the live
	// environment (Go's copy may be stale in a host process that changed it after loading the
	// library).
	return nil, ipc.ErrAuthSecretNotDefined
}

func goString(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// quietLogger logs warnings and errors only: attach and detach events would flood a worker's
// stderr.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

//export shmsteerGo_attach
func shmsteerGo_attach(ns *C.char, secret unsafe.Pointer, secretLen C.size_t, secretFile *C.char, timeoutMs C.int64_t, out *C.uint64_t) C.int {
	if out == nil || timeoutMs < 0 {
		return badArg("out must not be NULL and timeout_ms not negative")
	}
	sec, err := resolveSecret(secret, secretLen, secretFile)
	if err != nil {
		return fail(err)
	}
	c, err := ipc.Attach(ipc.ClientOptions{Secret: sec, Namespace: goString(ns), Timeout: time.Duration(timeoutMs) * time.Millisecond})
	if err != nil {
		return fail(err)
	}
	rc := store(clientInstance(c), out)
	if rc != C.SHMSTEER_OK {
		c.Close()
	}
	return rc
}

func store(v any, out *C.uint64_t) C.int {
	h := handles.put(v)
	if h == 0 {
		return failCode(ErrOther, fmt.Sprintf("more than %d shmsteer objects alive in this process", maxHandles))
	}
	*out = C.uint64_t(h)
	return C.SHMSTEER_OK
}

//export shmsteerGo_owner_start
func shmsteerGo_owner_start(ns *C.char, secret unsafe.Pointer, secretLen C.size_t, secretFile *C.char, cfg *C.shmsteer_owner_config, out *C.uint64_t) C.int {
	if out == nil || cfg == nil {
		return badArg("cfg and out must not be NULL")
	}
	mc := steer.ModelConfig{Hidden: int(cfg.hidden), Layers: int(cfg.layers)}
	if cfg.hooks != nil {
		mc.Hooks = strings.Split(C.GoString(cfg.hooks), ",")
	}
	if err := mc.Validate(); err != nil {
		return fail(err)
	}
	if cfg.index_slots < 0 || cfg.arena_bytes < 0 || cfg.reader_slots < 0 || cfg.grace_ms < 0 || cfg.max_key_bytes < 0 {
		return badArg("owner config sizes must not be negative")
	}
	index, arena := int(cfg.index_slots), int64(cfg.arena_bytes)
	if index == 0 {
		index = 1 << 16
	}
	if arena == 0 {
		arena = 256 << 20
	}
	rc, err := steer.RegionConfig(mc, shm.Config{IndexSlots: index, ArenaBytes: arena, ReaderSlots: int(cfg.reader_slots)})
	if err != nil {
		return fail(err)
	}
	sec, err := resolveSecret(secret, secretLen, secretFile)
	if err != nil {
		return fail(err)
	}
	o, err := ipc.NewOwner(ipc.OwnerOptions{
		Secret: sec, Namespace: goString(ns), Region: rc,
		Grace:       time.Duration(cfg.grace_ms) * time.Millisecond,
		MaxKeyBytes: int(cfg.max_key_bytes),
		Logger:      quietLogger(),
	})
	if err != nil {
		return fail(err)
	}
	eng, err := steer.Open(o.Region(), &mc, steer.Options{Clients: o.Clients, Logf: func(f string, a ...any) {
		quietLogger().Warn(fmt.Sprintf(f, a...))
	}})
	if err != nil {
		o.Close()
		return fail(err)
	}
	eng.Serve(func(op uint16, h func([]byte) ([]byte, error)) { o.Handle(op, h) })
	inst := &instance{owner: o, region: o.Region(), keys: o.Keys(), eng: eng, cfg: mc, ownerPD: os.Getpid()}
	if code := store(inst, out); code != C.SHMSTEER_OK {
		o.Close()
		return code
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_close
func shmsteerGo_close(h C.uint64_t) C.int {
	inst, ok := getAs[*instance](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_close")
	}
	var err error
	if inst.owner != nil {
		err = inst.owner.Close()
	} else {
		err = inst.client.Close()
	}
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

func instanceOf(h C.uint64_t) (*instance, C.int) {
	inst, ok := getAs[*instance](uint64(h))
	if !ok {
		return nil, badHandle("not a live shmsteer_t")
	}
	return inst, C.SHMSTEER_OK
}

func engineOf(h C.uint64_t) (*instance, C.int) {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return nil, rc
	}
	if inst.eng == nil {
		return nil, fail(fmt.Errorf("the region records no steering model: %w", inst.engErr))
	}
	return inst, C.SHMSTEER_OK
}

//export shmsteerGo_ping
func shmsteerGo_ping(h C.uint64_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if inst.client != nil {
		if err := inst.client.Ping(); err != nil {
			return fail(err)
		}
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_model
func shmsteerGo_model(h C.uint64_t, hidden, layers, numHooks *C.int32_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if hidden != nil {
		*hidden = C.int32_t(inst.cfg.Hidden)
	}
	if layers != nil {
		*layers = C.int32_t(inst.cfg.Layers)
	}
	if numHooks != nil {
		*numHooks = C.int32_t(inst.cfg.NumHooks())
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_hook_id
func shmsteerGo_hook_id(h C.uint64_t, name *C.char, id *C.uint32_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if name == nil || id == nil {
		return badArg("name and id must not be NULL")
	}
	hid, err := inst.cfg.Hook(C.GoString(name))
	if err != nil {
		return fail(err)
	}
	*id = C.uint32_t(hid)
	return C.SHMSTEER_OK
}

//export shmsteerGo_version
func shmsteerGo_version(h C.uint64_t, v *C.uint64_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if v == nil {
		return badArg("version must not be NULL")
	}
	*v = C.uint64_t(inst.region.Version())
	return C.SHMSTEER_OK
}

// writeOut copies b to (buf, capacity) and sets *n, or reports the size needed.
func writeOut(b []byte, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	if n == nil || (buf == nil && capacity > 0) {
		return badArg("len must not be NULL, nor buf with cap > 0")
	}
	*n = C.size_t(len(b))
	if uint64(len(b)) > uint64(capacity) {
		return failCode(ErrBufferTooSmall, fmt.Sprintf("%d bytes needed, %d given", len(b), capacity))
	}
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(b)), b)
	}
	return C.SHMSTEER_OK
}

type modelJSON struct {
	Hidden int      `json:"hidden"`
	Layers int      `json:"layers"`
	Hooks  []string `json:"hooks"`
}

//export shmsteerGo_status_json
func shmsteerGo_status_json(h C.uint64_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	st := struct {
		Owner    bool          `json:"owner"`
		OwnerPID int           `json:"owner_pid"`
		PID      int           `json:"pid"`
		Model    *modelJSON    `json:"model,omitempty"`
		Steer    *steer.Status `json:"steer,omitempty"`
		Region   shm.Stats     `json:"region"`
	}{Owner: inst.owner != nil, OwnerPID: inst.ownerPD, PID: os.Getpid(), Region: inst.region.Stats()}
	if inst.eng != nil {
		hooks := make([]string, inst.cfg.NumHooks())
		for i := range hooks {
			hooks[i] = inst.cfg.HookName(steer.HookID(i))
		}
		st.Model = &modelJSON{Hidden: inst.cfg.Hidden, Layers: inst.cfg.Layers, Hooks: hooks}
		s, err := inst.eng.Status()
		if err != nil {
			return fail(err)
		}
		st.Steer = &s
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fail(err)
	}
	return writeOut(b, buf, capacity, n)
}

// finishGet turns a Get into (buf, capacity) into the ABI's result. A key that did not fit was
// appended to a fresh Go buffer instead: copy it if it fits after all, and wipe it either way.
func finishGet(out []byte, err error, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	if err != nil {
		return fail(err)
	}
	if len(out) > 0 && unsafe.Pointer(&out[0]) != buf {
		defer clear(out)
		*n = C.size_t(len(out))
		if uint64(len(out)) > uint64(capacity) {
			return failCode(ErrBufferTooSmall, fmt.Sprintf("the key has %d bytes, the buffer %d", len(out), capacity))
		}
		copy(unsafe.Slice((*byte)(buf), len(out)), out)
		return C.SHMSTEER_OK
	}
	*n = C.size_t(len(out))
	return C.SHMSTEER_OK
}

func getArgs(id *C.char, idLen C.size_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) (string, []byte, bool) {
	sid, ok := cstr(id, idLen)
	if !ok || n == nil || (buf == nil && capacity > 0) || uint64(capacity) > math.MaxInt32 {
		return "", nil, false
	}
	var dst []byte
	if buf != nil {
		dst = unsafe.Slice((*byte)(buf), int(capacity))[:0]
	}
	return sid, dst, true
}

//export shmsteerGo_key_get
func shmsteerGo_key_get(h C.uint64_t, id *C.char, idLen C.size_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	inst, ok := getAs[*instance](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_t")
	}
	sid, dst, ok := getArgs(id, idLen, buf, capacity, n)
	if !ok {
		return badArg("id, buf, cap or len")
	}
	out, err := inst.keys.Get(sid, dst)
	return finishGet(out, err, buf, capacity, n)
}

//export shmsteerGo_key_set
func shmsteerGo_key_set(h C.uint64_t, id *C.char, idLen C.size_t, key unsafe.Pointer, keyLen C.size_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sid, ok := cstr(id, idLen)
	kb, ok2 := cbytes(key, keyLen)
	if !ok || !ok2 {
		return badArg("id or key")
	}
	if err := inst.keys.Set(strings.Clone(sid), kb); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_key_remove
func shmsteerGo_key_remove(h C.uint64_t, id *C.char, idLen C.size_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sid, ok := cstr(id, idLen)
	if !ok {
		return badArg("id")
	}
	// The owner's purge schedule keeps the id: give it a copy, not a view of C memory.
	if err := inst.keys.Remove(strings.Clone(sid)); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_key_list_json
func shmsteerGo_key_list_json(h C.uint64_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	type entry struct {
		ID      string `json:"id"`
		Revoked bool   `json:"revoked"`
	}
	list := []entry{}
	if err := inst.keys.Range(func(id string, revoked bool) bool {
		list = append(list, entry{id, revoked})
		return true
	}); err != nil {
		return fail(err)
	}
	b, err := json.Marshal(list)
	if err != nil {
		return fail(err)
	}
	return writeOut(b, buf, capacity, n)
}

//export shmsteerGo_reader_open
func shmsteerGo_reader_open(h C.uint64_t, out *C.uint64_t) C.int {
	inst, rc := instanceOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	kr, err := inst.keys.NewReader()
	if err != nil {
		return fail(err)
	}
	if rc := store(&reader{kr: kr}, out); rc != C.SHMSTEER_OK {
		kr.Close()
		return rc
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_reader_key_get
func shmsteerGo_reader_key_get(h C.uint64_t, id *C.char, idLen C.size_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	r, ok := getAs[*reader](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_reader_t")
	}
	sid, dst, ok := getArgs(id, idLen, buf, capacity, n)
	if !ok {
		return badArg("id, buf, cap or len")
	}
	out, err := r.kr.Get(sid, dst)
	return finishGet(out, err, buf, capacity, n)
}

//export shmsteerGo_reader_close
func shmsteerGo_reader_close(h C.uint64_t) C.int {
	r, ok := getAs[*reader](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_reader_close")
	}
	if err := r.kr.Close(); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
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

// vectorListJSON lists the named vectors of kind at a snapshot as JSON.
func vectorListJSON(kind steer.VectorKind, h C.uint64_t, buf *C.char, capacity C.size_t, n *C.size_t) C.int {
	sn, ok := getAs[*snapshot](uint64(h))
	if !ok {
		return badHandle("not a live shmsteer_snapshot_t")
	}
	if sn.inst.eng == nil {
		return fail(fmt.Errorf("the region records no steering model: %w", sn.inst.engErr))
	}
	infosOf := sn.inst.eng.VectorInfos
	if kind == steer.VectorProbe {
		infosOf = sn.inst.eng.ProbeInfos
	}
	infos, err := infosOf(&sn.snap)
	if err != nil {
		return fail(err)
	}
	type entry struct {
		Name    string `json:"name"`
		Version uint64 `json:"version"`
		Digest  string `json:"digest"`
	}
	list := make([]entry, 0, len(infos))
	for _, vi := range infos {
		list = append(list, entry{vi.Name, vi.Version, vi.Digest.String()})
	}
	b, err := json.Marshal(list)
	if err != nil {
		return fail(err)
	}
	return writeOut(b, buf, capacity, n)
}

//export shmsteerGo_vector_register
func shmsteerGo_vector_register(h C.uint64_t, name *C.char, nameLen C.size_t, entries *C.shmsteer_vector_entry, count C.size_t, version *C.uint64_t) C.int {
	return vectorRegister(steer.VectorSteer, h, name, nameLen, entries, count, version)
}

// vectorRegister registers a named vector of kind (a probe: exactly one entry).
func vectorRegister(kind steer.VectorKind, h C.uint64_t, name *C.char, nameLen C.size_t, entries *C.shmsteer_vector_entry, count C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sname, ok := cstr(name, nameLen)
	if !ok || (entries == nil && count > 0) || uint64(count) > math.MaxInt32 {
		return badArg("name, entries or n")
	}
	var in []C.shmsteer_vector_entry
	if count > 0 {
		in = unsafe.Slice(entries, int(count))
	}
	vecs := make([]steer.Vector, len(in))
	for i, e := range in {
		hookName := inst.cfg.HookName(steer.HookID(e.hook))
		if hookName == "" {
			return fail(fmt.Errorf("%w: hook id %d in entry %d", steer.ErrUnknownHook, e.hook, i))
		}
		if e.data == nil && e.len > 0 || uint64(e.len) > math.MaxInt32 {
			return badArg(fmt.Sprintf("entry %d data", i))
		}
		var data []float32
		if e.len > 0 {
			data = unsafe.Slice((*float32)(unsafe.Pointer(e.data)), int(e.len)) // encoded (copied) by Register
		}
		vecs[i] = steer.Vector{Hook: hookName, Layer: int(e.layer), Scale: float32(e.scale), Data: data}
	}
	reg := inst.eng.Register
	if kind == steer.VectorProbe {
		reg = inst.eng.RegisterProbe
	}
	vi, err := reg(strings.Clone(sname), vecs)
	return versionOut(version, vi.Version, err)
}

//export shmsteerGo_vector_unregister
func shmsteerGo_vector_unregister(h C.uint64_t, name *C.char, nameLen C.size_t, version *C.uint64_t) C.int {
	return vectorUnregister(steer.VectorSteer, h, name, nameLen, version)
}

// vectorUnregister deletes a named vector of kind.
func vectorUnregister(kind steer.VectorKind, h C.uint64_t, name *C.char, nameLen C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sname, ok := cstr(name, nameLen)
	if !ok {
		return badArg("name")
	}
	unreg := inst.eng.Unregister
	if kind == steer.VectorProbe {
		unreg = inst.eng.UnregisterProbe
	}
	v, err := unreg(strings.Clone(sname))
	return versionOut(version, v, err)
}

func decodeJSON(p *C.char, n C.size_t, v any) error {
	s, ok := cstr(p, n)
	if !ok {
		return fmt.Errorf("%w: json pointer or length", ErrInvalidArgument)
	}
	return decodeJSONString(s, v)
}

// decodeJSONString decodes exactly one JSON value into v, refusing unknown fields.
func decodeJSONString(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: JSON: %v", ErrInvalidArgument, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("%w: JSON: trailing data", ErrInvalidArgument)
	}
	return nil
}

//export shmsteerGo_global_set_json
func shmsteerGo_global_set_json(h C.uint64_t, js *C.char, jsLen C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	var s steer.Steering
	if err := decodeJSON(js, jsLen, &s); err != nil {
		return fail(err)
	}
	v, err := inst.eng.SetGlobal(s)
	return versionOut(version, v, err)
}

// admissionJSON is the admission JSON of shmsteer_request_admit_json.
type admissionJSON struct {
	Tenant       string          `json:"tenant"`
	Conversation string          `json:"conversation"`
	Override     *steer.Steering `json:"override"`
}

//export shmsteerGo_request_admit_json
func shmsteerGo_request_admit_json(h C.uint64_t, id *C.char, idLen C.size_t, js *C.char, jsLen C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sid, ok := cstr(id, idLen)
	if !ok {
		return badArg("id")
	}
	var a admissionJSON
	if jsLen > 0 {
		if err := decodeJSON(js, jsLen, &a); err != nil {
			return fail(err)
		}
	}
	ad, err := inst.eng.Admit(steer.Admission{RequestID: strings.Clone(sid), Conversation: steer.ConvKey{Tenant: a.Tenant, ID: a.Conversation}, Override: a.Override})
	return versionOut(version, ad.Version, err)
}

//export shmsteerGo_request_end
func shmsteerGo_request_end(h C.uint64_t, id *C.char, idLen C.size_t, version *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sid, ok := cstr(id, idLen)
	if !ok {
		return badArg("id")
	}
	v, err := inst.eng.End(strings.Clone(sid))
	return versionOut(version, v, err)
}

//export shmsteerGo_stepper_new
func shmsteerGo_stepper_new(h C.uint64_t, out *C.uint64_t) C.int {
	inst, rc := engineOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if out == nil {
		return badArg("out must not be NULL")
	}
	return store(&stepper{inst: inst, st: inst.eng.NewStepper(), ids: map[string]string{}}, out)
}

//export shmsteerGo_stepper_free
func shmsteerGo_stepper_free(h C.uint64_t) C.int {
	st, ok := getAs[*stepper](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_stepper_free")
	}
	st.st.Close()
	return C.SHMSTEER_OK
}

func stepperOf(h C.uint64_t) (*stepper, C.int) {
	st, ok := getAs[*stepper](uint64(h))
	if !ok {
		return nil, badHandle("not a live shmsteer_stepper_t")
	}
	return st, C.SHMSTEER_OK
}

//export shmsteerGo_stepper_begin
func shmsteerGo_stepper_begin(h C.uint64_t, version C.uint64_t, pinned *C.uint64_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if err := st.st.Begin(uint64(version)); err != nil {
		return fail(err)
	}
	if pinned != nil {
		*pinned = C.uint64_t(st.st.Version())
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_end
func shmsteerGo_stepper_end(h C.uint64_t, checksum *C.uint64_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	sum := st.st.End()
	if checksum != nil {
		*checksum = C.uint64_t(sum)
	}
	return C.SHMSTEER_OK
}

// intern returns a Go copy of id that the stepper may keep, allocating only for an id it has
// not seen (the map lookup with string(b) does not allocate).
func (st *stepper) intern(b []byte) string {
	if s, ok := st.ids[string(b)]; ok {
		return s
	}
	if len(st.ids) >= 1<<14 {
		clear(st.ids)
	}
	s := string(b)
	st.ids[s] = s
	return s
}

//export shmsteerGo_stepper_apply
func shmsteerGo_stepper_apply(h C.uint64_t, hook C.uint32_t, layer C.int32_t, rows *C.float, nFloats C.size_t, spans *C.shmsteer_span, nSpans C.size_t) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if (rows == nil && nFloats > 0) || (spans == nil && nSpans > 0) || uint64(nFloats) > math.MaxInt || uint64(nSpans) > math.MaxInt32 || hook > math.MaxUint16 {
		return badArg("rows, spans or hook")
	}
	var cs []C.shmsteer_span
	if nSpans > 0 {
		cs = unsafe.Slice(spans, int(nSpans))
	}
	st.spans = st.spans[:0]
	for i := range cs {
		c := &cs[i]
		idb, ok := cbytes(unsafe.Pointer(c.id), c.id_len)
		if !ok || c.start < math.MinInt32 || c.end > math.MaxInt32 || c.start < 0 || c.end < 0 {
			return badArg(fmt.Sprintf("span %d", i))
		}
		st.spans = append(st.spans, steer.Span{ID: st.intern(idb), Start: int(c.start), End: int(c.end), Phase: steer.Phase(c.phase)})
	}
	var h32 []float32
	if nFloats > 0 {
		h32 = unsafe.Slice((*float32)(unsafe.Pointer(rows)), int(nFloats))
	}
	err := st.st.Apply(steer.HookID(hook), int(layer), h32, st.spans)
	runtime.KeepAlive(rows)
	if err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_stepper_effective
func shmsteerGo_stepper_effective(h C.uint64_t, id *C.char, idLen C.size_t, hook C.uint32_t, layer C.int32_t, phase C.int32_t, out *C.shmsteer_effective) C.int {
	st, rc := stepperOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	idb, ok := cbytes(unsafe.Pointer(id), idLen)
	if !ok || out == nil || hook > math.MaxUint16 {
		return badArg("id, hook or out")
	}
	eff, err := st.st.Effective(st.intern(idb), steer.HookID(hook), int(layer), steer.Phase(phase))
	if err != nil {
		return fail(err)
	}
	// Both views alias the shared mapping (not Go memory): C may hold them until the step ends.
	out.data, out.global_data, out.len = nil, nil, 0
	if len(eff.Request) > 0 {
		out.data, out.len = (*C.float)(unsafe.Pointer(&eff.Request[0])), C.size_t(len(eff.Request))
	}
	if len(eff.Global) > 0 {
		out.global_data, out.len = (*C.float)(unsafe.Pointer(&eff.Global[0])), C.size_t(len(eff.Global))
	}
	out.clamps = C.uint32_t(eff.Clamps)
	out.version = C.uint64_t(eff.Version)
	for i, b := range eff.Digest {
		out.digest[i] = C.uint8_t(b)
	}
	return C.SHMSTEER_OK
}

// versionOut ends a call that returns a region version: the error's code, or OK with *version
// set (when version is not NULL).
func versionOut(version *C.uint64_t, v uint64, err error) C.int {
	if err != nil {
		return fail(err)
	}
	if version != nil {
		*version = C.uint64_t(v)
	}
	return C.SHMSTEER_OK
}
