package steer

// The worker's side of the writer (writer.go) and the owner's handlers for it: one RPC op per
// write (internal/proto's table), its payload encoded here, its errors carried as proto codes.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// Caller sends an RPC to the region's owner (an *ipc.Client satisfies it).
type Caller interface {
	Call(op uint16, req []byte) ([]byte, error)
}

// HandleFunc registers an RPC handler in the owner; with an *ipc.Owner o pass
//
//	func(op uint16, h func([]byte) ([]byte, error)) { o.Handle(op, h) }
type HandleFunc func(op uint16, h func(req []byte) ([]byte, error))

// RPC ops served by Owner.Serve (internal/proto's table).
const (
	OpRegister        uint16 = proto.OpRegister
	OpUnregister      uint16 = proto.OpUnregister
	OpSetGlobal       uint16 = proto.OpSetGlobal
	OpRegisterProbe   uint16 = proto.OpRegisterProbe
	OpUnregisterProbe uint16 = proto.OpUnregisterProbe
)

// globalMerge is OpSetGlobal's flag: merge into the current tiers (Merge).
const globalMerge byte = 1

// registerHinted is OpRegister's flag in the name length's top bit: a u16 length and the model
// hint (ModelHint) follow the name.
const registerHinted uint16 = 0x8000

// remote sends a worker's writes to the owner.
type remote struct {
	e *Engine
	c Caller
}

func registerOp(kind shm.Kind) (register, unregister uint16) {
	if kind == KindProbe {
		return OpRegisterProbe, OpUnregisterProbe
	}
	return OpRegister, OpUnregister
}

func (r remote) putNamed(kind shm.Kind, name string, b []byte, _ Digest, o writeOpts) (VectorInfo, error) {
	if o.ownerOnly() {
		return VectorInfo{}, errOwnerOnly
	}
	op, _ := registerOp(kind)
	req := binary.LittleEndian.AppendUint16(nil, uint16(len(name)))
	req = append(req, name...)
	if o.hint != "" {
		binary.LittleEndian.PutUint16(req, uint16(len(name))|registerHinted)
		req = append(binary.LittleEndian.AppendUint16(req, uint16(len(o.hint))), o.hint...)
	}
	req = append(req, b...)
	resp, err := r.call(op, req)
	if err != nil {
		return VectorInfo{}, err
	}
	if len(resp) != 8+32 {
		return VectorInfo{}, fmt.Errorf("%w: register reply of %d bytes", ErrBadEncoding, len(resp))
	}
	info := VectorInfo{Name: name, Version: binary.LittleEndian.Uint64(resp)}
	copy(info.Digest[:], resp[8:])
	return info, nil
}

func (r remote) deleteNamed(kind shm.Kind, name string, o writeOpts) (uint64, error) {
	if o.ownerOnly() {
		return 0, errOwnerOnly
	}
	_, op := registerOp(kind)
	return r.callVersion(op, []byte(name), "unregister")
}

func (r remote) setGlobal(g Steering, o writeOpts) (uint64, error) {
	if o.ownerOnly() {
		return 0, errOwnerOnly
	}
	req := []byte{0}
	if o.merge {
		req[0] = globalMerge
	}
	if !g.Empty() {
		w, err := resolveSteering(r.e.cfg, &g, nil, false)
		if err != nil {
			return 0, fmt.Errorf("global steering: %w", err)
		}
		b, err := w.encode(r.e.cfg.Hidden)
		if err != nil {
			return 0, err
		}
		req = append(req, b...)
	}
	return r.callVersion(OpSetGlobal, req, "set-global")
}

func (remote) ownStatus(*Status, bool) {}

func (r remote) gateEngaged(keys []uint64) error {
	req := make([]byte, 0, 8*len(keys))
	for _, k := range keys {
		req = binary.LittleEndian.AppendUint64(req, k)
	}
	_, err := r.call(OpGateEngaged, req)
	return err
}

// callVersion sends an op whose reply is the region version of the write.
func (r remote) callVersion(op uint16, req []byte, what string) (uint64, error) {
	resp, err := r.call(op, req)
	if err != nil {
		return 0, err
	}
	if len(resp) != 8 {
		return 0, fmt.Errorf("%w: %s reply of %d bytes", ErrBadEncoding, what, len(resp))
	}
	return binary.LittleEndian.Uint64(resp), nil
}

// call sends one RPC to the owner. An owner without the op's handler gives ErrNotServed (with
// proto.ErrUnknownOp); an error code this build does not know gives ErrRemote.
func (r remote) call(op uint16, req []byte) ([]byte, error) {
	resp, err := r.c.Call(op, req)
	if errors.Is(err, proto.ErrUnknownOp) {
		return nil, fmt.Errorf("%w (%w)", ErrNotServed, err)
	}
	var re *proto.RemoteError
	if errors.As(err, &re) && !re.Known() {
		return nil, fmt.Errorf("%w: %w", ErrRemote, err)
	}
	return resp, err
}

