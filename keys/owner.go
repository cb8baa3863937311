package keys

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shmsteer/shmsteer/internal/observe"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
)

const (
	// DefaultGrace is how long a removed key's revoked sentinel stands before it is purged.
	DefaultGrace = 60 * time.Second
	// DefaultMaxKeyBytes is the default bound on one key.
	DefaultMaxKeyBytes = 4096
)

// Options configures the owner's registry (Open).
type Options struct {
	// Grace is how long a removed key's revoked sentinel stands before it is purged; 0 means
	// DefaultGrace (60 s).
	Grace time.Duration
	// MaxKeyBytes bounds one key; 0 means DefaultMaxKeyBytes (4096). A key set must fit in one
	// RPC request: at most the owner's ipc.Owner.MaxPayload less 2+MaxRequestIDLen bytes.
	MaxKeyBytes int
	// Logger receives the registry's warnings (a full mark table, a failed purge); nil means
	// slog.Default(). It never receives a key.
	Logger *slog.Logger
}

// opened holds the owners that have a registry: one per owner.
var (
	openedMu sync.Mutex
	opened   = map[*ipc.Owner]bool{}
)

// Owner is the key registry of the region's owner: its only writer. Besides what a worker has
// (the embedded Registry) it tells observers of every write, whichever process made it
// (OnChange), purges revoked sentinels after the grace period and counts the revocations that
// found no room for a sentinel; none of these exist on a Worker.
type Owner struct {
	*Registry
	l *local
}

// Open starts the key registry of an owner: it serves workers' key writes (Attach) and purges
// revoked sentinels after Options.Grace until the owner closes (ipc.Owner.OnClose). Call it
// once per owner, before workers attach. shm.ErrBadConfig for options out of range or a second
// Open of the same owner.
func Open(o *ipc.Owner, opt Options) (*Owner, error) {
	l := &local{
		region: o.Region(),
		owner:  o,
		log:    cmp.Or(opt.Logger, slog.Default()),
		grace:  cmp.Or(opt.Grace, DefaultGrace),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
	}
	maxKey := cmp.Or(opt.MaxKeyBytes, DefaultMaxKeyBytes)
	switch limit := o.MaxPayload() - 2 - MaxRequestIDLen; {
	case maxKey < 0 || maxKey > limit:
		return nil, fmt.Errorf("%w: MaxKeyBytes %d must be in [0, %d] (the owner's MaxFrameBytes less a key set's header)", shm.ErrBadConfig, maxKey, limit)
	case l.grace < 0:
		return nil, fmt.Errorf("%w: Grace %v is negative", shm.ErrBadConfig, l.grace)
	}
	openedMu.Lock()
	if opened[o] {
		openedMu.Unlock()
		return nil, fmt.Errorf("%w: keys.Open called twice for one owner: keep the first Registry", shm.ErrBadConfig)
	}
	opened[o] = true
	openedMu.Unlock()

	k := &Owner{Registry: &Registry{region: l.region, maxKey: maxKey, w: l}, l: l}
	serve(o, k.Registry)
	l.wg.Add(1)
	go l.purgeLoop()
	o.OnClose(func() {
		close(l.done)
		l.wg.Wait()
		openedMu.Lock()
		delete(opened, o)
		openedMu.Unlock()
	})
	return k, nil
}

// local is the owner's writer: it writes the region under mu, which also guards the purge
// schedule.
type local struct {
	region *shm.Region
	owner  *ipc.Owner
	log    *slog.Logger
	grace  time.Duration

	observers observe.List[Change] // OnChange's callbacks, notified by each write

	mu     sync.Mutex
	purges purgeQueue
	wake   chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup

	revokeUnmarked atomic.Uint64 // see RevokedWithoutSentinel
	revokeInArena  atomic.Uint64 // see RevokedInArena
}

func (l *local) String() string { return l.owner.String() }

// OnChange registers fn to be called after every successful Set and Remove, whichever process
// asked for it (a worker's write arrives as an RPC), in the order of the writes and with the
// registry's write lock held: fn must be quick and must not write keys (a mirror enqueues the
// change and returns). The returned function removes fn.
func (k *Owner) OnChange(fn func(Change)) (remove func()) { return k.l.observers.Add(fn) }

