package ipc

// Follower: a client that follows the owner of its namespace across owner restarts.

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// ErrDeadRegion means the owner this client attached to is gone: reads still see its region's
// last state, which no longer changes, while the Follower looks for a new owner. Check
// Follower.Err before trusting reads as current.
var ErrDeadRegion = errors.New("shmsteer: reading a dead region: the owner is gone; re-attaching to a new owner of the namespace")

// FollowOptions configures Follow.
type FollowOptions struct {
	// Client configures each attach. Its Secret is copied and kept for re-attaching (nil
	// reads SHMSTEER_SECRET once; with DropEnv the variable is then removed).
	Client ClientOptions
	// Poll is how often the owner is checked (an empty RPC); 0 means 100 ms.
	Poll time.Duration
	// MinBackoff and MaxBackoff bound the wait between attach attempts while no owner answers;
	// 0 means 10 ms and 1 s. The wait doubles after each failed attempt.
	MinBackoff, MaxBackoff time.Duration
	// Retire is how long a replaced client stays mapped before it is closed, so that readers
	// still holding it finish their reads; 0 means 10 s.
	Retire time.Duration
	// Ready, if set, says whether a newly attached owner's region is ready to serve (for
	// example, its persisted state restored). A Follower switches to a new owner only once
	// Ready returns true, retrying with backoff and reading the old region meanwhile; Follow
	// itself waits for it up to Client.Timeout. nil: ready as soon as attached.
	Ready func(c *Client) bool
	// OnChange, if set, is called (from the follower's goroutine) after each re-attach with
	// the new client and the generation (1 for the first attach).
	OnChange func(c *Client, generation uint64)
}

// Follower holds an attached Client and, when the owner dies, keeps serving reads from the old
// region (flagged dead) while it re-attaches to a new owner of the namespace with backoff. From
// then on Client returns the new client. Readers take Client() once per unit of work (a step)
// and use that client throughout: a replaced client stays mapped for Retire, so a read in
// flight is never torn or unmapped. Safe for concurrent use.
type Follower struct {
	opts   FollowOptions
	secret Secret

	cur   atomic.Pointer[Client]
	gen   atomic.Uint64
	dead  atomic.Bool
	since atomic.Int64 // unix nanos when the current client was found dead

	mu      sync.Mutex
	closed  bool
	retired []*Client
	done    chan struct{}
	wg      sync.WaitGroup
}

// Follow attaches (as Attach) and starts following. It fails as Attach does if no owner
// answers now.
func Follow(opts FollowOptions) (*Follower, error) {
	secret, err := resolveSecret(opts.Client.Secret, opts.Client.SecretFile, opts.Client.DropEnv)
	if err != nil {
		return nil, err
	}
	if opts.Poll <= 0 {
		opts.Poll = 100 * time.Millisecond
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 10 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = time.Second
	}
	if opts.Retire <= 0 {
		opts.Retire = 10 * time.Second
	}
	f := &Follower{opts: opts, secret: secret, done: make(chan struct{})}
	timeout := opts.Client.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	var c *Client
	for backoff := opts.MinBackoff; ; backoff = min(2*backoff, opts.MaxBackoff) {
		c, err = f.attach()
		if err != nil {
			f.secret.wipe()
			return nil, err
		}
		if f.ready(c) {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			f.secret.wipe()
			return nil, fmt.Errorf("%w: the owner's region did not become ready in %v", ErrTimeout, timeout)
		}
		time.Sleep(backoff)
	}
	f.cur.Store(c)
	f.gen.Store(1)
	f.wg.Add(1)
	go f.run()
	return f, nil
}

func (f *Follower) ready(c *Client) bool { return f.opts.Ready == nil || f.opts.Ready(c) }

func (f *Follower) attach() (*Client, error) {
	o := f.opts.Client
	o.Secret, o.SecretFile = &f.secret, "" // resolved once: a rotated file does not split a deployment
	o.DropEnv = false
	return Attach(o)
}

// Client is the current client: the live owner's, or the dead owner's until a new one is
// found (then Err is ErrDeadRegion).
func (f *Follower) Client() *Client { return f.cur.Load() }

// Generation counts attaches: 1 after Follow, +1 at each re-attach.
func (f *Follower) Generation() uint64 { return f.gen.Load() }

// Dead reports whether the current client's owner is known to be gone.
func (f *Follower) Dead() bool { return f.dead.Load() }

// Err is nil while the current owner serves, and wraps ErrDeadRegion (saying for how long)
// while reads come from a dead owner's region.
func (f *Follower) Err() error {
	if !f.dead.Load() {
		return nil
	}
	return fmt.Errorf("%w (for %v)", ErrDeadRegion, time.Since(time.Unix(0, f.since.Load())).Round(time.Millisecond))
}

// Close stops following and closes the current and retired clients.
func (f *Follower) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return ErrClosed
	}
	f.closed = true
	f.mu.Unlock()
	close(f.done)
	f.wg.Wait()
	err := f.cur.Load().Close()
	f.mu.Lock()
	for _, c := range f.retired {
		c.Close() // a retired client's error says only that its owner is gone
	}
	f.retired = nil
	f.mu.Unlock()
	f.secret.wipe()
	return err
}

// ownerGone reports whether c's owner is gone: its RPC stream closed, or its process exited.
func ownerGone(c *Client) bool {
	err := c.Ping()
	if err == nil || errors.Is(err, ErrTimeout) {
		// A busy owner is not a dead one; but a timed-out ping of an exited process is.
		return err != nil && !processAlive(c.OwnerPID())
	}
	return errors.Is(err, ErrOwnerGone) || errors.Is(err, ErrProtocol) || errors.Is(err, ErrClosed)
}

func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	return err == nil && p.Signal(syscall.Signal(0)) == nil
}

func (f *Follower) sleep(d time.Duration) bool {
	select {
	case <-f.done:
		return false
	case <-time.After(d):
		return true
	}
}

func (f *Follower) run() {
	defer f.wg.Done()
	for f.sleep(f.opts.Poll) {
		if !ownerGone(f.cur.Load()) {
			continue
		}
		f.since.Store(time.Now().UnixNano())
		f.dead.Store(true)
		backoff := f.opts.MinBackoff
		for {
			c, err := f.attach()
			if err == nil && !f.ready(c) {
				c.Close()
				err = ErrNotYetInitialized
			}
			if err == nil {
				old := f.cur.Swap(c)
				f.mu.Lock()
				f.retired = append(f.retired, old)
				f.mu.Unlock()
				go f.retireLater(old)
				g := f.gen.Add(1)
				f.dead.Store(false)
				if f.opts.OnChange != nil {
					f.opts.OnChange(c, g)
				}
				break
			}
			if !f.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, f.opts.MaxBackoff)
		}
	}
}

// retireLater closes a replaced client after Retire.
func (f *Follower) retireLater(c *Client) {
	select {
	case <-f.done:
		return // Close closes it
	case <-time.After(f.opts.Retire):
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, r := range f.retired {
		if r == c {
			// A reader still inside a read section makes Close return shm.ErrBusy and leave
			// the mapping in place: nothing faults, the memory goes with the process.
			c.Close()
			f.retired = append(f.retired[:i], f.retired[i+1:]...)
			return
		}
	}
}