// Serve registers the owner's handlers for every write a worker sends (the ops above). The
// owner re-validates everything it receives: a worker's bytes are not trusted. A handler's
// error reaches the worker as the same sentinel (internal/proto's codes, bound below).
func (e *Owner) Serve(handle HandleFunc) {
	handle(OpRegister, e.serveRegister(KindVector))
	handle(OpUnregister, e.serveUnregister(KindVector))
	handle(OpRegisterProbe, e.serveRegister(KindProbe))
	handle(OpUnregisterProbe, e.serveUnregister(KindProbe))
	handle(OpSetGlobal, e.serveSetGlobal)
	handle(OpGateEngaged, e.serveGateEngaged)
}

// maxEngagedKeys bounds one OpGateEngaged request.
const maxEngagedKeys = 4096

// serveGateEngaged is the owner's handler of OpGateEngaged: u64 gate keys (unknown keys are
// ignored: a worker can only mark gates the owner latched).
func (e *Owner) serveGateEngaged(req []byte) ([]byte, error) {
	if len(req) == 0 || len(req)%8 != 0 || len(req) > 8*maxEngagedKeys {
		return nil, fmt.Errorf("%w: gate-engaged request of %d bytes", ErrBadEncoding, len(req))
	}
	keys := make([]uint64, len(req)/8)
	for i := range keys {
		keys[i] = binary.LittleEndian.Uint64(req[8*i:])
	}
	e.gateEngaged(keys)
	return nil, nil
}

// serveRegister is the owner's handler of a register RPC: it decodes (name, encoding),
// re-validates it and registers it as a named vector of kind.
func (e *Owner) serveRegister(kind shm.Kind) func([]byte) ([]byte, error) {
	reg := e.Register
	if kind == KindProbe {
		reg = e.RegisterProbe
	}
	return func(req []byte) ([]byte, error) {
		short := fmt.Errorf("%w: short register request", ErrBadEncoding)
		if len(req) < 2 {
			return nil, short
		}
		n, flags := binary.LittleEndian.Uint16(req)&^registerHinted, binary.LittleEndian.Uint16(req)&registerHinted
		if len(req) < 2+int(n) {
			return nil, short
		}
		name := string(req[2 : 2+n])
		req = req[2+n:]
		var opts []WriteOption
		if flags != 0 {
			if len(req) < 2 || len(req) < 2+int(binary.LittleEndian.Uint16(req)) {
				return nil, short
			}
			h := int(binary.LittleEndian.Uint16(req))
			opts = append(opts, ModelHint(string(req[2:2+h]))) // Register validates it
			req = req[2+h:]
		}
		// Copy so the floats are aligned whatever the transport's buffer offset.
		enc := append(make([]byte, 0, len(req)), req...)
		w, err := decode(enc, e.cfg, true)
		if err != nil {
			return nil, err
		}
		if len(w.refs) != 0 || len(w.clamps) != 0 {
			return nil, fmt.Errorf("%w: a named vector holds only base vectors", ErrBadEncoding)
		}
		info, err := reg(name, w.steering(e.cfg).Base.Vectors, opts...)
		if err != nil {
			return nil, err
		}
		return append(binary.LittleEndian.AppendUint64(nil, info.Version), info.Digest[:]...), nil
	}
}

// serveUnregister is the owner's handler of an unregister RPC (the request is the name).
func (e *Owner) serveUnregister(kind shm.Kind) func([]byte) ([]byte, error) {
	unreg := e.Unregister
	if kind == KindProbe {
		unreg = e.UnregisterProbe
	}
	return func(req []byte) ([]byte, error) {
		v, err := unreg(string(req))
		if err != nil {
			return nil, err
		}
		return binary.LittleEndian.AppendUint64(nil, v), nil
	}
}

// serveSetGlobal is the owner's handler of OpSetGlobal: a flags byte, then the steering's
// encoding (none: clear). A merge is applied here, under the owner's write lock.
func (e *Owner) serveSetGlobal(req []byte) ([]byte, error) {
	if len(req) == 0 || req[0]&^globalMerge != 0 {
		return nil, fmt.Errorf("%w: set-global request without a valid flags byte", ErrBadEncoding)
	}
	var g Steering
	if len(req) > 1 {
		// Copy so the floats are aligned whatever the transport's buffer offset.
		w, err := decode(append([]byte(nil), req[1:]...), e.cfg, true)
		if err != nil {
			return nil, err
		}
		g = w.steering(e.cfg)
	}
	var opts []WriteOption
	if req[0]&globalMerge != 0 {
		opts = append(opts, Merge())
	}
	v, err := e.SetGlobal(g, opts...)
	if err != nil {
		return nil, err
	}
	return binary.LittleEndian.AppendUint64(nil, v), nil
}
