package steer

// The owner's side of the writer (writer.go): every write is a local transaction on the region
// under the engine's write mutex, in the order of the calls.

import (
	"errors"
	"fmt"

	"github.com/shmsteer/shmsteer/shm"
)

// local writes the region in the owner.
type local struct{ e *Owner }

func (l local) putNamed(kind shm.Kind, name string, b []byte, d Digest, o writeOpts) (VectorInfo, error) {
	write, what := l.e.writeNamed, "register %q: %w"
	if kind == KindProbe {
		write, what = l.e.writeProbe, "register probe %q: %w"
	}
	v, err := write(name, b, o)
	if err != nil {
		return VectorInfo{}, fmt.Errorf(what, name, err)
	}
	return VectorInfo{Name: name, Version: v, Digest: d}, nil
}

func (l local) deleteNamed(kind shm.Kind, name string, o writeOpts) (uint64, error) {
	if kind == KindProbe {
		return l.e.writeProbe(name, nil, o)
	}
	return l.e.writeNamed(name, nil, o)
}

func (l local) setGlobal(g Steering, o writeOpts) (v uint64, err error) {
	e := l.e
	e.mu.Lock()
	defer e.mu.Unlock()
	defer func() { o.done(e, &err, Change{Kind: ChangeGlobal, Deleted: g.Empty()}, &v) }() // observers, under the lock
	s, err := e.r.Snapshot()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if o.merge {
		cur, _, ok, err := e.Global(&s) // aliases s, which stays open until the write
		if err != nil {
			return 0, err
		}
		if ok {
			g = MergeSites(cur, g)
		}
	}
	g.Compose = ComposeReplace
	w, err := resolveSteering(e.cfg, &g, digestAt(&s), false)
	if err != nil {
		return 0, fmt.Errorf("global steering: %w", err)
	}
	if err := checkMagnitude(e.cfg, &w, namedAt(&s, e.cfg), "global steering"); err != nil {
		return 0, err
	}
	if err := o.check(); err != nil {
		return 0, err
	}
	if g.Empty() {
		if _, _, err := s.View(KindGlobal, globalKey); errors.Is(err, shm.ErrNotFound) {
			return e.r.Version(), nil
		}
		v, err := e.r.Update(func(tx *shm.Tx) error {
			if err := tx.Delete(KindGlobal, globalKey); err != nil {
				return err
			}
			if err := tx.Delete(KindComposedGlobal, globalKey); err != nil && !errors.Is(err, shm.ErrNotFound) {
				return err
			}
			return nil
		})
		if err == nil {
			e.deps.set(globalDep, nil)
		}
		return v, err
	}
	b, err := w.encode(e.cfg.Hidden)
	if err != nil {
		return 0, err
	}
	v, err = e.r.Update(func(tx *shm.Tx) error {
		if err := tx.Put(KindGlobal, globalKey, b); err != nil {
			return err
		}
		return e.putComposed(tx, KindComposedGlobal, globalKey, &w, lookupAt(&s, "", nil), "global steering")
	})
	if err == nil {
		e.deps.set(globalDep, refNames(&w))
	}
	return v, err
}

