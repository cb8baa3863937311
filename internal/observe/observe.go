// Package observe owns the one way a room's owner announces its writes to observers: a List of
// callbacks of one change type, which the room calls after each successful write (steer's
// Owner.OnChange, keys' Owner.OnChange; the mirror subscribes to both).
//
// It holds no state of the rooms and knows nothing of what a change means: it must not grow
// filtering, queueing or goroutines (an observer that needs them, as the mirror does, enqueues
// in its callback and returns). It imports only the standard library.
//
// To start: embed a List[C] (its zero value is ready) in the owner's type, return list.Add(fn)
// from the room's OnChange, and call list.Notify(c) once the write is visible, in the writing
// goroutine.
package observe

import "sync"

// List is a set of callbacks that each receive every change of type C. Add and Notify are
// safe for concurrent use; Notify calls the callbacks in the order they were added, in the
// goroutine that calls it, so callbacks see changes in the order of the Notify calls. A
// callback added or removed during a Notify takes effect from the next one.
type List[C any] struct {
	mu sync.RWMutex
	fs []*func(C) // copy-on-write: a Notify in flight keeps the slice it read
}

// Add registers fn. The returned function removes it; calling it again does nothing.
func (l *List[C]) Add(fn func(C)) (remove func()) {
	p := &fn
	l.mu.Lock()
	l.fs = append(l.fs[:len(l.fs):len(l.fs)], p)
	l.mu.Unlock()
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, q := range l.fs {
			if q == p {
				l.fs = append(l.fs[:i:i], l.fs[i+1:]...)
				return
			}
		}
	}
}

// Notify calls every registered callback with c.
func (l *List[C]) Notify(c C) {
	l.mu.RLock()
	fs := l.fs
	l.mu.RUnlock()
	for _, f := range fs {
		(*f)(c)
	}
}
