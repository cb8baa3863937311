package mirror

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shmsteer/shmsteer/keys"
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
					m.resynced(seen)
					seen = nil
				}
				m.initial.Store(true)
				m.signal(m.wake) // publishing waits for the first resync
				continue
			}
			if seen != nil {
				seen[u.Key()] = true
			}
			m.pendingIn.Store(u.Delta())
			m.apply(u)
		}
	}
}

// errGiveWay aborts an apply: the entry changed locally, a newer value was applied, or the
// value was parked.
var errGiveWay = errors.New("shmsteer: mirror: superseded")

// value is one bucket value admitted for applying: authenticated, fresh, of an entry this host
// mirrors. A key's sealed content is opened when it is applied (id, state, key).
type value struct {
	ek     string
	rev    uint64
	kind   byte
	name   string // a vector's name
	env    envelope
	hdr    []byte // the envelope header (a key's seal authenticates it)
	marker string // a purge marker or a vanished entry: the request id a key's revokes, a conversation's name
	id     string
	state  byte
	key    []byte
}

// apply applies one value delivered by the watch: admit authenticates it and checks its
// freshness, applyValue writes it.
func (m *Mirror) apply(u jetstream.KeyValueEntry) {
	v, err := m.admit(u)
	switch {
	case err != nil:
		m.reject(u.Key(), err)
		if errors.Is(err, ErrReplayed) {
			m.repair(v)
		}
	case v != nil:
		m.applyValue(v)
	}
}

// repair stores again what this host holds of an entry whose old value was stored again (a
// replay), if this host wrote the value it holds (or, for a key entry forgotten since its
// purge, the replayed value): a host that joins later cannot tell a replay from the newest
// value, so the bucket must hold the newest again. A live key or a steering entry is published
// again; a revoked or forgotten key's replayed value is purged (with an authenticated marker).
func (m *Mirror) repair(v *value) {
	m.mu.Lock()
	e := m.entries[v.ek]
	mine := e != nil && e.origin == m.opt.HostID || e == nil && v.env.origin == m.opt.HostID
	id, live := m.keyIDs[v.ek]
	m.mu.Unlock()
	switch {
	case !mine:
	case v.kind != kindKey:
		m.enqueue(v.ek, v.kind, v.name)
	case live:
		m.enqueue(v.ek, kindKey, id)
	default:
		m.requeuePurges([]purgeItem{{ek: v.ek, kind: kindKey, rev: v.rev, due: time.Now()}})
	}
}

// admit decodes and authenticates u (ErrTampered, ErrOldFormat, ErrBadEnvelope) and refuses a
// value of an origin that is not newer than the newest of that origin's this host has taken
// (ErrReplayed, with the value, for repair), unless it is a value delivered again (a resync).
// nil, nil: nothing to apply
// (this host's own value, a key entry without MirrorKeys, a purge marker of a revoked key).
func (m *Mirror) admit(u jetstream.KeyValueEntry) (*value, error) {
	ek, rev := u.Key(), u.Revision()
	kind, name, ok := entryName(ek)
	if !ok {
		return nil, fmt.Errorf("%w: unknown entry name %q", ErrBadEnvelope, ek)
	}
	if kind == kindKey && m.seal == nil {
		return nil, nil // keys are not mirrored on this host
	}
	env, hdr, err := m.sign.open(ek, u.Value())
	if err != nil {
		return nil, err
	}
	purge := env.flags&flagPurge != 0
	if env.kind != kind || purge != (u.Operation() == jetstream.KeyValuePurge) || purge && kind != kindKey && kind != kindConversation {
		// The operation is not authenticated, the value is: a value stored under another
		// operation was moved there.
		return nil, fmt.Errorf("%w: a value of kind %d, flags %#x as a %s of entry %s", ErrTampered, env.kind, env.flags, u.Operation(), ek)
	}
	v := &value{ek: ek, rev: rev, kind: kind, name: name, env: env, hdr: u.Value()[:hdr]}
	m.log.Debug("bucket entry", "entry", ek, "rev", rev, "origin", env.origin, "seq", env.seq)
	m.mu.Lock()
	defer m.mu.Unlock()
	if env.origin == m.opt.HostID && env.incarnation == m.incarnation {
		if err := m.ownLocked(v); err != nil {
			return v, err
		}
		return nil, nil
	}
	if env.seq <= m.newest[env.origin] && !m.retryLocked(ek, rev) {
		if m.deliveredLocked(ek, rev) {
			m.stale.Add(1)
			return nil, nil
		}
		return v, fmt.Errorf("%w: entry %s of host %s, seq %d (newest taken %d)", ErrReplayed, ek, env.origin, env.seq, m.newest[env.origin])
	}
	m.newest[env.origin] = max(m.newest[env.origin], env.seq)
	if purge {
		// The request id a key's marker revokes, or a conversation's name; "": the entry was
		// revoked or dropped here already, and is only forgotten.
		if kind == kindConversation {
			if e := m.entries[ek]; e != nil && !e.deleted {
				v.marker = name // its tombstone was missed: drop the conversation, then forget
			}
		} else {
			v.marker = m.keyIDs[ek]
		}
		if v.marker == "" {
			m.forgetLocked(ek)
			return nil, nil
		}
	}
	return v, nil
}

