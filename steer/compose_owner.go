package steer

import (
	"errors"
	"fmt"

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

// putComposed composes w and stores it under (kind, key) in tx.
func (e *Engine) putComposed(tx *shm.Tx, kind shm.Kind, key string, w *wire, lookup func(string) ([]byte, bool), set string) error {
	c, err := compose(e.cfg, w, lookup, set)
	if err != nil {
		return err
	}
	return tx.Put(kind, key, c.encode())
}

// recomposeDependents rewrites, in tx, the compositions of every set that references name,
// whose encoding becomes b (nil: unregistered). s is a snapshot taken before tx.
func (e *Engine) recomposeDependents(tx *shm.Tx, s *shm.Snapshot, name string, b []byte) error {
	lookup := lookupAt(s, name, b)
	for id := range e.deps.byName[name] {
		kind, key, src, set := KindComposed, id, KindRequest, fmt.Sprintf("request %q", id)
		if id == globalDep {
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

// writeNamed stores (b != nil) or deletes a named vector and recomposes its dependents, in one
// transaction: a step sees the old vector and old compositions, or the new ones.
func (e *Engine) writeNamed(name string, b []byte) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
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
		return e.recomposeDependents(tx, &s, name, b)
	})
}