// RevokedWithoutSentinel counts the revocations that deleted a key but found no room for a
// revoked sentinel, neither in the mark table nor in the arena, so readers saw ErrNotFound for
// it instead of ErrRevoked. Non-zero means shm.Config.MarkSlots (and ArenaBytes) are too small
// for the revocation rate and grace.
func (k *Owner) RevokedWithoutSentinel() uint64 { return k.l.revokeUnmarked.Load() }

// RevokedInArena counts the revocations whose sentinel went in the arena because the mark
// table was full (readers still see ErrRevoked).
func (k *Owner) RevokedInArena() uint64 { return k.l.revokeInArena.Load() }

// set writes a live key, lifts a revoked sentinel of the id and cancels its pending purge.
func (l *local) set(id string, key []byte, opts writeOpts) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if opts.cond != nil {
		if err := opts.cond(); err != nil {
			return err
		}
	}
	_, err := l.region.Update(func(tx *shm.Tx) error {
		if err := tx.PutFunc(Kind, id, len(key)+1, func(dst []byte) {
			copy(dst, key)
			dst[len(key)] = stateLive
		}); err != nil {
			return err
		}
		return tx.Unmark(Kind, id)
	})
	if err != nil {
		return err
	}
	l.purges.cancel(id)
	l.observers.Notify(Change{RequestID: id, Origin: opts.origin})
	return nil
}

// remove deletes a live key and marks the id revoked, in one transaction, and schedules the
// purge of the mark. The deletion uses the arena's deletion reserve and the mark the mark
// table, so it fits however full the arena is. Should the mark table be full, the key is
// replaced by a revoked entry in the arena (its state byte alone), so readers still get
// ErrRevoked; only if the arena has no room for that either is the key deleted without a
// sentinel (readers then get ErrNotFound for it; RevokedWithoutSentinel counts it): a
// revocation never fails for lack of room. Each case is logged, rate-limited (the 1st, 2nd,
// 4th, 8th... occurrence), since a full table turns every revocation into one. The key's old
// blob is zeroed by shm when no reader can still see it.
func (l *local) remove(id string, opts writeOpts) (err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if opts.cond != nil {
		if err := opts.cond(); err != nil {
			return err
		}
	}
	state, err := l.entry(id)
	if err != nil {
		return err
	}
	if state == stateRevoked {
		return nil
	}
	defer func() { // the key is gone from here on, whatever sentinel could be left
		if err == nil {
			l.observers.Notify(Change{RequestID: id, Revoked: true, Origin: opts.origin})
		}
	}()
	v, err := l.region.Update(func(tx *shm.Tx) error {
		if err := tx.Delete(Kind, id); err != nil {
			return err
		}
		return tx.Mark(Kind, id)
	})
	if errors.Is(err, shm.ErrRegionFull) { // the mark table is full: a sentinel in the arena
		v, err = l.region.Update(func(tx *shm.Tx) error { return tx.Put(Kind, id, []byte{stateRevoked}) })
		if n := l.revokeInArena.Add(1); err == nil && n&(n-1) == 0 {
			l.log.Warn("shmsteer: the mark table is full: revoked sentinels go in the arena instead (readers still see ErrRevoked); raise shm.Config.MarkSlots",
				"revocations", n, "markSlots", l.region.Stats().MarkSlots)
		}
	}
	if errors.Is(err, shm.ErrRegionFull) { // and the arena too: delete without a sentinel
		if _, err = l.region.Update(func(tx *shm.Tx) error { return tx.Delete(Kind, id) }); err != nil {
			return err
		}
		if n := l.revokeUnmarked.Add(1); n&(n-1) == 0 {
			l.log.Warn("shmsteer: key deleted without a revoked sentinel: the mark table and the arena are full; raise shm.Config.MarkSlots and ArenaBytes (readers see ErrNotFound for these ids)",
				"revocations", n)
		}
		return nil
	}
	if err != nil {
		return err
	}
	if l.purges.schedule(id, v, time.Now().Add(l.grace)) {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
	return nil
}

// entry reads the state of id's entry without copying its key: stateLive, stateRevoked, or
// ErrNotFound.
func (l *local) entry(id string) (state byte, err error) {
	s, err := l.region.Snapshot()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	v, _, err := s.View(Kind, id)
	switch {
	case err == shm.ErrMarked:
		return stateRevoked, nil
	case errors.Is(err, shm.ErrNotFound):
		return 0, ErrNotFound
	case err != nil:
		return 0, err
	case len(v) == 0:
		return 0, fmt.Errorf("%w: empty key registry entry", shm.ErrCorrupt)
	}
	return v[len(v)-1], nil
}

// revokedIDs lists the ids whose revoked sentinel waits for its purge, soonest first.
func (l *local) revokedIDs() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	items := slices.Clone(l.purges.items)
	slices.SortFunc(items, func(a, b *purgeItem) int { return a.due.Compare(b.due) })
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.id
	}
	return ids
}

