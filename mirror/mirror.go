package mirror

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// Defaults.
const (
	DefaultBucket     = "shmsteer"
	DefaultQueueLimit = 65536
	// originTag marks the steering writes the mirror applies from the bucket (steer's
	// Change.Origin), so it does not publish them back.
	originTag = "mirror"
	// putTimeout bounds one publish; a timed-out change stays queued and is sent again.
	putTimeout = 5 * time.Second
	// DefaultKeyPurgeAfter is how long a revoked key's sealed tombstone stays in the bucket.
	DefaultKeyPurgeAfter = 5 * time.Minute
)

// Options configure Start.
type Options struct {
	// URL is the NATS server, e.g. nats://10.0.0.5:4222 (comma-separated for a cluster).
	URL string
	// Bucket is the JetStream key-value bucket; empty means DefaultBucket. Every host of a
	// deployment uses the same one; the object store "<Bucket>-blobs" holds large sets.
	Bucket string
	// CredsFile is a NATS credentials file (JWT and nkey seed); empty: none.
	CredsFile string
	// HostID names this host in the bucket (at most 128 bytes); empty means os.Hostname().
	// Two hosts must not share one.
	HostID string
	// MirrorKeys mirrors the key registry as well (both ways). Needs Secret and Keys.
	MirrorKeys bool
	// Secret is the deployment's shared secret: the key that seals mirrored keys is derived
	// from it (HKDF), so every host must use the same one. Needed with MirrorKeys.
	Secret *ipc.Secret
	// Engine is the owner's steering engine (required): its changes are published, and the
	// other hosts' changes applied to it.
	Engine *steer.Engine
	// Keys is the owner's key registry (ipc.Owner.Keys()); needed with MirrorKeys.
	Keys *ipc.Registry
	// QueueLimit bounds the distinct changes waiting to be published; 0 means
	// DefaultQueueLimit. Repeated changes of one entry take one place.
	QueueLimit int
	// InlineLimit is the largest value stored in the bucket itself; larger steering sets go to
	// the object store. 0 means the server's max payload less 4 KiB.
	InlineLimit int
	// KeyPurgeAfter is how long a revoked key's sealed tombstone stays in the bucket before
	// its host purges it (then the purge marker stays as long again); 0 means
	// DefaultKeyPurgeAfter. A host that was away longer finds the entry gone on its resync and
	// revokes the key then, so the bucket holds only live keys and recent revocations.
	KeyPurgeAfter time.Duration
	// Logger receives connection events and errors; nil means slog.Default().
	Logger *slog.Logger
}

// Status is a point-in-time view of the mirror, for the status endpoint and metrics.
type Status struct {
	HostID      string `json:"host_id"`
	Bucket      string `json:"bucket"`
	Connected   bool   `json:"connected"`
	State       string `json:"state"`        // the NATS connection's state
	Ready       bool   `json:"ready"`        // the bucket is open
	InitialSync bool   `json:"initial_sync"` // the bucket's content at start has been applied
	// QueueDepth local changes wait to be published (outgoing lag), the oldest for OldestQueued.
	QueueDepth   int           `json:"queue_depth"`
	QueueLimit   int           `json:"queue_limit"`
	OldestQueued time.Duration `json:"oldest_queued_ns"`
	// PendingIn bucket entries were not yet delivered to this host (incoming lag), as of the
	// last delivery.
	PendingIn uint64 `json:"pending_in"`
	// LastApplied is when the last remote change was applied (zero: none yet).
	LastApplied time.Time `json:"last_applied"`
	Published   uint64    `json:"published"`  // local changes stored in the bucket
	Applied     uint64    `json:"applied"`    // remote changes written to the local region
	Stale       uint64    `json:"stale"`      // remote changes superseded locally (last writer wins)
	Rejected    uint64    `json:"rejected"`   // remote values that failed to decode or validate
	Tampered    uint64    `json:"tampered"`   // sealed key values that failed authentication
	QueueFull   uint64    `json:"queue_full"` // local changes not mirrored: the queue was full
	Reconnects  uint64    `json:"reconnects"`
	LastError   string    `json:"last_error,omitempty"`
}

