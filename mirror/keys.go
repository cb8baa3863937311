package mirror

import (
	"fmt"

	"github.com/shmsteer/shmsteer/keys"
)

// onKeyChange queues a key written on this host (in the owner or by a worker, the C ABI or
// Python through it) for the other hosts; the mirror's own writes are tagged and skipped. Every
// local key write reaches the mirror this one way: there is no second write path. A full queue
// leaves the local write standing; it is logged and counted (Status.QueueFull) by enqueue.
func (m *Mirror) onKeyChange(c keys.Change) {
	if c.Origin == originTag {
		return
	}
	_ = m.queueKey(c.RequestID, !c.Revoked)
}

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
