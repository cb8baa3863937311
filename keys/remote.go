package keys

// The worker's side of the writer and the owner's handlers for it: one RPC op per write
// (internal/proto's table), its payload encoded here, its errors carried as proto codes.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/ipc"
)

// RPC ops served by the owner's registry (Open), internal/proto's table.
const (
	opSet    = proto.OpKeySet
	opRemove = proto.OpKeyRemove
	opLimits = proto.OpKeyLimits
)

// Worker is the key registry of a process attached to the owner: it reads c's mapping and
// sends its writes to the owner, one RPC each. What it has is its Registry's: OnChange, the
// purge and the revocation counters belong to the Owner.
type Worker struct {
	*Registry
}

// Attach returns the key registry of the owner c is attached to: reads from c's mapping,
// writes as RPCs to the owner. It asks the owner for its MaxKeyBytes (one RPC), so an oversize
// Set fails here with ErrTooLarge before any RPC. An error wrapping ipc.ErrUnknownOp means the
// owner never called Open; ipc's errors (ErrOwnerGone, ErrTimeout) mean it could not answer.
func Attach(c *ipc.Client) (*Worker, error) {
	resp, err := c.Call(opLimits, nil)
	if errors.Is(err, ipc.ErrUnknownOp) {
		return nil, fmt.Errorf("shmsteer: the owner serves no key registry (it must call keys.Open): %w", err)
	}
	if err != nil {
		return nil, err
	}
	if len(resp) != 4 {
		return nil, fmt.Errorf("%w: key limits reply of %d bytes", ipc.ErrProtocol, len(resp))
	}
	return &Worker{&Registry{region: c.Region(), maxKey: int(binary.LittleEndian.Uint32(resp)), w: &remote{c: c}}}, nil
}

// remote sends a worker's writes to the owner.
type remote struct {
	c *ipc.Client

	mu  sync.Mutex // guards buf (the client sends one RPC at a time anyway)
	buf []byte     // a key set's payload, reused, zeroed after each send
}

func (r *remote) String() string { return r.c.String() }

func (r *remote) set(id string, key []byte, o writeOpts) error {
	if o.ownerOnly() {
		return errOwnerOnly
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buf = appendSet(r.buf[:0], id, key)
	_, err := r.c.Call(opSet, r.buf)
	clear(r.buf) // it held the key
	return err
}

func (r *remote) remove(id string, o writeOpts) error {
	if o.ownerOnly() {
		return errOwnerOnly
	}
	_, err := r.c.Call(opRemove, []byte(id))
	return err
}

// revokedIDs is the owner's knowledge: a worker lists none.
func (*remote) revokedIDs() []string { return nil }

// serve registers the owner's handlers of the registry's ops.
func serve(o *ipc.Owner, k *Registry) {
	o.Handle(opSet, func(req []byte) ([]byte, error) {
		id, key, err := decodeSet(req)
		if err != nil {
			return nil, err
		}
		return nil, k.Set(string(id), key)
	})
	o.Handle(opRemove, func(req []byte) ([]byte, error) {
		return nil, k.Remove(string(req))
	})
	limits := binary.LittleEndian.AppendUint32(nil, uint32(k.maxKey))
	o.Handle(opLimits, func([]byte) ([]byte, error) { return limits, nil })
}

// Key set payload: u16 request id length, request id, key bytes.
func appendSet(dst []byte, id string, key []byte) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(id)))
	dst = append(dst, id...)
	return append(dst, key...)
}

// decodeSet returns the request id and a view of the key inside p.
func decodeSet(p []byte) (id []byte, key []byte, err error) {
	if len(p) < 2 {
		return nil, nil, fmt.Errorf("%w: key set payload of %d bytes", ipc.ErrProtocol, len(p))
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n > len(p)-2 {
		return nil, nil, fmt.Errorf("%w: request id of %d bytes in a %d-byte payload", ipc.ErrProtocol, n, len(p))
	}
	return p[2 : 2+n : 2+n], p[2+n:], nil
}
