package mirror

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// Applying: the bucket watched, other hosts' values applied to the region, revoked keys'
// tombstones purged.

func (m *Mirror) watchLoop() {
	defer m.wg.Done()
	for m.ctx.Err() == nil {
		if err := m.watch(); err != nil && m.ctx.Err() == nil {
			m.setErr(err)
			m.log.Warn("shmsteer: mirror watch failed; retrying", "err", err)
			if !m.sleep(500 * time.Millisecond) {
				return
			}
		}
	}
}

// watch reads the whole bucket (the newest value of every entry: a full resync, whatever was
// compacted) and then follows it, until the connection is re-established or the watch ends.
func (m *Mirror) watch() error {
	ctx, cancel := context.WithCancel(m.ctx)
	defer cancel()
	openCtx, openCancel := context.WithTimeout(ctx, putTimeout)
	kv, err := m.bucket(openCtx)
	openCancel()
	if err != nil {
		return err
	}
	select { // a reconnect signalled before this watch starts is covered by it
	case <-m.restart:
	default:
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("shmsteer: mirror: watch bucket %q: %w", m.opt.Bucket, err)
	}
	defer w.Stop()
	seen := map[string]bool{} // key entries in the bucket at the start of this watch
	for {
		select {
		case <-m.ctx.Done():
			return nil
		case <-m.restart:
			return nil
		case u, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("shmsteer: mirror: bucket watch ended")
			}
			if u == nil {
				if seen != nil {
					m.revokeVanished(seen)
					seen = nil
				}
				m.initial.Store(true)
				continue
			}
			if seen != nil && u.Operation() == jetstream.KeyValuePut {
				seen[u.Key()] = true
			}
			m.pendingIn.Store(u.Delta())
			m.apply(u)
		}
	}
}

// errGiveWay aborts an apply: the entry changed locally, or a newer value was applied.
var errGiveWay = errors.New("shmsteer: mirror: superseded")

// apply applies one bucket entry to the local region if it is newer than what the region
// holds for that entry and no local change of it is waiting to be published (that change
// gets a later revision, so it wins: last writer wins, decided by the bucket's order). The
// final decision is taken in the write's condition, with the engine's write lock held (or the
// key lock for keys), so a local write and its change notification cannot slip in between.
// Never called with m.mu held: the engine calls the change hook, which takes m.mu, under its
// lock.
func (m *Mirror) apply(u jetstream.KeyValueEntry) {
	ek, rev := u.Key(), u.Revision()
	kind, name, ok := entryName(ek)
	if !ok {
		m.reject(ek, fmt.Errorf("%w: unknown entry name", ErrBadEnvelope))
		return
	}
	if kind == kindKey && m.seal == nil {
		return // keys are not mirrored on this host
	}
	var env envelope
	var hdr int
	var markerID string // the request id a key entry's purge marker stands for
	if u.Operation() == jetstream.KeyValuePut {
		var err error
		if env, hdr, err = decodeEnvelope(u.Value()); err != nil {
			m.reject(ek, err)
			return
		}
		if env.kind != kind {
			m.reject(ek, fmt.Errorf("%w: kind %d under entry %s", ErrBadEnvelope, env.kind, ek))
			return
		}
	} else { // deleted or purged: a key's tombstone purged by its host, or a NATS tool
		env = envelope{kind: kind, flags: flagDeleted, origin: "nats"}
		if kind == kindKey {
			m.mu.Lock()
			id, live := m.keyIDs[ek]
			if !live { // not a key we hold (its tombstone was applied already): forget the entry
				m.forgetLocked(ek)
				m.mu.Unlock()
				return
			}
			m.mu.Unlock()
			markerID = id
		}
	}
	own := env.origin == m.opt.HostID && env.incarnation == m.incarnation
	m.log.Debug("bucket entry", "entry", ek, "rev", rev, "origin", env.origin, "own", own)

	m.mu.Lock()
	e := m.entryLocked(ek)
	if own {
		if rev > e.rev {
			e.rev, e.origin = rev, env.origin
		}
		if e.sentSeq == env.seq {
			e.inflight = false
		}
		m.mu.Unlock()
		return
	}
	skip := m.skipLocked(e, u, env.origin)
	m.mu.Unlock()
	if skip {
		return
	}

	// Fetch and decode outside the lock (an object fetch is a network read).
	var payload []byte
	if env.flags&flagDeleted == 0 && kind != kindKey {
		var err error
		if payload, err = m.fetch(env); err != nil {
			if errors.Is(err, jetstream.ErrObjectNotFound) {
				m.stale.Add(1) // deleted by its host: a newer value of the entry exists
				return
			}
			m.reject(ek, err)
			return
		}
	}
	// take is the write's condition: the entry's revision becomes rev, unless it must give way.
	take := func() error {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.skipLocked(e, u, env.origin) {
			return errGiveWay
		}
		e.rev, e.origin = rev, env.origin
		if old := e.object; old != "" {
			e.object = ""
			go m.deleteObject(old) // our value is superseded
		}
		return nil
	}
	var err error
	switch kind {
	case kindVector, kindProbe:
		err = m.applyVector(kind, name, env, payload, take)
	case kindGlobal:
		err = m.applyGlobal(env, payload, take)
		if errors.Is(err, steer.ErrUnknownVector) {
			m.mu.Lock()
			m.parked = &u // retried after the next vector arrives (its revision is not taken)
			m.mu.Unlock()
			return
		}
	case kindKey:
		id, state, key := markerID, stateRevoked, []byte(nil)
		if markerID == "" {
			id, state, key, err = m.openKey(ek, u.Value()[:hdr], env)
		}
		if err == nil {
			err = m.writeKey(ek, id, state, key, take)
		}
		clear(key)
		if err == nil && markerID != "" {
			m.mu.Lock()
			m.forgetLocked(ek)
			m.mu.Unlock()
		}
	}
	switch {
	case errors.Is(err, errGiveWay):
		return
	case err != nil:
		// Still the entry's newest value (its revision is taken): a later valid one replaces it.
		m.reject(ek, err)
		return
	}
	m.applied.Add(1)
	m.log.Debug("applied", "entry", ek, "rev", rev, "origin", env.origin)
	m.lastApplied.Store(time.Now().UnixNano())
	if kind == kindVector {
		m.mu.Lock()
		p := m.parked
		m.parked = nil
		m.mu.Unlock()
		if p != nil {
			m.apply(*p)
		}
	}
}