// ownLocked handles a value this process stored: its echo acknowledges the publish; an older
// value of ours stored again is a replay.
func (m *Mirror) ownLocked(v *value) error {
	if v.env.flags&flagPurge != 0 {
		if _, live := m.keyIDs[v.ek]; !live || v.kind == kindConversation {
			m.forgetLocked(v.ek) // nothing if the entry changed here since
		}
		return nil
	}
	e := m.entryLocked(v.ek)
	switch {
	case v.env.seq == e.sentSeq || e.inflight:
		if v.rev > e.rev {
			e.rev, e.origin, e.deleted = v.rev, v.env.origin, v.env.flags&flagDeleted != 0
		}
		if v.env.seq == e.sentSeq {
			e.inflight = false
		}
	case v.rev > e.rev:
		return fmt.Errorf("%w: an earlier value of this host's own entry %s", ErrReplayed, v.ek)
	}
	return nil
}

// deliveredLocked reports whether revision rev of ek is one this host has had already: held,
// waiting or parked (a resync delivers the bucket's values again).
func (m *Mirror) deliveredLocked(ek string, rev uint64) bool {
	e := m.entries[ek]
	if e != nil && (rev <= e.rev || e.waiting != nil && rev <= e.waiting.rev) {
		return true
	}
	return m.parked != nil && m.parked.ek == ek && rev <= m.parked.rev
}

// retryLocked reports whether revision rev of ek is a value this host failed to read (its
// object could not be fetched, or its key opened): a resync tries it again.
func (m *Mirror) retryLocked(ek string, rev uint64) bool {
	e := m.entries[ek]
	return e != nil && e.retry == rev
}

// applyValue applies an admitted value to the local region if it is newer than what the
// region holds for that entry and no local change of it is waiting to be published (that
// change gets a later revision, so it wins: last writer wins, decided by the bucket's order).
// The final decision is taken in the write's condition (take), with the engine's write lock
// held (or the key lock for keys), so a local write and its change notification cannot slip
// in between. Never called with m.mu held: the engine calls the change hook, which takes m.mu,
// under its lock.
func (m *Mirror) applyValue(v *value) {
	m.mu.Lock()
	e := m.entryLocked(v.ek)
	skip := m.skipLocked(e, v)
	m.mu.Unlock()
	if skip {
		return
	}
	payload, err := m.content(v) // outside the lock: an object fetch is a network read
	if err != nil {
		m.mu.Lock()
		e.retry = v.rev // changes nothing, not even the entry's revision; a resync tries again
		if errors.Is(err, jetstream.ErrObjectNotFound) {
			m.stale.Add(1) // deleted by its host: a newer value of the entry exists
		} else {
			m.rejectLocked(v.ek, err)
		}
		m.mu.Unlock()
		return
	}
	take := func(size int64) error { return m.take(e, v, size) }
	switch v.kind {
	case kindVector, kindProbe:
		err = m.applyVector(v, payload, take)
	case kindGlobal:
		err = m.applyGlobal(v, payload, take)
	case kindKey:
		err = m.applyKey(v, take)
	case kindConversation:
		err = m.applyConversation(v, payload, take)
	}
	switch {
	case errors.Is(err, errGiveWay):
		return
	case err != nil:
		// Still the entry's newest value (its revision is taken): a later valid one replaces it.
		m.reject(v.ek, err)
		return
	}
	m.applied.Add(1)
	m.log.Debug("applied", "entry", v.ek, "rev", v.rev, "origin", v.env.origin)
	m.lastApplied.Store(time.Now().UnixNano())
	if v.kind == kindVector {
		m.mu.Lock()
		p := m.parked
		m.parked = nil
		m.mu.Unlock()
		if p != nil {
			m.applyValue(p)
		}
	}
}

// take is the write's condition: the entry's revision becomes v's unless it must give way, and
// a remote value of size bytes is charged against the remote bound (size < 0: an invalid value
// whose revision is taken, nothing written).
func (m *Mirror) take(e *entry, v *value, size int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.skipLocked(e, v) {
		return errGiveWay
	}
	e.rev, e.origin, e.deleted = v.rev, v.env.origin, v.env.flags&flagDeleted != 0
	if old := e.object; old != "" {
		e.object = ""
		go m.deleteObject(old) // our value is superseded
	}
	if size < 0 {
		return nil
	}
	if v.env.flags&flagDeleted != 0 {
		size = 0
	}
	return m.chargeLocked(e, size)
}

