package steer

import (
	"errors"
	"fmt"
	"log"
	"slices"

	"github.com/shmsteer/shmsteer/shm"
)

// The owner's side of composition (see composed.go): every write of a steering set writes its
// composition in the same transaction, and a named vector's change recomposes the sets that
// reference it. deps records, in the owner's private memory, which sets reference which names.
type deps struct {
	byName map[string]map[string]struct{} // name → request ids ("" = the global steering)
	byID   map[string][]string            // request id ("" = global) → names it references
}

const globalDep = "" // never a request id (ids are non-empty)

func (d *deps) set(id string, names []string) {
	if d.byName == nil {
		d.byName, d.byID = map[string]map[string]struct{}{}, map[string][]string{}
	}
	for _, n := range d.byID[id] {
		delete(d.byName[n], id)
		if len(d.byName[n]) == 0 {
			delete(d.byName, n)
		}
	}
	delete(d.byID, id)
	if len(names) == 0 {
		return
	}
	d.byID[id] = names
	for _, n := range names {
		if d.byName[n] == nil {
			d.byName[n] = map[string]struct{}{}
		}
		d.byName[n][id] = struct{}{}
	}
}

// refNames lists the distinct names w references.
func refNames(w *wire) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range w.refs {
		if !seen[r.name] {
			seen[r.name] = true
			out = append(out, r.name)
		}
	}
	return out
}

// lookupAt returns named vectors' encodings from s, with name overridden: b (nil: deleted).
func lookupAt(s *shm.Snapshot, name string, b []byte) func(string) ([]byte, bool) {
	return func(n string) ([]byte, bool) {
		if n == name {
			return b, b != nil
		}
		v, _, err := s.View(KindVector, n)
		return v, err == nil
	}
}

// putComposed composes w and stores it under (kind, key) in tx. A request's own vectors go to
// columns of the region's column pool, attached to the entry (composed.go's Columns section);
// when the pool has no room (shm.ErrColumnsFull) or does not fit the model, they stay in the
// entry.
func (e *Owner) putComposed(tx *shm.Tx, kind shm.Kind, key string, w *wire, lookup func(string) ([]byte, bool), set string) error {
	c, err := compose(e.cfg, w, lookup, set)
	if err != nil {
		return err
	}
	cols, err := e.placeColumns(tx, c, kind)
	if err != nil {
		return err
	}
	if err := tx.Put(kind, key, c.encode(cols)); err != nil {
		return err
	}
	if len(cols) == 0 {
		return nil
	}
	return tx.Attach(kind, key, cols...)
}

// placeColumns reserves the columns c's own vectors take, in tx, and writes them there. It
// returns nil, leaving c unplaced, for the global composition, a pool that does not fit the
// model, or a full pool (columns already reserved are freed when tx commits unattached).
func (e *Owner) placeColumns(tx *shm.Tx, c *composition, kind shm.Kind) ([]int, error) {
	if kind != KindComposed || !e.poolFits {
		return nil, nil
	}
	inPlace, terms := slices.Clone(c.inPlace), slices.Clone(c.terms)
	need := c.assignColumns()
	cols := make([]int, 0, need)
	for range need {
		k, err := tx.AllocColumn()
		if errors.Is(err, shm.ErrColumnsFull) {
			e.columnsFallbacks.Add(1) // Status.ColumnsFallbacks
			c.inPlace, c.terms, c.colSlot = inPlace, terms, nil
			return nil, nil
		} else if err != nil {
			return nil, err
		}
		cols = append(cols, k)
	}
	err := c.writeColumns(func(slot, cell int) ([]float32, error) {
		b, err := tx.Cell(cols[slot], cell)
		if err != nil {
			return nil, err
		}
		return shm.AsFloat32(b), nil
	})
	if err != nil {
		return nil, err
	}
	return cols, nil
}

// recomposeDependents rewrites, in tx, the compositions of every set that references name,
// whose encoding becomes b (nil: unregistered), except the global steering when skipGlobal.
// s is a snapshot taken before tx.
func (e *Owner) recomposeDependents(tx *shm.Tx, s *shm.Snapshot, name string, b []byte, skipGlobal bool) error {
	lookup := lookupAt(s, name, b)
	for id := range e.deps.byName[name] {
		kind, key, src, set := KindComposed, id, KindRequest, fmt.Sprintf("request %q", id)
		if id == globalDep {
			if skipGlobal {
				continue
			}
			kind, key, src, set = KindComposedGlobal, globalKey, KindGlobal, "global steering"
		}
		raw, _, err := s.View(src, key)
		if errors.Is(err, shm.ErrNotFound) {
			continue // ended meanwhile
		} else if err != nil {
			return err
		}
		w, err := decode(raw, e.cfg, false)
		if err != nil {
			return fmt.Errorf("%s: %w", set, err)
		}
		if err := e.putComposed(tx, kind, key, &w, lookup, set+fmt.Sprintf(" (recomposed for named vector %q)", name)); err != nil {
			return err
		}
	}
	return nil
}

