package mirror

import (
	"fmt"

	"github.com/shmsteer/shmsteer/keys"
)

// keysTag tags the writes of Keys, which queue their own change (and report ErrQueueFull).
const keysTag = "mirror-keys"

// onKeyChange queues a key written on this host (in the owner or by a worker, the C ABI or
// Python through it) for the other hosts; the mirror's own writes are tagged and skipped.
func (m *Mirror) onKeyChange(c keys.Change) {
	if c.Origin == originTag || c.Origin == keysTag {
		return
	}
	_ = m.queueKey(c.RequestID, !c.Revoked) // a full queue is logged and counted by enqueue
}

// Keys is the owner's key registry seen through the mirror: Set and Remove write the local
// registry and queue the change for the other hosts (MirrorKeys) and say whether it was queued
// (ErrQueueFull), Get reads locally. Key writes made any other way on this host (the
// registry itself, a worker's registry from keys.Attach, the C ABI, Python) are mirrored too, through the
// registry's OnChange.
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

// Set is keys.Registry.Set, then queues the key for the other hosts. The local write never
// waits for NATS; if the queue is full it stands, and the error wraps ErrQueueFull.
func (k *Keys) Set(requestID string, key []byte) error {
	k.m.keyMu.Lock()
	defer k.m.keyMu.Unlock()
	if err := k.m.opt.Keys.Set(requestID, key, keys.Origin(keysTag)); err != nil {
		return err
	}
	return k.m.queueKey(requestID, true)
}

// Remove is keys.Registry.Remove, then queues the revocation for the other hosts.
func (k *Keys) Remove(requestID string) error {
	k.m.keyMu.Lock()
	defer k.m.keyMu.Unlock()
	if err := k.m.opt.Keys.Remove(requestID, keys.Origin(keysTag)); err != nil {
		return err
	}
	return k.m.queueKey(requestID, false)
}

// Get is keys.Registry.Get (local).
func (k *Keys) Get(requestID string, dst []byte) ([]byte, error) {
	return k.m.opt.Keys.Get(requestID, dst)
}

// Registry is the local registry underneath.
func (k *Keys) Registry() *keys.Registry { return k.m.opt.Keys }

func (m *Mirror) queueKey(id string, live bool) error {
	ek := m.seal.keyEntry(id)
	m.mu.Lock()
	if live {
		m.keyIDs[ek] = id
	} else {
		delete(m.keyIDs, ek)
	}
	m.mu.Unlock()
	if err := m.enqueue(ek, kindKey, id); err != nil {
		return fmt.Errorf("key %q set locally, not mirrored: %w", id, err)
	}
	return nil
}
