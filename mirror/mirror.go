package mirror

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
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
	// DefaultKeyPurgeAfter is how long a revoked key's sealed tombstone, or an evicted
	// conversation's, stays in the bucket.
	DefaultKeyPurgeAfter = 5 * time.Minute
	// DefaultFetchRate is the object store read rate, in bytes per second.
	DefaultFetchRate = 64 << 20
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
	// MirrorKeys mirrors the key registry as well (both ways). Needs Keys.
	MirrorKeys bool
	// Secret is the deployment's shared secret (required): every bucket value is authenticated
	// under a key derived from it (HKDF), and keys are sealed under another, so every host must
	// use the same one. Values of hosts with another secret are refused.
	Secret *ipc.Secret
	// Engine is the owner's steering engine (required; steer.Open): its changes are
	// published, and the other hosts' changes applied to it.
	Engine *steer.Owner
	// Keys is the owner's key registry (keys.Open); needed with MirrorKeys.
	Keys *keys.Owner
	// QueueLimit bounds the distinct changes waiting to be published; 0 means
	// DefaultQueueLimit. Repeated changes of one entry take one place.
	QueueLimit int
	// InlineLimit is the largest value stored in the bucket itself; larger steering sets go to
	// the object store. 0 means the server's max payload less 4 KiB.
	InlineLimit int
	// KeyPurgeAfter is how long a revoked key's sealed tombstone, or a dropped or evicted
	// conversation's, stays in the bucket before its host purges it (then the purge marker
	// stays as long again); 0 means DefaultKeyPurgeAfter. A host that was away longer finds the
	// entry gone on its resync and revokes the key (drops the conversation) then, so the bucket,
	// and what each host remembers of it, holds only live entries and recent deletions.
	KeyPurgeAfter time.Duration
	// RemoteBytes bounds the bytes of the values other hosts' entries hold in this host's
	// region (steering sets and keys); 0 means half the region's arena. RemoteEntries bounds
	// their number; 0 means half the region's index slots. A remote value beyond either is
	// refused (ErrRemoteLimit, counted), so other hosts can never fill this host's region.
	RemoteBytes   int64
	RemoteEntries int
	// FetchRate bounds the bytes per second read from the object store; 0 means
	// DefaultFetchRate.
	FetchRate int
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
	Published   uint64    `json:"published"` // local changes stored in the bucket
	Applied     uint64    `json:"applied"`   // remote changes written to the local region
	Stale       uint64    `json:"stale"`     // remote changes superseded locally (last writer wins)
	Rejected    uint64    `json:"rejected"`  // remote values that failed to decode or validate, or exceed the remote bound
	Tampered    uint64    `json:"tampered"`  // remote values and deletes that failed authentication
	Replayed    uint64    `json:"replayed"`  // authenticated values older than their origin's newest taken here
	// RemoteBytes in RemoteEntries entries is what other hosts' values hold in this region now
	// (bounded by Options.RemoteBytes and RemoteEntries).
	RemoteBytes   int64  `json:"remote_bytes"`
	RemoteEntries int    `json:"remote_entries"`
	QueueFull     uint64 `json:"queue_full"` // local changes not mirrored: the queue was full
	Reconnects    uint64 `json:"reconnects"`
	LastError     string `json:"last_error,omitempty"`
}

// entry is what the mirror knows of one bucket entry.
type entry struct {
	rev      uint64 // newest bucket revision the local region reflects (applied or our own)
	origin   string // its host
	queued   bool   // a local change waits in the queue
	inflight bool   // a local change is being published (not yet acked or echoed)
	sentSeq  uint64 // envelope seq of the last publish
	object   string // object this host stored for the entry (to delete once superseded)
	size     int64  // bytes of a remote value held in the region (counted against RemoteBytes)
	retry    uint64 // revision of a remote value that could not be read (tried again at a resync)
	deleted  bool   // the value at rev is a deletion (a tombstone)
	// waiting is the newest remote value that arrived while a local change was queued or in
	// flight. Its revision can only be compared with ours once our Put is acknowledged (our
	// own echo may never come: history 1 drops a value superseded before delivery).
	waiting *value
}

