package steer

// Accessors for a long-lived owner (package serve): reading the global tiers, setting them from
// a connected worker over RPC, and exporting and restoring the latch map so it survives a
// restart. Kept apart from engine.go and latch.go, which they only call.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// RPC ops for global steering from a worker (served by Engine.ServeGlobal).
const (
	OpSetGlobal   uint16 = proto.OpSetGlobal
	OpClearGlobal uint16 = proto.OpClearGlobal
)

// ErrLatchState means a latch map given to RestoreLatches is inconsistent with itself or with
// this engine's caps; nothing was restored.
var ErrLatchState = errors.New("shmsteer: latch state does not fit this engine")

// Global reads the global tiers at snapshot s (vector data alias the region until s closes).
// ok is false when no global steering is set.
func (e *Engine) Global(s *shm.Snapshot) (g Steering, d Digest, ok bool, err error) {
	b, _, err := s.View(KindGlobal, globalKey)
	if errors.Is(err, shm.ErrNotFound) {
		return Steering{}, Digest{}, false, nil
	} else if err != nil {
		return Steering{}, Digest{}, false, err
	}
	w, err := decode(b, e.cfg, false)
	if err != nil {
		return Steering{}, Digest{}, false, fmt.Errorf("global steering: %w", err)
	}
	return w.steering(e.cfg), w.digest, true, nil
}

// SetGlobalAny is SetGlobal in the owner and an OpSetGlobal RPC to the owner from a worker
// (an empty g clears). The owner validates again what it receives.
func (e *Engine) SetGlobalAny(g Steering) (uint64, error) {
	if e.r.IsOwner() {
		return e.SetGlobal(g)
	}
	if e.opt.Caller == nil {
		return 0, ErrNotOwner
	}
	op, req := OpClearGlobal, []byte(nil)
	if !g.Empty() {
		w, err := resolveSteering(e.cfg, &g, nil, false)
		if err != nil {
			return 0, fmt.Errorf("global steering: %w", err)
		}
		if req, err = w.encode(e.cfg.Hidden); err != nil {
			return 0, err
		}
		op = OpSetGlobal
	}
	resp, err := e.call(op, req)
	if err != nil {
		return 0, err
	}
	if len(resp) != 8 {
		return 0, fmt.Errorf("%w: set-global reply of %d bytes", ErrBadEncoding, len(resp))
	}
	return binary.LittleEndian.Uint64(resp), nil
}

// ServeGlobal registers the owner's handlers for OpSetGlobal and OpClearGlobal.
func (e *Engine) ServeGlobal(handle HandleFunc) {
	handle(OpSetGlobal, func(req []byte) ([]byte, error) {
		// Copy so the floats are aligned whatever the transport's buffer offset.
		enc := append([]byte(nil), req...)
		w, err := decode(enc, e.cfg, true)
		if err != nil {
			return nil, err
		}
		v, err := e.SetGlobal(w.steering(e.cfg))
		if err != nil {
			return nil, err
		}
		return binary.LittleEndian.AppendUint64(nil, v), nil
	})
	handle(OpClearGlobal, func([]byte) ([]byte, error) {
		v, err := e.SetGlobal(Steering{})
		if err != nil {
			return nil, err
		}
		return binary.LittleEndian.AppendUint64(nil, v), nil
	})
}

// LatchEntry is one latched conversation, as exported for persistence.
type LatchEntry struct {
	Key      ConvKey
	Steering Steering
	Pins     []Pin
}

// Export copies the latch map (eviction order, next to be evicted first) and its counters.
func (l *Latches) Export() ([]LatchEntry, LatchStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LatchEntry, 0, l.order.Len())
	for el := l.order.Front(); el != nil; el = el.Next() {
		e := el.Value.(*latch)
		out = append(out, LatchEntry{Key: e.key, Steering: cloneSteering(&e.s), Pins: append([]Pin(nil), e.pins...)})
	}
	return out, l.st
}

// RestoreLatches replaces the owner's latch map with entries (in eviction order) and counters
// st, as exported by Latches.Export, and publishes the counters. The entries must fit this
// engine's caps, hold no duplicate key, and agree with st's conversation and byte counts;
// else ErrLatchState and nothing changes. Each entry's steering is validated against the
// model (sizes, hooks, layers, finite values).
func (e *Engine) RestoreLatches(entries []LatchEntry, st LatchStats) error {
	if err := e.ownerOnly(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.latches
	var bytes int64
	seen := make(map[ConvKey]bool, len(entries))
	fresh := make([]*latch, 0, len(entries))
	for i := range entries {
		en := &entries[i]
		if seen[en.Key] || en.Key.zero() {
			return fmt.Errorf("%w: entry %d: conversation %q/%q empty or listed twice", ErrLatchState, i, en.Key.Tenant, en.Key.ID)
		}
		seen[en.Key] = true
		if en.Steering.Empty() {
			return fmt.Errorf("%w: entry %d: empty steering", ErrLatchState, i)
		}
		if _, err := resolveSteering(e.cfg, &en.Steering, nil, true); err != nil {
			return fmt.Errorf("%w: entry %d: %w", ErrLatchState, i, err)
		}
		n := LatchBytes(&en.Steering)
		bytes += n
		fresh = append(fresh, &latch{key: en.Key, s: cloneSteering(&en.Steering), pins: append([]Pin(nil), en.Pins...), bytes: n})
	}
	if len(entries) != st.Conversations || bytes != st.Bytes {
		return fmt.Errorf("%w: counters say %d conversations and %d bytes, entries hold %d and %d",
			ErrLatchState, st.Conversations, st.Bytes, len(entries), bytes)
	}
	if len(entries) > l.cfg.MaxConversations || bytes > l.cfg.MaxLatchedBytes {
		return fmt.Errorf("%w: %d conversations and %d bytes exceed the caps (%d, %d)",
			ErrLatchState, len(entries), bytes, l.cfg.MaxConversations, l.cfg.MaxLatchedBytes)
	}
	if _, err := e.r.Put(KindStatus, statusKey, encodeLatchStats(st)); err != nil {
		return fmt.Errorf("restore latches: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order.Init()
	clear(l.byKey)
	for _, x := range fresh {
		l.byKey[x.key] = l.order.PushBack(x)
	}
	l.st = st
	return nil
}
