package mirror

import (
	"fmt"

	"github.com/shmsteer/shmsteer/ipc"
)

// Keys is the owner's key registry seen through the mirror: Set and Remove write the local
// registry and queue the change for the other hosts (MirrorKeys), Get reads locally. Keys
// written directly through ipc.Registry (or by a worker over RPC) are not mirrored: route the
// owner's key writes through Keys.
type Keys struct {
	m *Mirror
}

// Keys returns the mirrored key registry (nil without MirrorKeys).
func (m *Mirror) Keys() *Keys {
	if m.seal == nil {
		return nil
	}
	return &Keys{m: m}
}

// Set is ipc.Registry.Set, then queues the key for the other hosts. The local write never
// waits for NATS; if the queue is full it stands, and the error wraps ErrQueueFull.
func (k *Keys) Set(requestID string, key []byte) error {
	k.m.keyMu.Lock()
	defer k.m.keyMu.Unlock()
	if err := k.m.opt.Keys.Set(requestID, key); err != nil {
		return err
	}
	return k.queue(requestID, true)
}

// Remove is ipc.Registry.Remove, then queues the revocation for the other hosts.
func (k *Keys) Remove(requestID string) error {
	k.m.keyMu.Lock()
	defer k.m.keyMu.Unlock()
	if err := k.m.opt.Keys.Remove(requestID); err != nil {
		return err
	}
	return k.queue(requestID, false)
}

// Get is ipc.Registry.Get (local).
func (k *Keys) Get(requestID string, dst []byte) ([]byte, error) {
	return k.m.opt.Keys.Get(requestID, dst)
}

// Registry is the local registry underneath.
func (k *Keys) Registry() *ipc.Registry { return k.m.opt.Keys }

func (k *Keys) queue(id string, live bool) error {
	ek := k.m.seal.keyEntry(id)
	k.m.mu.Lock()
	if live {
		k.m.keyIDs[ek] = id
	} else {
		delete(k.m.keyIDs, ek)
	}
	k.m.mu.Unlock()
	if err := k.m.enqueue(ek, kindKey, id); err != nil {
		return fmt.Errorf("key %q set locally, not mirrored: %w", id, err)
	}
	return nil
}