// skipLocked reports whether remote value u must not be applied now: it is not newer than
// what the entry holds (counted stale), or a local change of the entry is queued or in flight
// (u waits for that change's acknowledgement, see entry.waiting).
func (m *Mirror) skipLocked(e *entry, u jetstream.KeyValueEntry, origin string) bool {
	if e.superseded(u.Revision(), origin) {
		m.stale.Add(1)
		return true
	}
	if e.queued || e.inflight {
		if e.waiting == nil || u.Revision() > e.waiting.Revision() {
			if e.waiting != nil {
				m.stale.Add(1)
			}
			e.waiting = u
		} else {
			m.stale.Add(1)
		}
		return true
	}
	return false
}

func (m *Mirror) fetch(env envelope) ([]byte, error) {
	if env.flags&flagExternal == 0 {
		return bytes.Clone(env.payload), nil // a fresh, aligned copy for the steering decoder
	}
	ref, err := decodeObjectRef(env.payload)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(m.ctx, 4*putTimeout)
	defer cancel()
	o, err := m.objects(ctx)
	if err != nil {
		return nil, err
	}
	b, err := o.GetBytes(ctx, ref.name)
	if err != nil {
		return nil, err
	}
	if uint64(len(b)) != ref.size || sha256.Sum256(b) != ref.sum {
		return nil, fmt.Errorf("%w: object %s does not match its reference", ErrBadEnvelope, ref.name)
	}
	return b, nil
}

func (m *Mirror) applyVector(kind byte, name string, env envelope, payload []byte, take func() error) error {
	unreg, reg := m.opt.Engine.UnregisterAs, m.opt.Engine.RegisterAs
	if kind == kindProbe {
		unreg, reg = m.opt.Engine.UnregisterProbeAs, m.opt.Engine.RegisterProbeAs
	}
	if env.flags&flagDeleted != 0 {
		_, err := unreg(originTag, name, take)
		if errors.Is(err, steer.ErrUnknownVector) {
			return nil
		}
		return err
	}
	st, _, err := steer.DecodeSteering(payload, m.cfg)
	extra := steer.Steering{Base: steer.Tier{Refs: st.Base.Refs, Clamps: st.Base.Clamps}, Prefill: st.Prefill, Decode: st.Decode}
	if !extra.Empty() {
		err = fmt.Errorf("%w: a named vector holds only base vectors", ErrBadEnvelope)
	}
	if err != nil {
		return m.taken(take, err)
	}
	_, err = reg(originTag, name, st.Base.Vectors, take)
	return err
}