// entry is what the mirror knows of one bucket entry.
type entry struct {
	rev      uint64 // newest bucket revision the local region reflects (applied or our own)
	origin   string // its host
	queued   bool   // a local change waits in the queue
	inflight bool   // a local change is being published (not yet acked or echoed)
	sentSeq  uint64 // envelope seq of the last publish
	object   string // object this host stored for the entry (to delete once superseded)
	// waiting is the newest remote value that arrived while a local change was queued or in
	// flight. Its revision can only be compared with ours once our Put is acknowledged (our
	// own echo may never come: history 1 drops a value superseded before delivery).
	waiting jetstream.KeyValueEntry
}

// superseded reports whether a remote value (rev, origin) is not newer than what e holds.
func (e *entry) superseded(rev uint64, origin string) bool {
	return rev < e.rev || (rev == e.rev && origin <= e.origin)
}

type purgeItem struct {
	ek  string
	rev uint64
	due time.Time
}

type qitem struct {
	ek   string
	kind byte
	name string // vector name or request id
	at   time.Time
}

// Mirror mirrors one owner's steering state (and keys) through a JetStream bucket.
type Mirror struct {
	opt         Options
	log         *slog.Logger
	cfg         steer.ModelConfig
	seal        *sealer
	incarnation uint64
	limit       int

	nc *nats.Conn
	js jetstream.JetStream

	kvMu sync.Mutex
	kv   jetstream.KeyValue
	obj  jetstream.ObjectStore

	keyMu sync.Mutex // serializes local key writes (Keys) with applying remote keys

	mu      sync.Mutex // after the engine's write lock and keyMu, when held together
	entries map[string]*entry
	queue   []qitem
	seq     uint64
	sending int // items taken from the queue and being published (they count against the limit)
	sendAt  time.Time
	parked  *jetstream.KeyValueEntry // a global change waiting for a vector it references
	lastErr string
	keyIDs  map[string]string // key entry → request id, for the mirrored keys live here
	purges  []purgeItem       // revoked keys' tombstones this host stored, oldest first

	wake      chan struct{}
	restart   chan struct{}
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	unhook    func()
	closeOnce sync.Once

	ready, initial                                atomic.Bool
	pendingIn                                     atomic.Uint64
	lastApplied                                   atomic.Int64
	published, applied, stale, rejected, tampered atomic.Uint64
	queueFull, reconnects                         atomic.Uint64
}

