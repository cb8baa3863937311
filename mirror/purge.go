package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Revoked keys' tombstones: purged from the bucket by their host after KeyPurgeAfter, with an
// authenticated purge marker; entries gone from the bucket found at a resync.

// resynced handles the key and conversation entries this host holds that a resync did not
// find in the bucket at all (no value, no purge marker). One whose value here is a deletion had
// its tombstone purged: it is forgotten. If the host was away from NATS for at least
// KeyPurgeAfter, tombstones and markers may have been purged meanwhile: a live key is revoked,
// another host's conversation dropped. Otherwise a live key's entry was removed by someone else
// than its host (a marker stays KeyPurgeAfter): it is counted as tampered and the key stays.
// (This host's own conversations stay, as does any entry of another kind.)
func (m *Mirror) resynced(seen map[string]bool) {
	m.mu.Lock()
	away := !m.downSince.IsZero() && time.Since(m.downSince) >= m.opt.KeyPurgeAfter
	m.downSince = time.Time{}
	var gone []*value
	for ek, e := range m.entries {
		if seen[ek] || e.queued || e.inflight {
			continue
		}
		if kind, name, _ := entryName(ek); kind == kindConversation {
			switch {
			case e.deleted:
				m.forgetLocked(ek)
			case away && e.origin != m.opt.HostID:
				gone = append(gone, &value{ek: ek, rev: e.rev + 1, kind: kindConversation, name: name, marker: name,
					env: envelope{kind: kindConversation, flags: flagDeleted | flagPurge, origin: "bucket"}})
			}
			continue
		}
		if len(ek) < 2 || ek[:2] != "k." {
			continue
		}
		id, live := m.keyIDs[ek]
		switch {
		case !live:
			m.forgetLocked(ek) // revoked here already
		case away:
			// A purge marker just after the value held: the entry's tombstone and marker came
			// later in the stream, so any future value of the entry has a higher revision.
			gone = append(gone, &value{ek: ek, rev: e.rev + 1, kind: kindKey, marker: id,
				env: envelope{kind: kindKey, flags: flagDeleted | flagPurge, origin: "bucket"}})
		default:
			m.rejectLocked(ek, fmt.Errorf("%w: a live key's entry vanished from the bucket while this host was away for less than the purge delay", ErrTampered))
		}
	}
	m.mu.Unlock()
	for _, v := range gone {
		m.applyValue(v)
	}
}

// purgeLoop purges the tombstones of revoked keys this host stored once KeyPurgeAfter has
// passed (unless the entry has a newer value), and removes old purge markers, so the bucket
// does not grow with every request ever served.
func (m *Mirror) purgeLoop() {
	defer m.wg.Done()
	every := min(m.opt.KeyPurgeAfter/4, time.Second)
	lastMarkers := time.Now()
	for m.sleep(every) {
		m.mu.Lock()
		var due []purgeItem
		now := time.Now()
		for len(m.purges) > 0 && !m.purges[0].due.After(now) {
			due = append(due, m.purges[0])
			m.purges = m.purges[1:]
		}
		m.mu.Unlock()
		if len(due) == 0 && now.Sub(lastMarkers) < m.opt.KeyPurgeAfter {
			continue
		}
		ctx, cancel := context.WithTimeout(m.ctx, 4*putTimeout)
		kv, err := m.bucket(ctx)
		if err != nil {
			cancel()
			m.requeuePurges(due)
			continue
		}
		for i, it := range due {
			if err := m.purge(ctx, it); err != nil {
				m.log.Warn("shmsteer: mirror: purge a revoked key's tombstone; will retry", "err", err)
				m.requeuePurges(due[i:])
				break
			}
		}
		if now.Sub(lastMarkers) >= m.opt.KeyPurgeAfter {
			lastMarkers = now
			if err := kv.PurgeDeletes(ctx, jetstream.DeleteMarkersOlderThan(m.opt.KeyPurgeAfter)); err != nil {
				m.log.Warn("shmsteer: mirror: remove old purge markers", "err", err)
			}
		}
		cancel()
	}
}

// purge replaces a revoked key's tombstone by a purge marker (KV's purge: the subject's older
// messages go) that carries an authenticated envelope, so other hosts can tell it from a purge
// by someone without the secret. Nothing if the entry has a newer value than the tombstone.
func (m *Mirror) purge(ctx context.Context, it purgeItem) error {
	env := envelope{kind: it.kind, flags: flagDeleted | flagPurge, origin: m.opt.HostID, incarnation: m.incarnation}
	_, err := m.put(it.ek, &env, nil, nil, func(val []byte) (uint64, error) {
		msg := nats.NewMsg("$KV." + m.opt.Bucket + "." + it.ek)
		msg.Header.Set("KV-Operation", "PURGE")
		msg.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		msg.Data = val
		ack, err := m.js.PublishMsg(ctx, msg, jetstream.WithExpectLastSequencePerSubject(it.rev))
		if err != nil {
			return 0, err
		}
		return ack.Sequence, nil
	})
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return nil // the entry has a newer value
	}
	return err
}

// forgetLocked drops what the mirror knows of a key entry that is gone from the bucket (its
// tombstone purged), so memory does not grow with every request id ever mirrored. Safe: a
// purged entry is never delivered again, and a value of it stored again is refused unless it
// is newer than its origin's newest (Mirror.newest).
func (m *Mirror) forgetLocked(ek string) {
	if e := m.entries[ek]; e != nil && !e.queued && !e.inflight && e.waiting == nil {
		m.dropRemoteLocked(e)
		delete(m.entries, ek)
	}
}

func (m *Mirror) requeuePurges(items []purgeItem) {
	if len(items) == 0 {
		return
	}
	m.mu.Lock()
	m.purges = append(slices.Clone(items), m.purges...)
	m.mu.Unlock()
}