// purgeLoop deletes revoked sentinels whose grace has passed, until the owner closes.
func (l *local) purgeLoop() {
	defer l.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		l.mu.Lock()
		now := time.Now()
		for l.purges.Len() > 0 && !l.purges.items[0].due.After(now) {
			it := heap.Pop(&l.purges).(*purgeItem)
			delete(l.purges.byID, it.id)
			l.purgeLocked(it)
		}
		wait := time.Hour
		if l.purges.Len() > 0 {
			wait = l.purges.items[0].due.Sub(now)
		}
		l.mu.Unlock()
		t.Reset(wait)
		select {
		case <-l.done:
			return
		case <-l.wake:
		case <-t.C:
		}
	}
}

// purgeLocked lifts a sentinel if the id is still revoked. A key set again since lifted the
// sentinel itself and cancelled the purge.
func (l *local) purgeLocked(it *purgeItem) {
	if state, err := l.entry(it.id); err != nil || state != stateRevoked {
		return
	}
	inArena := false // a sentinel in the arena (the mark table was full), not a mark
	if s, err := l.region.Snapshot(); err == nil {
		_, _, verr := s.View(Kind, it.id)
		s.Close()
		inArena = verr == nil
	}
	if _, err := l.region.Update(func(tx *shm.Tx) error {
		if inArena {
			return tx.Delete(Kind, it.id)
		}
		return tx.Unmark(Kind, it.id)
	}); err != nil {
		l.log.Warn("shmsteer: purging a revoked key failed", "err", err)
	}
}

// purgeQueue is a min-heap of pending purges by deadline, indexed by request id so that Set
// can cancel one.
type purgeQueue struct {
	items []*purgeItem
	byID  map[string]*purgeItem
}

type purgeItem struct {
	id      string
	version uint64 // version of the sentinel to purge
	due     time.Time
	index   int
}

// schedule adds a purge and reports whether it is now the earliest.
func (q *purgeQueue) schedule(id string, version uint64, due time.Time) bool {
	if q.byID == nil {
		q.byID = map[string]*purgeItem{}
	}
	if old := q.byID[id]; old != nil {
		heap.Remove(q, old.index)
	}
	it := &purgeItem{id: id, version: version, due: due}
	q.byID[id] = it
	heap.Push(q, it)
	return it.index == 0
}

func (q *purgeQueue) cancel(id string) {
	if it := q.byID[id]; it != nil {
		heap.Remove(q, it.index)
		delete(q.byID, id)
	}
}

func (q *purgeQueue) Len() int           { return len(q.items) }
func (q *purgeQueue) Less(i, j int) bool { return q.items[i].due.Before(q.items[j].due) }
func (q *purgeQueue) Swap(i, j int) {
	q.items[i], q.items[j] = q.items[j], q.items[i]
	q.items[i].index, q.items[j].index = i, j
}
func (q *purgeQueue) Push(x any) {
	it := x.(*purgeItem)
	it.index = len(q.items)
	q.items = append(q.items, it)
}
func (q *purgeQueue) Pop() any {
	n := len(q.items)
	it := q.items[n-1]
	q.items[n-1] = nil
	q.items = q.items[:n-1]
	return it
}