func (m *Mirror) applyGlobal(env envelope, payload []byte, take func() error) error {
	var g steer.Steering
	if env.flags&flagDeleted == 0 {
		var err error
		if g, _, err = steer.DecodeSteering(payload, m.cfg); err != nil {
			return m.taken(take, err)
		}
	}
	_, err := m.opt.Engine.SetGlobalAs(originTag, g, take)
	return err
}

// taken takes an invalid value's revision (so it counts as the entry's newest) and returns err,
// or errGiveWay if the entry changed meanwhile.
func (m *Mirror) taken(take func() error, err error) error {
	if terr := take(); terr != nil {
		return terr
	}
	return err
}

// openKey opens a sealed key value. A value that fails authentication changes nothing, not
// even the entry's revision: a forged value must not make a host ignore the entry's next valid
// value.
func (m *Mirror) openKey(ek string, hdr []byte, env envelope) (id string, state byte, key []byte, err error) {
	if env.flags&flagSealed == 0 {
		return "", 0, nil, fmt.Errorf("%w: key value not sealed", ErrTampered)
	}
	return m.seal.open(ek, hdr, env.payload)
}

// writeKey writes an opened key to the local registry, holding the key lock so that no local
// key write (Keys.Set, Keys.Remove) slips in between the decision (take) and the write.
func (m *Mirror) writeKey(ek, id string, state byte, key []byte, take func() error) error {
	m.keyMu.Lock()
	defer m.keyMu.Unlock()
	if err := take(); err != nil {
		return err
	}
	m.mu.Lock()
	if state == stateRevoked {
		delete(m.keyIDs, ek)
	} else {
		m.keyIDs[ek] = id
	}
	m.mu.Unlock()
	if state == stateRevoked {
		if err := m.opt.Keys.Remove(id); err != nil && !errors.Is(err, ipc.ErrKeyNotFound) {
			return err
		}
		return nil
	}
	return m.opt.Keys.Set(id, key)
}

// revokeVanished revokes the mirrored keys whose entries are no longer in the bucket (their
// tombstones were purged while this host was away, see Options.KeyPurgeAfter) and forgets
// the key entries gone from the bucket.
func (m *Mirror) revokeVanished(seen map[string]bool) {
	m.mu.Lock()
	var gone []vanished
	for ek, e := range m.entries {
		if seen[ek] || len(ek) < 2 || ek[:2] != "k." || e.queued || e.inflight {
			continue
		}
		if _, live := m.keyIDs[ek]; !live {
			m.forgetLocked(ek) // revoked here already
			continue
		}
		// A purge marker just after the value held: the entry's tombstone and marker came
		// later in the stream, so any future value of the entry has a higher revision.
		gone = append(gone, vanished{ek: ek, rev: e.rev + 1})
	}
	m.mu.Unlock()
	for _, v := range gone {
		m.apply(v)
	}
}

// vanished stands for a purge marker of a key entry that is no longer in the bucket. apply
// uses only Key, Revision, Operation and Value (the embedded interface is nil).
type vanished struct {
	jetstream.KeyValueEntry
	ek  string
	rev uint64
}

func (v vanished) Key() string                     { return v.ek }
func (v vanished) Revision() uint64                { return v.rev }
func (v vanished) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePurge }
func (v vanished) Value() []byte                   { return nil }

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
			err := kv.Purge(ctx, it.ek, jetstream.LastRevision(it.rev))
			if err != nil && !errors.Is(err, jetstream.ErrKeyExists) { // ErrKeyExists: a newer value
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

// forgetLocked drops what the mirror knows of a key entry that is gone from the bucket (its
// tombstone purged), so memory does not grow with every request id ever mirrored. Safe: a
// purged entry is never delivered again; a new value of it has a higher revision anyway.
func (m *Mirror) forgetLocked(ek string) {
	if e := m.entries[ek]; e != nil && !e.queued && !e.inflight && e.waiting == nil {
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

func (m *Mirror) reject(ek string, err error) {
	m.mu.Lock()
	m.rejectLocked(ek, err)
	m.mu.Unlock()
}

func (m *Mirror) rejectLocked(ek string, err error) {
	if errors.Is(err, ErrTampered) {
		m.tampered.Add(1)
	} else {
		m.rejected.Add(1)
	}
	m.lastErr = err.Error()
	m.log.Warn("shmsteer: mirror rejected a bucket value", "entry", ek, "err", err)
}
