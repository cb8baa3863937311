package steer

// Accessors for a long-lived owner (package serve): reading and merging the global tiers, and
// exporting and restoring the latch map so it survives a restart. Kept apart from engine.go and
// latch.go, which they only call.

import (
	"errors"
	"fmt"
	"slices"

	"github.com/shmsteer/shmsteer/shm"
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

// MergeSites merges add into cur, per tier, and returns cur: add's vectors replace cur's at
// the same (hook, layer), add's clamps replace all of cur's clamps at the sites add names, and
// add's refs replace cur's refs of the same name; the rest of cur stays, in its order, with
// add's entries after it. SetGlobal with Merge applies it in the owner. cur's tier slices are
// reused: pass a Clone to keep cur.
func MergeSites(cur, add Steering) Steering {
	type site struct {
		hook  string
		layer int
	}
	for _, ph := range []Phase{PhaseBase, PhasePrefill, PhaseDecode} {
		c, a := cur.Tier(ph), add.Tier(ph)
		vs := map[site]bool{}
		for _, v := range a.Vectors {
			vs[site{v.Hook, v.Layer}] = true
		}
		cs := map[site]bool{}
		for _, x := range a.Clamps {
			cs[site{x.Hook, x.Layer}] = true
		}
		rs := map[string]bool{}
		for _, r := range a.Refs {
			rs[r.Name] = true
		}
		c.Vectors = append(slices.DeleteFunc(c.Vectors, func(v Vector) bool { return vs[site{v.Hook, v.Layer}] }), a.Vectors...)
		c.Clamps = append(slices.DeleteFunc(c.Clamps, func(x Clamp) bool { return cs[site{x.Hook, x.Layer}] }), a.Clamps...)
		c.Refs = append(slices.DeleteFunc(c.Refs, func(r Ref) bool { return rs[r.Name] }), a.Refs...)
	}
	return cur
}

// Clone deep-copies s (whose vector data may alias a snapshot).
func (s *Steering) Clone() Steering { return cloneSteering(s) }

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
func (e *Owner) RestoreLatches(entries []LatchEntry, st LatchStats) error {
	return local{e}.restoreLatches(entries, st)
}