func (l local) admit(a Admission) (Admitted, error) {
	e := l.e
	if len(a.RequestID) == 0 || len(a.RequestID) > MaxIDLen {
		return Admitted{}, fmt.Errorf("%w (%d bytes)", ErrBadRequestID, len(a.RequestID))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	snap, err := e.r.Snapshot()
	if err != nil {
		return Admitted{}, err
	}
	defer snap.Close()
	digestOf := digestAt(&snap)
	var out Admitted
	named := namedAt(&snap, e.cfg)
	set := fmt.Sprintf("request %q", a.RequestID)
	capture, admittedCapture, err := e.admitCapture(&a) // before admitGates, which changes the owner's table
	if err != nil {
		return Admitted{}, err
	}
	out.Capture = admittedCapture
	gates, commitGates, err := e.admitGates(&snap, &a, set)
	if err != nil {
		return Admitted{}, err
	}
	if err := e.checkAdmissionGates(&a, digestOf, named, gates, set); err != nil {
		return Admitted{}, err
	}
	w, err := e.admitSteering(&a, &out, digestOf, named, set)
	if err != nil {
		return Admitted{}, err
	}
	enc, err := w.encode(e.cfg.Hidden)
	if err != nil {
		return out, err
	}
	if out.Source != SourceNone {
		out.Digest = w.digest
	}
	commitGates()
	if _, _, err := snap.View(KindRequest, a.RequestID); err == nil {
		out.Replaced = true
	}
	stats := e.latches.Stats()
	out.Version, err = e.r.Update(func(tx *shm.Tx) error {
		if err := tx.Put(KindRequest, a.RequestID, enc); err != nil {
			return err
		}
		if err := e.putComposed(tx, KindComposed, a.RequestID, &w, lookupAt(&snap, "", nil), set); err != nil {
			return err
		}
		if err := putGates(tx, a.RequestID, gates); err != nil {
			return err
		}
		if err := putCapture(tx, a.RequestID, capture); err != nil {
			return err
		}
		return tx.Put(KindStatus, statusKey, encodeLatchStats(stats, e.ColumnsFallbacks()))
	})
	if err != nil {
		return out, fmt.Errorf("admit %q: %w", a.RequestID, err)
	}
	e.deps.set(a.RequestID, refNames(&w))
	return out, nil
}

// admitSteering decides a's request steering (its override, its conversation's latch, or both
// composed), checks it, runs the latch operations (out.Source, Latched, Refused) and returns
// the set resolved (empty when the request has none). Every refusal comes before any latch
// operation, so it changes nothing.
func (e *Owner) admitSteering(a *Admission, out *Admitted, digestOf func(string) (Digest, bool), named func(string) (wire, bool), set string) (wire, error) {
	var final Steering
	var w wire
	if a.Override != nil && !a.Override.Empty() {
		var err error
		if w, err = e.checkOverride(a, digestOf, named, set); err != nil {
			return wire{}, err
		}
		final, out.Source = *a.Override, SourceOverride
		if !a.Conversation.zero() {
			if a.Override.Compose == ComposeAdd {
				if prev, ok := e.latches.Bridge(a.Conversation, digestOf); ok {
					final, out.Source = mergeSteering(&prev, a.Override), SourceComposed
				}
			}
			pins := pinsOf(&final, digestOf)
			out.Latched, out.Refused = e.latches.trigger(a.Conversation, &final, pins)
		}
	} else if !a.Conversation.zero() {
		if prev, ok := e.latches.Bridge(a.Conversation, digestOf); ok {
			final, out.Source = prev, SourceLatch
		}
	}
	switch out.Source {
	case SourceNone: // an empty steering set marks a request admitted without request steering
		return resolveSteering(e.cfg, &Steering{}, nil, false)
	case SourceOverride:
		return w, nil // resolved and checked by checkOverride
	}
	w, err := resolveSteering(e.cfg, &final, digestOf, true)
	if err == nil {
		err = checkMagnitude(e.cfg, &w, named, set)
	}
	return w, err // an error cannot happen: every part was validated
}

// checkOverride resolves and checks a's override, and with its conversation's latch when it
// composes onto it (ComposeAdd): the sum must fit as well.
func (e *Owner) checkOverride(a *Admission, digestOf func(string) (Digest, bool), named func(string) (wire, bool), set string) (wire, error) {
	w, err := resolveSteering(e.cfg, a.Override, digestOf, false)
	if err != nil {
		return wire{}, err
	}
	if err := checkMagnitude(e.cfg, &w, named, set); err != nil {
		return wire{}, err
	}
	if a.Override.Compose == ComposeAdd && !a.Conversation.zero() {
		if prev, ok := e.latches.peek(a.Conversation, digestOf); ok {
			m := mergeSteering(&prev, a.Override)
			mw, err := resolveSteering(e.cfg, &m, digestOf, true)
			if err == nil {
				err = checkMagnitude(e.cfg, &mw, named, set+" (latched steering + override)")
			}
			if err != nil {
				return wire{}, err
			}
		}
	}
	return w, nil
}

func (l local) end(requestID string) (uint64, error) {
	e := l.e
	if len(requestID) == 0 || len(requestID) > MaxIDLen {
		return 0, fmt.Errorf("%w (%d bytes)", ErrBadRequestID, len(requestID))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	v, err := e.r.Update(func(tx *shm.Tx) error {
		if err := tx.Delete(KindRequest, requestID); err != nil {
			return err
		}
		if err := tx.Delete(KindComposed, requestID); err != nil && !errors.Is(err, shm.ErrNotFound) {
			return err
		}
		if err := putGates(tx, requestID, nil); err != nil {
			return err
		}
		return putCapture(tx, requestID, nil)
	})
	if errors.Is(err, shm.ErrNotFound) {
		return e.r.Version(), nil
	}
	if err == nil {
		e.deps.set(requestID, nil)
	}
	return v, err
}

func (l local) dropConversation(k ConvKey) (bool, error) {
	e := l.e
	e.mu.Lock()
	defer e.mu.Unlock()
	ok := e.latches.Drop(k)
	_, err := e.r.Put(KindStatus, statusKey, encodeLatchStats(e.latches.Stats(), e.ColumnsFallbacks()))
	return ok, err
}

func (l local) gateEngaged(keys []uint64) error {
	l.e.gateEngaged(keys)
	return nil
}

func (lw local) restoreLatches(entries []LatchEntry, st LatchStats) error {
	e := lw.e
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
	if _, err := e.r.Put(KindStatus, statusKey, encodeLatchStats(st, e.ColumnsFallbacks())); err != nil {
		return fmt.Errorf("restore latches: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.order.Init()
	clear(l.byKey)
	clear(l.use)
	for _, x := range fresh {
		l.byKey[x.key] = l.order.PushBack(x)
		l.account(x, 1)
	}
	l.st = st
	return nil
}