// superseded reports whether a remote value (rev, origin) is not newer than what e holds.
func (e *entry) superseded(rev uint64, origin string) bool {
	return rev < e.rev || (rev == e.rev && origin <= e.origin)
}

type purgeItem struct {
	ek   string
	kind byte // kindKey or kindConversation
	rev  uint64
	due  time.Time
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
	sign        *signer
	seal        *sealer
	incarnation uint64
	limit       int
	fetchLim    *rate.Limiter
	remoteMax   int64 // RemoteBytes
	remoteNMax  int   // RemoteEntries

	nc *nats.Conn
	js jetstream.JetStream

	kvMu sync.Mutex
	kv   jetstream.KeyValue
	obj  jetstream.ObjectStore

	keyMu sync.Mutex // serializes applying remote keys
	pubMu sync.Mutex // one write to the bucket at a time, in seq order (put)

	mu      sync.Mutex // after the engine's write lock and keyMu, when held together
	entries map[string]*entry
	queue   []qitem
	seq     uint64
	sending int // items taken from the queue and being published (they count against the limit)
	sendAt  time.Time
	parked  *value // a global change waiting for a vector it references
	lastErr string
	keyIDs  map[string]string // key entry → request id, for the mirrored keys live here
	purges  []purgeItem       // revoked keys' tombstones this host stored, oldest first
	// newest is, per origin, the highest seq of its values this host has taken (freshness).
	newest map[string]uint64
	// remoteBytes and remoteN are what remote values occupy in the region (entry.size).
	remoteBytes int64
	remoteN     int
	downSince   time.Time // when the NATS connection was lost (zero: up, or never connected)
	lastLog     time.Time // rejections are logged at most once a second
	unlogged    int       // rejections since the last one logged

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
	replayed, queueFull, reconnects               atomic.Uint64
}

// Start connects to NATS and starts mirroring. It does not wait for NATS: if the server is
// down, Start still succeeds, local work goes on, changes queue, and the mirror catches up
// once the server is reachable (Status tells). Close stops it.
func Start(ctx context.Context, opt Options) (*Mirror, error) {
	if err := checkOptions(&opt); err != nil {
		return nil, err
	}
	m, err := newMirror(opt)
	if err != nil {
		return nil, err
	}
	if err := m.connect(); err != nil {
		return nil, err
	}
	m.ctx, m.cancel = context.WithCancel(context.WithoutCancel(ctx))
	m.unhook = opt.Engine.OnChange(m.onChange)
	if m.seal != nil { // MirrorKeys: every key write of the owner, whichever process made it
		unhookEngine, unhookKeys := m.unhook, opt.Keys.OnChange(m.onKeyChange)
		m.unhook = func() { unhookEngine(); unhookKeys() }
	}
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

// checkOptions refuses missing or out-of-range options (ErrBadOptions) and fills in the
// bucket and the host id.
func checkOptions(opt *Options) error {
	if opt.URL == "" {
		return fmt.Errorf("%w: URL is empty (nats://HOST:PORT)", ErrBadOptions)
	}
	if opt.Engine == nil {
		return fmt.Errorf("%w: Engine is nil (the owner's steer.Owner)", ErrBadOptions)
	}
	if opt.Bucket == "" {
		opt.Bucket = DefaultBucket
	}
	if opt.HostID == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("%w: HostID is empty and the hostname is unknown (%w)", ErrBadOptions, err)
		}
		opt.HostID = h
	}
	if len(opt.HostID) > maxOrigin {
		return fmt.Errorf("%w: HostID longer than %d bytes", ErrBadOptions, maxOrigin)
	}
	if opt.QueueLimit < 0 || opt.InlineLimit < 0 || opt.RemoteBytes < 0 || opt.RemoteEntries < 0 || opt.FetchRate < 0 {
		return fmt.Errorf("%w: negative QueueLimit, InlineLimit, RemoteBytes, RemoteEntries or FetchRate", ErrBadOptions)
	}
	if opt.Secret == nil {
		return fmt.Errorf("%w: Secret is nil: every mirrored value is authenticated with a key derived from the deployment's secret", ErrBadOptions)
	}
	if opt.MirrorKeys && opt.Keys == nil {
		return fmt.Errorf("%w: MirrorKeys needs Keys (the owner's key registry)", ErrBadOptions)
	}
	return nil
}

