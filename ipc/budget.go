package ipc

import (
	"fmt"
	"sync"
	"time"
)

// byteBudget bounds the bytes that all of an owner's connections buffer for frames
// (OwnerOptions.MaxBufferedBytes). A connection that needs more waits for others to release
// theirs: backpressure, since it reads nothing from its socket meanwhile.
type byteBudget struct {
	mu      sync.Mutex
	free    int
	total   int
	changed chan struct{} // closed and replaced on every release
}

func newByteBudget(total int) *byteBudget {
	return &byteBudget{free: total, total: total, changed: make(chan struct{})}
}

// acquire takes n bytes, waiting at most wait for them; ErrBusy if they do not come in time,
// ErrClosed if done closes first.
func (b *byteBudget) acquire(n int, wait time.Duration, done <-chan struct{}) error {
	if n > b.total {
		return fmt.Errorf("%w: a frame buffer of %d bytes exceeds MaxBufferedBytes (%d)", ErrBusy, n, b.total)
	}
	var timer *time.Timer
	for {
		b.mu.Lock()
		if b.free >= n {
			b.free -= n
			b.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return nil
		}
		ch := b.changed
		b.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(wait)
		}
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("%w: no room for a %d-byte frame buffer within %v", ErrBusy, n, wait)
		case <-done:
			timer.Stop()
			return ErrClosed
		}
	}
}

func (b *byteBudget) release(n int) {
	b.mu.Lock()
	b.free += n
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// inUse is how many bytes are taken (tests, logs).
func (b *byteBudget) inUse() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total - b.free
}