// chargeLocked makes e hold a remote value of size bytes, unless that would make remote values
// exceed RemoteBytes or RemoteEntries.
func (m *Mirror) chargeLocked(e *entry, size int64) error {
	n, b := m.remoteN, m.remoteBytes-e.size+size
	if e.size == 0 && size > 0 {
		n++
	} else if e.size > 0 && size == 0 {
		n--
	}
	if size > 0 && (b > m.remoteMax || n > m.remoteNMax) {
		return fmt.Errorf("%w: %d bytes in %d remote entries with this one (limits %d bytes, %d entries)", ErrRemoteLimit, b, n, m.remoteMax, m.remoteNMax)
	}
	m.remoteN, m.remoteBytes, e.size = n, b, size
	return nil
}

// dropRemoteLocked releases what a remote value of e held (a local write replaced it, or the
// entry is forgotten).
func (m *Mirror) dropRemoteLocked(e *entry) {
	if e.size > 0 {
		m.remoteBytes -= e.size
		m.remoteN--
		e.size = 0
	}
}

// skipLocked reports whether remote value v must not be applied now: it is not newer than
// what the entry holds (counted stale), or a local change of the entry is queued or in flight
// (v waits for that change's acknowledgement, see entry.waiting).
func (m *Mirror) skipLocked(e *entry, v *value) bool {
	if e.superseded(v.rev, v.env.origin) {
		m.stale.Add(1)
		return true
	}
	if e.queued || e.inflight {
		if e.waiting == nil || v.rev > e.waiting.rev {
			if e.waiting != nil {
				m.stale.Add(1)
			}
			e.waiting = v
		} else {
			m.stale.Add(1)
		}
		return true
	}
	return false
}

// content returns a vector's or the global tiers' steering set (inline, or fetched from the
// object store) and opens a key's sealed value into v.
func (m *Mirror) content(v *value) ([]byte, error) {
	switch {
	case v.marker != "":
		return nil, nil
	case v.kind == kindKey: // a revocation too: the sealed payload holds the id
		if v.env.flags&flagSealed == 0 {
			return nil, fmt.Errorf("%w: key value not sealed", ErrTampered)
		}
		var err error
		v.id, v.state, v.key, err = m.seal.open(v.ek, v.hdr, v.env.payload)
		return nil, err
	case v.env.flags&flagDeleted != 0:
		return nil, nil
	case v.env.flags&flagExternal != 0:
		return m.fetchObject(v.env.payload)
	}
	return bytes.Clone(v.env.payload), nil // a fresh, aligned copy for the steering decoder
}

func (m *Mirror) applyVector(v *value, payload []byte, take func(int64) error) error {
	unreg, reg := m.opt.Engine.Unregister, m.opt.Engine.Register
	if v.kind == kindProbe {
		unreg, reg = m.opt.Engine.UnregisterProbe, m.opt.Engine.RegisterProbe
	}
	if v.env.flags&flagDeleted != 0 {
		_, err := unreg(v.name, steer.Origin(originTag), steer.If(func() error { return take(0) }))
		if errors.Is(err, steer.ErrUnknownVector) {
			return nil
		}
		return err
	}
	size := int64(len(payload))
	// A steering vector's metadata may come first (values written before hints were mirrored
	// have none); the tag covered it with the rest.
	var opts []steer.WriteOption
	if bytes.HasPrefix(payload, []byte(steer.VectorMetaMagic)) {
		meta, n, err := steer.DecodeVectorMeta(payload)
		if err == nil && v.kind != kindVector {
			err = fmt.Errorf("%w: a probe vector carries no metadata", ErrBadEnvelope)
		}
		if err != nil {
			return taken(take, err)
		}
		opts = append(opts, steer.ModelHint(meta.ModelHint))
		payload = bytes.Clone(payload[n:]) // aligned again for the steering decoder
	}
	st, _, err := steer.DecodeSteering(payload, m.cfg)
	extra := steer.Steering{Base: steer.Tier{Refs: st.Base.Refs, Clamps: st.Base.Clamps}, Prefill: st.Prefill, Decode: st.Decode}
	if err == nil && !extra.Empty() {
		err = fmt.Errorf("%w: a named vector holds only base vectors", ErrBadEnvelope)
	}
	if err != nil {
		return taken(take, err)
	}
	opts = append(opts, steer.Origin(originTag), steer.If(func() error { return take(size) }))
	_, err = reg(v.name, st.Base.Vectors, opts...)
	return err
}