// dropGlobalRefs rewrites, in tx, the global steering without its references to name (being
// unregistered) and recomposes it, or deletes it if nothing else is left. It returns the names
// the global steering still references and whether it was deleted. s is a snapshot taken
// before tx.
func (e *Owner) dropGlobalRefs(tx *shm.Tx, s *shm.Snapshot, name string) (refs []string, deleted bool, err error) {
	raw, _, err := s.View(KindGlobal, globalKey)
	if err != nil {
		return nil, false, err
	}
	w, err := decode(raw, e.cfg, false)
	if err != nil {
		return nil, false, fmt.Errorf("global steering: %w", err)
	}
	kept := make([]wireRef, 0, len(w.refs))
	for _, r := range w.refs {
		if r.name != name {
			kept = append(kept, r)
		}
	}
	w.refs = kept
	if len(w.vecs) == 0 && len(w.refs) == 0 && len(w.clamps) == 0 {
		if err := tx.Delete(KindGlobal, globalKey); err != nil {
			return nil, false, err
		}
		if err := tx.Delete(KindComposedGlobal, globalKey); err != nil && !errors.Is(err, shm.ErrNotFound) {
			return nil, false, err
		}
		return nil, true, nil
	}
	enc, err := w.encode(e.cfg.Hidden)
	if err != nil {
		return nil, false, err
	}
	if err := tx.Put(KindGlobal, globalKey, enc); err != nil {
		return nil, false, err
	}
	set := fmt.Sprintf("global steering (references to named vector %q dropped)", name)
	if err := e.putComposed(tx, KindComposedGlobal, globalKey, &w, lookupAt(s, name, nil), set); err != nil {
		return nil, false, err
	}
	return refNames(&w), false, nil
}

// writeNamed stores (b != nil) or deletes a named vector and recomposes its dependents, in one
// transaction: a step sees the old vector and old compositions, or the new ones. Deleting a
// vector the global steering references also drops those references from the global steering
// in the same transaction (see Unregister), and the observers then get a ChangeGlobal too.
func (e *Owner) writeNamed(name string, b []byte, o writeOpts) (v uint64, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, dropGlobal := e.deps.byName[name][globalDep]
	dropGlobal = dropGlobal && b == nil
	var globalRefs []string
	var globalDeleted bool
	defer func() {
		if err == nil && dropGlobal {
			e.deps.set(globalDep, globalRefs)
			e.logf("shmsteer: named vector %q was unregistered: its references were dropped from the global steering (recomposed in the same write)", name)
			o.done(e, &err, Change{Kind: ChangeGlobal, Deleted: globalDeleted}, &v)
		}
	}()
	defer o.done(e, &err, Change{Kind: ChangeVector, Name: name, Deleted: b == nil}, &v) // observers, under the lock
	if err := o.check(); err != nil {
		return 0, err
	}
	s, err := e.r.Snapshot()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	return e.r.Update(func(tx *shm.Tx) error {
		if b != nil {
			if err := tx.Put(KindVector, name, b); err != nil {
				return err
			}
		} else if err := tx.Delete(KindVector, name); err != nil {
			if errors.Is(err, shm.ErrNotFound) {
				return fmt.Errorf("%w: %q", ErrUnknownVector, name)
			}
			return err
		}
		var meta []byte
		if b != nil {
			meta = EncodeVectorMeta(VectorMeta{ModelHint: o.hint})
		}
		if err := putVectorMeta(tx, name, meta); err != nil {
			return err
		}
		if dropGlobal {
			var err error
			if globalRefs, globalDeleted, err = e.dropGlobalRefs(tx, &s, name); err != nil {
				return err
			}
		}
		return e.recomposeDependents(tx, &s, name, b, dropGlobal)
	})
}

// logf writes a warning through Options.Logf (default log.Printf).
func (e *Engine) logf(format string, args ...any) {
	if e.opt.Logf != nil {
		e.opt.Logf(format, args...)
		return
	}
	log.Printf(format, args...)
}
