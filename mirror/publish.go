package mirror

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/steer"
)

// Publishing: the queue's entries, read from the region when sent, stored in the bucket.

func (m *Mirror) publishLoop() {
	defer m.wg.Done()
	backoff := 50 * time.Millisecond
	for {
		m.mu.Lock()
		if len(m.queue) == 0 || !m.initial.Load() { // publish once the bucket's content is applied
			m.mu.Unlock()
			select {
			case <-m.ctx.Done():
				return
			case <-m.wake:
			}
			continue
		}
		it := m.queue[0]
		m.queue = m.queue[1:]
		m.sending++
		m.sendAt = it.at
		e := m.entryLocked(it.ek)
		e.queued, e.inflight = false, true
		m.mu.Unlock()

		err := m.publish(it)
		m.mu.Lock()
		m.sending--
		m.mu.Unlock()
		if err == nil {
			backoff = 50 * time.Millisecond
			continue
		}
		m.setErr(err)
		if m.ctx.Err() != nil {
			return
		}
		m.log.Warn("shmsteer: mirror publish failed; will retry", "entry", it.ek, "err", err)
		m.mu.Lock()
		if !e.queued { // put it back in front; a newer change of it may have queued it again
			e.queued = true
			m.queue = append([]qitem{it}, m.queue...)
		}
		m.mu.Unlock()
		if !m.sleep(backoff) {
			return
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// nextSeqLocked returns the next value of this host's clock: above every seq it published in
// this process and every one of its own it has seen in the bucket (an earlier life's), and at
// least the wall clock in nanoseconds, so it keeps increasing across restarts (unless the
// clock steps back across one by more than the restart takes).
func (m *Mirror) nextSeqLocked() uint64 {
	seq := max(uint64(time.Now().UnixNano()), m.seq+1, m.newest[m.opt.HostID]+1)
	m.seq, m.newest[m.opt.HostID] = seq, seq
	return seq
}

// put stores a signed value of entry ek: it takes the next seq and writes it in one step
// (pubMu), so this host's values reach the bucket in the order of their seqs. sent is called
// with the seq under m.mu, seal (if not nil) then fills the payload of a header that is
// final, and write does the write.
func (m *Mirror) put(ek string, env *envelope, sent func(seq uint64), seal func(*envelope), write func(val []byte) (uint64, error)) (uint64, error) {
	m.pubMu.Lock()
	defer m.pubMu.Unlock()
	m.mu.Lock()
	env.seq = m.nextSeqLocked()
	if sent != nil {
		sent(env.seq)
	}
	m.mu.Unlock()
	if seal != nil {
		seal(env)
	}
	return write(m.sign.sign(ek, env))
}

// publish reads the newest local value of it and stores it in the bucket.
func (m *Mirror) publish(it qitem) error {
	ctx, cancel := context.WithTimeout(m.ctx, putTimeout)
	defer cancel()
	kv, err := m.bucket(ctx)
	if err != nil {
		return err
	}
	env := envelope{kind: it.kind, origin: m.opt.HostID, incarnation: m.incarnation}
	var seal func(*envelope)
	var object string
	if it.kind == kindKey {
		key, err := m.keyValue(it, &env)
		if err != nil {
			return err
		}
		defer clear(key)
		state := stateLive
		if env.flags&flagDeleted != 0 {
			state = stateRevoked
		}
		seal = func(env *envelope) { env.payload = m.seal.seal(it.ek, env.header(), it.name, state, key) }
	} else if object, err = m.steeringValue(ctx, it, &env); err != nil {
		return err
	}
	var seq uint64
	rev, err := m.put(it.ek, &env, func(s uint64) {
		seq = s
		m.entryLocked(it.ek).sentSeq = s
	}, seal, func(val []byte) (uint64, error) {
		return kv.Put(ctx, it.ek, val)
	})
	if err != nil {
		return fmt.Errorf("shmsteer: mirror: put %s: %w", it.ek, err)
	}
	m.published.Add(1)
	m.log.Debug("published", "entry", it.ek, "rev", rev, "seq", seq)
	m.stored(it, env, seq, rev, object)
	return nil
}

// steeringValue reads a vector's, a probe's, the global tiers' or a conversation's gates' newest
// encoding into env
// (deleted if there is none); a set larger than one message goes to the object store first,
// env then holds its reference and the object's name is returned.
func (m *Mirror) steeringValue(ctx context.Context, it qitem, env *envelope) (object string, err error) {
	var found bool
	if it.kind == kindConversation { // the owner's table, not the region
		k, _ := steer.ParseGateConversationName(it.name)
		env.payload, found, err = m.opt.Engine.GateConversation(k)
	} else {
		found, err = m.regionValue(it, env)
	}
	switch {
	case err != nil:
		return "", err
	case !found:
		env.flags |= flagDeleted
		return "", nil
	case len(env.payload) <= m.inlineLimit():
		return "", nil
	}
	sum := sha256.Sum256(env.payload)
	ref := objectRef{name: it.ek + "/" + hex.EncodeToString(sum[:]), sum: sum, size: uint64(len(env.payload))}
	os, err := m.objects(ctx)
	if err != nil {
		return "", err
	}
	if _, err := os.PutBytes(ctx, ref.name, env.payload); err != nil {
		return "", fmt.Errorf("shmsteer: mirror: store %d-byte set in the object store: %w", len(env.payload), err)
	}
	env.flags |= flagExternal
	env.payload = ref.encode()
	return ref.name, nil
}

// regionValue reads a vector's, a probe's or the global tiers' newest encoding into
// env.payload.
func (m *Mirror) regionValue(it qitem, env *envelope) (bool, error) {
	ck := map[byte]steer.ChangeKind{kindVector: steer.ChangeVector, kindGlobal: steer.ChangeGlobal, kindProbe: steer.ChangeProbe}[it.kind]
	s, err := m.opt.Engine.Region().Snapshot()
	if err != nil {
		return false, err
	}
	defer s.Close()
	b, _, found, err := m.opt.Engine.Encoding(&s, ck, it.name)
	if err == nil && found {
		env.payload = bytes.Clone(b)
		if it.kind == kindVector { // its metadata (model hint) in front, read at the same snapshot
			var meta steer.VectorMeta
			meta, err = m.opt.Engine.VectorMeta(&s, it.name)
			env.payload = append(steer.EncodeVectorMeta(meta), env.payload...)
		}
	}
	return found, err
}

// keyValue reads a key's newest state (a revoked or absent key is a deletion) and marks env
// sealed; the caller seals (and clears) the key once the header is final.
func (m *Mirror) keyValue(it qitem, env *envelope) ([]byte, error) {
	key, err := m.opt.Keys.Get(it.name, nil)
	if errors.Is(err, keys.ErrRevoked) || errors.Is(err, keys.ErrNotFound) {
		key, err = nil, nil
		env.flags |= flagDeleted
	}
	if err != nil {
		return nil, err
	}
	env.flags |= flagSealed
	return key, nil
}

// stored records a publish the server acknowledged: the entry's revision, its object (the
// superseded one deleted), a revoked key's purge, and the remote value that waited for it.
func (m *Mirror) stored(it qitem, env envelope, seq, rev uint64, object string) {
	m.mu.Lock()
	deleted := env.flags&flagDeleted != 0
	if deleted && (it.kind == kindKey || it.kind == kindConversation) {
		m.purges = append(m.purges, purgeItem{ek: it.ek, kind: it.kind, rev: rev, due: time.Now().Add(m.opt.KeyPurgeAfter)})
	}
	e := m.entryLocked(it.ek)
	if rev > e.rev {
		e.rev, e.origin, e.deleted = rev, m.opt.HostID, deleted
	}
	if e.sentSeq == seq {
		e.inflight = false
	}
	var retry *value
	if w := e.waiting; w != nil && !e.queued && !e.inflight {
		e.waiting = nil
		m.log.Debug("waiting resolved", "entry", it.ek, "waiting", w.rev, "ours", rev, "have", e.rev)
		if w.rev > e.rev {
			retry = w // stored after ours: it wins
		} else {
			m.stale.Add(1)
		}
	}
	old := e.object
	e.object = object
	m.mu.Unlock()
	if old != "" && old != object {
		m.deleteObject(old)
	}
	if retry != nil {
		m.applyValue(retry)
	}
}

func (m *Mirror) inlineLimit() int {
	if m.opt.InlineLimit > 0 {
		return m.opt.InlineLimit
	}
	mp := m.nc.MaxPayload() // 0 until the server's INFO arrived
	if mp <= 0 {
		mp = 1 << 20 // NATS's default
	}
	return int(mp) - 4096
}

// deleteObject removes an object this host stored once its entry has a newer value: a host
// still fetching it finds it gone and skips it, since a newer value of the entry exists.
func (m *Mirror) deleteObject(name string) {
	ctx, cancel := context.WithTimeout(m.ctx, putTimeout)
	defer cancel()
	if o, err := m.objects(ctx); err == nil {
		if err := o.Delete(ctx, name); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			m.log.Warn("shmsteer: mirror: delete superseded object", "object", name, "err", err)
		}
	}
}