// applyConversation stores or drops a conversation's rest_of_conversation gates in the owner's
// table (with the latch map's caps: an entry may evict the oldest); the entry's value must name
// the conversation its entry does.
func (m *Mirror) applyConversation(v *value, payload []byte, take func(int64) error) error {
	k, _ := steer.ParseGateConversationName(v.name)
	if v.env.flags&flagDeleted != 0 {
		_, err := m.opt.Engine.DropGateConversation(k, steer.Origin(originTag), steer.If(func() error {
			if err := take(0); err != nil {
				return err
			}
			if v.marker != "" { // a purge marker: nothing is left of the entry to remember
				m.mu.Lock()
				m.forgetLocked(v.ek)
				m.mu.Unlock()
			}
			return nil
		}))
		return err
	}
	if got, err := steer.GateConversationKey(payload); err != nil {
		return taken(take, err)
	} else if got != k {
		return taken(take, fmt.Errorf("%w: the value of conversation %q/%q's entry names %q/%q", ErrBadEnvelope, k.Tenant, k.ID, got.Tenant, got.ID))
	}
	// Not charged against RemoteBytes/RemoteEntries, which bound the region: the table is the
	// owner's memory, bounded by the latch map's caps (the engine evicts without telling the
	// mirror, so a charge would never be given back).
	return m.opt.Engine.RestoreGateConversation(payload, steer.Origin(originTag), steer.If(func() error { return take(0) }))
}

// applyGlobal sets the global tiers; a set that references a vector not here yet is parked
// and retried once the next vector is applied (its revision is not taken).
func (m *Mirror) applyGlobal(v *value, payload []byte, take func(int64) error) error {
	var g steer.Steering
	if v.env.flags&flagDeleted == 0 {
		var err error
		if g, _, err = steer.DecodeSteering(payload, m.cfg); err != nil {
			return taken(take, err)
		}
	}
	_, err := m.opt.Engine.SetGlobal(g, steer.Origin(originTag), steer.If(func() error { return take(int64(len(payload))) }))
	if errors.Is(err, steer.ErrUnknownVector) {
		m.mu.Lock()
		m.parked = v
		m.mu.Unlock()
		return errGiveWay
	}
	return err
}

// taken takes an invalid value's revision (so it counts as the entry's newest) and returns err,
// or errGiveWay if the entry changed meanwhile.
func taken(take func(int64) error, err error) error {
	if terr := take(-1); terr != nil {
		return terr
	}
	return err
}

// applyKey writes an opened key, a revocation or a purge marker's revocation to the local
// registry; the decision (take) runs under the registry's write lock (keys.If), so that no
// local key write, from Keys or from anywhere on this host, slips in between it and the write.
func (m *Mirror) applyKey(v *value, take func(int64) error) error {
	id, state, key := v.id, v.state, v.key
	if v.marker != "" {
		id, state = v.marker, stateRevoked
	}
	defer clear(key)
	m.keyMu.Lock()
	defer m.keyMu.Unlock()
	size := int64(len(id) + len(key))
	if state == stateRevoked {
		size = 0
	}
	decide := keys.If(func() error {
		if err := take(size); err != nil {
			return err
		}
		m.mu.Lock()
		if state == stateRevoked {
			delete(m.keyIDs, v.ek)
		} else {
			m.keyIDs[v.ek] = id
		}
		if v.marker != "" {
			m.forgetLocked(v.ek)
		}
		m.mu.Unlock()
		return nil
	})
	if state == stateRevoked {
		if err := m.opt.Keys.Remove(id, keys.Origin(originTag), decide); err != nil && !errors.Is(err, keys.ErrNotFound) {
			return err
		}
		return nil
	}
	return m.opt.Keys.Set(id, key, keys.Origin(originTag), decide)
}

func (m *Mirror) reject(ek string, err error) {
	m.mu.Lock()
	m.rejectLocked(ek, err)
	m.mu.Unlock()
}

// rejectLocked counts a refused value and logs it, at most once a second (a flood of forged
// values must not flood the log): the line says how many went unlogged since.
func (m *Mirror) rejectLocked(ek string, err error) {
	switch {
	case errors.Is(err, ErrTampered):
		m.tampered.Add(1)
	case errors.Is(err, ErrReplayed):
		m.replayed.Add(1)
	default:
		m.rejected.Add(1)
	}
	m.lastErr = err.Error()
	if now := time.Now(); now.Sub(m.lastLog) >= time.Second {
		m.log.Warn("shmsteer: mirror rejected a bucket value", "entry", ek, "err", err, "unlogged_before", m.unlogged)
		m.lastLog, m.unlogged = now, 0
	} else {
		m.unlogged++
	}
}