// Start connects to NATS and starts mirroring. It does not wait for NATS: if the server is
// down, Start still succeeds, local work goes on, changes queue, and the mirror catches up
// once the server is reachable (Status tells). Close stops it.
func Start(ctx context.Context, opt Options) (*Mirror, error) {
	if opt.URL == "" {
		return nil, fmt.Errorf("%w: URL is empty (nats://HOST:PORT)", ErrBadOptions)
	}
	if opt.Engine == nil {
		return nil, fmt.Errorf("%w: Engine is nil (the owner's steer.Engine)", ErrBadOptions)
	}
	if !opt.Engine.Region().IsOwner() {
		return nil, fmt.Errorf("%w: Engine is not the region's owner: run the mirror in the owner", ErrBadOptions)
	}
	if opt.Bucket == "" {
		opt.Bucket = DefaultBucket
	}
	if opt.HostID == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("%w: HostID is empty and the hostname is unknown (%w)", ErrBadOptions, err)
		}
		opt.HostID = h
	}
	if len(opt.HostID) > maxOrigin {
		return nil, fmt.Errorf("%w: HostID longer than %d bytes", ErrBadOptions, maxOrigin)
	}
	if opt.QueueLimit < 0 || opt.InlineLimit < 0 {
		return nil, fmt.Errorf("%w: negative QueueLimit or InlineLimit", ErrBadOptions)
	}
	m := &Mirror{
		opt: opt, log: opt.Logger, cfg: opt.Engine.Config(), limit: opt.QueueLimit,
		entries: map[string]*entry{}, keyIDs: map[string]string{},
		wake: make(chan struct{}, 1), restart: make(chan struct{}, 1),
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.log = m.log.With("component", "mirror", "host", opt.HostID)
	if m.limit == 0 {
		m.limit = DefaultQueueLimit
	}
	if m.opt.KeyPurgeAfter <= 0 {
		m.opt.KeyPurgeAfter = DefaultKeyPurgeAfter
	}
	var inc [8]byte
	rand.Read(inc[:])
	m.incarnation = binary.LittleEndian.Uint64(inc[:])
	if opt.MirrorKeys {
		if opt.Secret == nil || opt.Keys == nil {
			return nil, fmt.Errorf("%w: MirrorKeys needs Secret (keys are sealed with a key derived from it) and Keys", ErrBadOptions)
		}
		sk, err := opt.Secret.DeriveKey(purposeSeal, 32)
		if err != nil {
			return nil, err
		}
		ik, err := opt.Secret.DeriveKey(purposeID, 32)
		if err != nil {
			return nil, err
		}
		if m.seal, err = newSealer(sk, ik); err != nil {
			return nil, err
		}
		clear(sk)
	}
	nopts := []nats.Option{
		nats.Name("shmsteer-mirror " + opt.HostID),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			m.log.Warn("shmsteer: mirror disconnected from NATS; local work goes on, changes queue", "err", err)
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			m.reconnects.Add(1)
			m.log.Info("shmsteer: mirror reconnected to NATS; resyncing from the bucket")
			m.signal(m.restart)
			m.signal(m.wake)
		}),
	}
	if opt.CredsFile != "" {
		nopts = append(nopts, nats.UserCredentials(opt.CredsFile))
	}
	nc, err := nats.Connect(opt.URL, nopts...)
	if err != nil {
		return nil, fmt.Errorf("shmsteer: mirror: connect to %s: %w", opt.URL, err)
	}
	m.nc = nc
	if m.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return nil, err
	}
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.unhook = opt.Engine.OnChange(m.onChange)
	m.wg.Add(3)
	go m.watchLoop()
	go m.publishLoop()
	go m.purgeLoop()
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				m.Close()
			case <-m.ctx.Done():
			}
		}()
	}
	return m, nil
}

// Close stops mirroring and closes the NATS connection. Changes still queued are not
// published (Status.QueueDepth before Close says how many).
func (m *Mirror) Close() error {
	m.closeOnce.Do(func() {
		m.unhook()
		m.cancel()
		m.wg.Wait()
		m.nc.Close()
	})
	return nil
}

func (m *Mirror) signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Status reports the connection, the lag, the queue and the counters.
func (m *Mirror) Status() Status {
	st := Status{
		HostID: m.opt.HostID, Bucket: m.opt.Bucket, Connected: m.nc.IsConnected(), State: m.nc.Status().String(),
		Ready: m.ready.Load(), InitialSync: m.initial.Load(), QueueLimit: m.limit, PendingIn: m.pendingIn.Load(),
		Published: m.published.Load(), Applied: m.applied.Load(), Stale: m.stale.Load(), Rejected: m.rejected.Load(),
		Tampered: m.tampered.Load(), QueueFull: m.queueFull.Load(), Reconnects: m.reconnects.Load(),
	}
	if t := m.lastApplied.Load(); t != 0 {
		st.LastApplied = time.Unix(0, t)
	}
	m.mu.Lock()
	st.QueueDepth = len(m.queue) + m.sending
	if m.sending > 0 {
		st.OldestQueued = time.Since(m.sendAt)
	} else if len(m.queue) > 0 {
		st.OldestQueued = time.Since(m.queue[0].at)
	}
	st.LastError = m.lastErr
	m.mu.Unlock()
	return st
}

