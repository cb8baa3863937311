package main

// shmsteer_t: an owner started in this process or a client attached to one.

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
#include "plan.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// instance is what a shmsteer_t stands for: the owner in this process or an attached client
// (its side), the region, its key registry and the steering engine. The side is chosen once, by
// shmsteer_owner_start or shmsteer_attach; no call asks which one it is except status.
type instance struct {
	side    side
	region  *shm.Region
	keys    *keys.Registry // nil if the owner serves no key registry
	keysErr error          // why keys is nil
	eng     *steer.Engine  // nil if the region records no model config
	engErr  error          // why eng is nil
	cfg     steer.ModelConfig
	ownerPD int
	hub     *capture.Hub // the owner's capture hub (shmsteer_capture_serve); nil without
	// hubOps are the hub's RPC handlers, which an owner's own steppers call in process to
	// register their capture rings (shmsteer_stepper_capture_start).
	hubOps map[uint16]func([]byte) ([]byte, error)
	global map[string]steer.CaptureGlobalSpec // the consumers' global specs (shmsteer_capture_global)
	// readers are the shmsteer_reader_t opened on it and not yet closed: closed with it.
	readers readerSet
	// plans are its steppers' C plans (plan.c), which keep words of its mapping: disarmed when
	// it closes.
	plansMu sync.Mutex
	plans   []*C.capi_plan
}

// trackPlan records a stepper's plan, to disarm when the instance closes.
func (inst *instance) trackPlan(p *C.capi_plan) {
	if p == nil {
		return
	}
	inst.plansMu.Lock()
	defer inst.plansMu.Unlock()
	if !slices.Contains(inst.plans, p) {
		inst.plans = append(inst.plans, p)
	}
}

// disarmPlans stops every plan of the instance's steppers touching its mapping (plan.c keeps
// its pin, version and horizon words, and the step's vectors).
func (inst *instance) disarmPlans() {
	inst.plansMu.Lock()
	defer inst.plansMu.Unlock()
	for _, p := range inst.plans {
		C.capi_plan_disarm(p, 1)
	}
}

// side is the process's end of the region: the owner, or a client attached to it.
type side interface {
	Close() error
	Ping() error // the owner answers for itself: nil
	IsOwner() bool
}

// ownerSide is the owner started in this process, with its steering engine's owner side (the
// instance's eng is its Engine).
type ownerSide struct {
	*ipc.Owner
	steer *steer.Owner
}

func (ownerSide) Ping() error   { return nil }
func (ownerSide) IsOwner() bool { return true }

// steerOwner is the owner's steering engine for an owner-only operation (op names it in the
// error): ErrNotOwner in a client.
func (inst *instance) steerOwner(op string) (*steer.Owner, error) {
	if o, ok := inst.side.(ownerSide); ok {
		return o.steer, nil
	}
	return nil, fmt.Errorf("%w: %s runs in the owner (scheduler)", steer.ErrNotOwner, op)
}

type clientSide struct{ *ipc.Client }

func (clientSide) IsOwner() bool { return false }

// resolveSecret applies ipc's one rule (ipc.ResolveSecret) to the C arguments; the C wrapper
// passes SHMSTEER_SECRET as the bytes and SHMSTEER_SECRET_FILE as the file when the caller gives
// neither (it reads the live environment: Go's copy may be stale in a host process that changed
// it after loading the library).
func resolveSecret(secret unsafe.Pointer, secretLen C.size_t, secretFile *C.char) (*ipc.Secret, error) {
	var value []byte
	if secret != nil {
		b, ok := cbytes(secret, secretLen)
		if !ok {
			return nil, fmt.Errorf("%w: secret length", ErrInvalidArgument)
		}
		value = append([]byte{}, b...) // non-nil even when empty: the secret was given
		defer clear(value)
	}
	var path string
	if secretFile != nil {
		path = C.GoString(secretFile)
		if path == "" {
			return nil, fmt.Errorf("%w: the secret file path is empty: give a path, or NULL", ipc.ErrSecretFile)
		}
	}
	s, err := ipc.ResolveSecret(value, path)
	if err != nil {
		return nil, err
	}
	return &s, nil
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
		Secret: sec, Namespace: goString(ns), Region: rc, Logger: quietLogger(),
	})
	if err != nil {
		return fail(err)
	}
	reg, err := keys.Open(o, keys.Options{
		Grace:       time.Duration(cfg.grace_ms) * time.Millisecond,
		MaxKeyBytes: int(cfg.max_key_bytes),
		Logger:      quietLogger(),
	})
	if err != nil {
		o.Close()
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
	inst := &instance{side: ownerSide{o, eng}, region: o.Region(), keys: reg.Registry, eng: eng.Engine, cfg: mc, ownerPD: os.Getpid()}
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
	inst.readers.closeAll() // before the region they read goes
	inst.disarmPlans()
	if inst.hub != nil {
		inst.hub.Close()
	}
	if err := inst.side.Close(); err != nil {
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
	if err := inst.side.Ping(); err != nil {
		return fail(err)
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
	}{Owner: inst.side.IsOwner(), OwnerPID: inst.ownerPD, PID: os.Getpid(), Region: inst.region.Stats()}
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
