package serve

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/mirror"
)

// Serve's key RPCs: a worker or the CLI sets and revokes per-request keys through serve, so that
// with --mirror-keys the write is mirrored to the other hosts. Keys written with ipc's own
// Client.Keys().Set/Remove go straight to the owner's registry and stay on this host.
const (
	// OpKeySet sets a key: u16 little-endian id length, id, key bytes.
	OpKeySet uint16 = proto.OpServeKeySet
	// OpKeyRemove revokes a key: the request id.
	OpKeyRemove uint16 = proto.OpServeKeyRemove
)

// keyWriter is where serve writes keys: the owner's registry, or the mirror's Keys around it.
type keyWriter interface {
	Set(requestID string, key []byte) error
	Remove(requestID string) error
}

// writeKey runs one key write; a change that was applied locally but could not be queued for
// the other hosts (mirror.ErrQueueFull) is logged and counted by the mirror, and succeeds: the
// key is set here, and the caller cannot do better than retry later.
func (s *Server) writeKey(id string, f func() error) error {
	err := f()
	if errors.Is(err, mirror.ErrQueueFull) {
		s.log.Warn("key written locally but not mirrored: the mirror queue is full", "err", err)
		return nil
	}
	return err
}

func (s *Server) handleKeySet(req []byte) ([]byte, error) {
	if len(req) < 2 {
		return nil, fmt.Errorf("%w: key set request of %d bytes", ErrBadInput, len(req))
	}
	n := int(binary.LittleEndian.Uint16(req))
	if n == 0 || 2+n > len(req) {
		return nil, fmt.Errorf("%w: key set request: id length %d in %d bytes", ErrBadInput, n, len(req))
	}
	id, key := string(req[2:2+n]), req[2+n:]
	return nil, s.writeKey(id, func() error { return s.keyw.Set(id, key) })
}

func (s *Server) handleKeyRemove(req []byte) ([]byte, error) {
	if len(req) == 0 {
		return nil, fmt.Errorf("%w: key remove request without an id", ErrBadInput)
	}
	id := string(req)
	return nil, s.writeKey(id, func() error { return s.keyw.Remove(id) })
}

// SetKey sets a per-request key through serve (OpKeySet), so that serve mirrors it when it
// runs with --mirror-keys. c is a client attached to serve.
func SetKey(c *ipc.Client, requestID string, key []byte) error {
	if len(requestID) == 0 || len(requestID) > 0xffff {
		return fmt.Errorf("%w: request id of %d bytes", ErrBadInput, len(requestID))
	}
	req := binary.LittleEndian.AppendUint16(make([]byte, 0, 2+len(requestID)+len(key)), uint16(len(requestID)))
	req = append(append(req, requestID...), key...)
	_, err := c.Call(OpKeySet, req)
	clear(req)
	return err
}

// RemoveKey revokes a per-request key through serve (OpKeyRemove), mirrored like SetKey. An
// owner that is not serve (it does not know the op) gets the plain ipc revocation.
func RemoveKey(c *ipc.Client, requestID string) error {
	_, err := c.Call(OpKeyRemove, []byte(requestID))
	if errors.Is(err, ipc.ErrUnknownOp) {
		return c.Keys().Remove(requestID)
	}
	return err
}