func (m *Mirror) setErr(err error) {
	m.mu.Lock()
	m.lastErr = err.Error()
	m.mu.Unlock()
}

func (m *Mirror) entryLocked(ek string) *entry {
	e := m.entries[ek]
	if e == nil {
		e = &entry{}
		m.entries[ek] = e
	}
	return e
}

// onChange is the engine's change hook: queue local changes, ignore the mirror's own.
func (m *Mirror) onChange(c steer.Change) {
	m.log.Debug("change", "name", c.Name, "version", c.Version, "origin", c.Origin)
	if c.Origin == originTag {
		return
	}
	switch c.Kind {
	case steer.ChangeVector:
		m.enqueue(vectorEntry(c.Name), kindVector, c.Name)
	case steer.ChangeGlobal:
		m.enqueue(globalEntry, kindGlobal, "")
	}
}

// enqueue queues entry ek for publishing; ErrQueueFull if the queue is full.
func (m *Mirror) enqueue(ek string, kind byte, name string) error {
	m.mu.Lock()
	e := m.entryLocked(ek)
	if e.queued {
		m.mu.Unlock()
		return nil
	}
	if len(m.queue)+m.sending >= m.limit {
		m.mu.Unlock()
		if n := m.queueFull.Add(1); n&(n-1) == 0 { // log the 1st, 2nd, 4th, 8th... drop
			m.log.Error(ErrQueueFull.Error(), "dropped", n, "queue_limit", m.limit)
		}
		return ErrQueueFull
	}
	e.queued = true
	m.queue = append(m.queue, qitem{ek: ek, kind: kind, name: name, at: time.Now()})
	m.mu.Unlock()
	m.signal(m.wake)
	return nil
}

// bucket returns the open bucket, opening (creating) it first if needed.
func (m *Mirror) bucket(ctx context.Context) (jetstream.KeyValue, error) {
	m.kvMu.Lock()
	defer m.kvMu.Unlock()
	if m.kv != nil {
		return m.kv, nil
	}
	// Bind to an existing bucket as it is (an operator may have set replicas or limits); create
	// it only if it does not exist.
	kv, err := m.js.KeyValue(ctx, m.opt.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = m.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: m.opt.Bucket, History: 1, Storage: jetstream.FileStorage,
			Description: "shmsteer mirror: steering state (and sealed keys) of every host",
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = m.js.KeyValue(ctx, m.opt.Bucket) // another host created it meanwhile
		}
	}
	if err != nil {
		return nil, fmt.Errorf("shmsteer: mirror: open bucket %q: %w", m.opt.Bucket, err)
	}
	m.kv = kv
	m.ready.Store(true)
	return kv, nil
}

func (m *Mirror) objects(ctx context.Context) (jetstream.ObjectStore, error) {
	m.kvMu.Lock()
	defer m.kvMu.Unlock()
	if m.obj != nil {
		return m.obj, nil
	}
	o, err := m.js.ObjectStore(ctx, m.opt.Bucket+"-blobs")
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		o, err = m.js.CreateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: m.opt.Bucket + "-blobs", Storage: jetstream.FileStorage,
			Description: "shmsteer mirror: steering sets larger than one NATS message",
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			o, err = m.js.ObjectStore(ctx, m.opt.Bucket+"-blobs")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("shmsteer: mirror: open object store %q: %w", m.opt.Bucket+"-blobs", err)
	}
	m.obj = o
	return o, nil
}

// sleep waits d or until Close; false if closed.
func (m *Mirror) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-m.ctx.Done():
		return false
	}
}

// ---- publishing ----