// newMirror applies the defaults and derives the keys from the secret.
func newMirror(opt Options) (*Mirror, error) {
	st := opt.Engine.Region().Stats()
	m := &Mirror{
		opt: opt, log: opt.Logger, cfg: opt.Engine.Config(), limit: opt.QueueLimit,
		entries: map[string]*entry{}, keyIDs: map[string]string{}, newest: map[string]uint64{},
		wake: make(chan struct{}, 1), restart: make(chan struct{}, 1),
		remoteMax: opt.RemoteBytes, remoteNMax: opt.RemoteEntries,
	}
	if m.remoteMax == 0 {
		m.remoteMax = int64(st.ArenaBytes / 2)
	}
	if m.remoteNMax == 0 {
		m.remoteNMax = int(st.IndexSlots / 2)
	}
	fr := opt.FetchRate
	if fr == 0 {
		fr = DefaultFetchRate
	}
	m.fetchLim = rate.NewLimiter(rate.Limit(fr), fetchChunk)
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
	mk, err := opt.Secret.DeriveKey(purposeMAC, 32)
	if err != nil {
		return nil, err
	}
	m.sign = &signer{key: mk}
	if opt.MirrorKeys {
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
	return m, nil
}

// connect opens the NATS connection (it retries in the background while the server is down).
func (m *Mirror) connect() error {
	nopts := []nats.Option{
		nats.Name("shmsteer-mirror " + m.opt.HostID),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(50*time.Millisecond, 250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			m.mu.Lock()
			if m.downSince.IsZero() {
				m.downSince = time.Now()
			}
			m.mu.Unlock()
			m.log.Warn("shmsteer: mirror disconnected from NATS; local work goes on, changes queue", "err", err)
		}),
		nats.ReconnectHandler(func(*nats.Conn) {
			m.reconnects.Add(1)
			m.log.Info("shmsteer: mirror reconnected to NATS; resyncing from the bucket")
			m.signal(m.restart)
			m.signal(m.wake)
		}),
	}
	if m.opt.CredsFile != "" {
		nopts = append(nopts, nats.UserCredentials(m.opt.CredsFile))
	}
	nc, err := nats.Connect(m.opt.URL, nopts...)
	if err != nil {
		return fmt.Errorf("shmsteer: mirror: connect to %s: %w", m.opt.URL, err)
	}
	m.nc = nc
	if m.js, err = jetstream.New(nc); err != nil {
		nc.Close()
		return err
	}
	return nil
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
		Tampered: m.tampered.Load(), Replayed: m.replayed.Load(), QueueFull: m.queueFull.Load(), Reconnects: m.reconnects.Load(),
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
	st.RemoteBytes, st.RemoteEntries = m.remoteBytes, m.remoteN
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
	case steer.ChangeProbe:
		m.enqueue(probeEntry(c.Name), kindProbe, c.Name)
	case steer.ChangeGlobal:
		m.enqueue(globalEntry, kindGlobal, "")
	case steer.ChangeConversation:
		m.enqueue(conversationEntry(c.Name), kindConversation, c.Name)
	}
}

// enqueue queues entry ek for publishing; ErrQueueFull if the queue is full.
func (m *Mirror) enqueue(ek string, kind byte, name string) error {
	m.mu.Lock()
	e := m.entryLocked(ek)
	m.dropRemoteLocked(e) // a local write replaced the remote value
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