func (m *Mirror) publishLoop() {
	defer m.wg.Done()
	backoff := 50 * time.Millisecond
	for {
		m.mu.Lock()
		if len(m.queue) == 0 {
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
		m.seq++
		seq := m.seq
		e.sentSeq = seq
		m.mu.Unlock()

		err := m.publish(it, seq)
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

// publish reads the newest local value of it and stores it in the bucket.
func (m *Mirror) publish(it qitem, seq uint64) error {
	ctx, cancel := context.WithTimeout(m.ctx, putTimeout)
	defer cancel()
	kv, err := m.bucket(ctx)
	if err != nil {
		return err
	}
	env := envelope{kind: it.kind, origin: m.opt.HostID, incarnation: m.incarnation, seq: seq}
	var object string
	switch it.kind {
	case kindVector, kindGlobal:
		ck := steer.ChangeVector
		if it.kind == kindGlobal {
			ck = steer.ChangeGlobal
		}
		s, err := m.opt.Engine.Region().Snapshot()
		if err != nil {
			return err
		}
		b, _, found, err := m.opt.Engine.Encoding(&s, ck, it.name)
		if err == nil && found {
			env.payload = bytes.Clone(b)
		}
		s.Close()
		if err != nil {
			return err
		}
		if !found {
			env.flags |= flagDeleted
		} else if len(env.payload) > m.inlineLimit() {
			sum := sha256.Sum256(env.payload)
			ref := objectRef{name: it.ek + "/" + hex.EncodeToString(sum[:]), sum: sum, size: uint64(len(env.payload))}
			os, err := m.objects(ctx)
			if err != nil {
				return err
			}
			if _, err := os.PutBytes(ctx, ref.name, env.payload); err != nil {
				return fmt.Errorf("shmsteer: mirror: store %d-byte set in the object store: %w", len(env.payload), err)
			}
			env.flags |= flagExternal
			env.payload, object = ref.encode(), ref.name
		}
	case kindKey:
		key, err := m.opt.Keys.Get(it.name, nil)
		state := stateLive
		if errors.Is(err, ipc.ErrKeyRevoked) || errors.Is(err, ipc.ErrKeyNotFound) {
			state, err = stateRevoked, nil
			env.flags |= flagDeleted
		}
		if err != nil {
			return err
		}
		env.flags |= flagSealed
		env.payload = m.seal.seal(it.ek, env.header(), it.name, state, key)
		clear(key)
	}
	rev, err := kv.Put(ctx, it.ek, env.encode())
	if err != nil {
		return fmt.Errorf("shmsteer: mirror: put %s: %w", it.ek, err)
	}
	m.published.Add(1)
	if it.kind == kindKey && env.flags&flagDeleted != 0 {
		m.mu.Lock()
		m.purges = append(m.purges, purgeItem{ek: it.ek, rev: rev, due: time.Now().Add(m.opt.KeyPurgeAfter)})
		m.mu.Unlock()
	}
	m.log.Debug("published", "entry", it.ek, "rev", rev, "seq", seq)
	m.mu.Lock()
	e := m.entryLocked(it.ek)
	if rev > e.rev {
		e.rev, e.origin = rev, m.opt.HostID
	}
	if e.sentSeq == seq {
		e.inflight = false
	}
	var retry jetstream.KeyValueEntry
	if w := e.waiting; w != nil && !e.queued && !e.inflight {
		e.waiting = nil
		m.log.Debug("waiting resolved", "entry", it.ek, "waiting", w.Revision(), "ours", rev, "have", e.rev)
		if w.Revision() > e.rev {
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
		m.apply(retry)
	}
	return nil
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

// ---- applying ----

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
	case kindVector:
		err = m.applyVector(name, env, payload, take)
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

func (m *Mirror) applyVector(name string, env envelope, payload []byte, take func() error) error {
	if env.flags&flagDeleted != 0 {
		_, err := m.opt.Engine.UnregisterAs(originTag, name, take)
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
	_, err = m.opt.Engine.RegisterAs(originTag, name, st.Base.Vectors, take)
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
