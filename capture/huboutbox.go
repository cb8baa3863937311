//go:build linux

package capture

import (
	"errors"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// A consumer's notices never make the hub's caller wait on the consumer's socket (an
// admission's Begin, a request's End, a worker's ring registration):
//
//   - A begin must be in the consumer's socket before the request's records can be in a ring
//     (the consumer skips records of requests it has not heard of), so it is written whole
//     before Begin returns, or not at all. A begin larger than the socket's free space (a large
//     spec: up to steer.MaxCaptureSpec) is written as the consumer reads it, within the write
//     timeout (a consumer that takes part of it and then stops reading is disconnected); a
//     socket with no room at all gets beginGrace to make some, once: a consumer whose socket
//     stays full (it does not read its notices) or that has notices queued is not told of the
//     request, whose result for it is error at once ("behind on its notices"), counted in
//     ConsumerStatus.BeginsDropped, and later begins do not wait for it until a write to it
//     succeeds again.
//   - The other notices (an end, a ring, a ring gone) go into a bounded queue of the
//     consumer's own (HubOptions.MaxQueued, MaxQueuedBytes) when they cannot be written at
//     once, and one goroutine per consumer writes them in order, each within the write
//     timeout. A consumer whose queue is full, or that does not take a notice in time, is
//     disconnected, counted in ConsumerStatus.Disconnects: its pending requests end with
//     status error and it may attach again. An end is never dropped alone, which would leave
//     its request pending forever.
//
// While a consumer attaches, its handshake (welcome, the rings) and the notices meanwhile are
// queued and written in order, then synced, so everything it was told of precedes synced.

// Default bounds of a consumer's notice queue (HubOptions.MaxQueued, MaxQueuedBytes).
const (
	DefaultMaxQueued      = 4096
	DefaultMaxQueuedBytes = 64 << 20
)

type outMsg struct {
	msg []byte
	fds []int // duplicated for the queue, closed once sent or dropped
}

// outbox is one consumer connection's queue of notices.
type outbox struct {
	mu     sync.Mutex
	q      []outMsg
	bytes  int
	busy   bool // the writer holds notices taken from q (or has not started)
	synced bool // the handshake's synced is on its way: notices may go straight to the socket
	closed bool
	wake   chan struct{} // capacity 1
	// sending: a begin is being written outside o.mu (sendBegin); notices meanwhile queue and
	// the writer waits. sent is closed when it is done. stalled: the last begin found no room
	// within beginGrace, so the next does not wait.
	sending bool
	sent    chan struct{}
	stalled bool
}

// beginGrace is how long a begin waits for room in a consumer's full socket (once: not again
// until a write to it succeeds).
const beginGrace = 100 * time.Millisecond

func newOutbox() outbox { return outbox{wake: make(chan struct{}, 1), busy: true} }

func closeFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func dupFds(fds []int) ([]int, error) {
	var own []int
	for _, fd := range fds {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			closeFds(own)
			return nil, err
		}
		own = append(own, d)
	}
	return own, nil
}

// push queues a notice with no bound (the handshake's, h.mu held).
func (o *outbox) push(msg []byte, fds []int) error {
	own, err := dupFds(fds)
	if err != nil {
		return err
	}
	o.mu.Lock()
	o.q = append(o.q, outMsg{msg, own})
	o.bytes += len(msg)
	o.mu.Unlock()
	return nil
}

func (o *outbox) signal() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// notify tells the consumer a notice and returns at once: written now when the socket takes
// it whole and nothing is queued before it, else queued (a begin: sendBegin, or dropped when
// notices are queued before it). It reports whether
// the consumer will get it.
func (hc *hubConn) notify(h *Hub, msg []byte, fds []int, begin bool) bool {
	o := &hc.out
	o.mu.Lock()
	if begin {
		hc.awaitTurn(h)
	}
	if o.closed {
		o.mu.Unlock()
		return false
	}
	if begin && o.synced && !o.busy && !o.sending && len(o.q) == 0 {
		return hc.sendBegin(h, msg) // unlocks o.mu
	}
	if o.synced && !o.busy && !o.sending && len(o.q) == 0 {
		n, err := hc.trySend(msg, fds)
		switch {
		case err != nil:
			o.mu.Unlock()
			h.disconnect(hc, "its connection failed: "+err.Error())
			return false
		case n == len(msg):
			o.stalled = false
			o.mu.Unlock()
			return true
		case n > 0:
			// Part of it is in the stream: the rest goes first (its descriptors went along).
			o.q = append(o.q, outMsg{msg: msg[n:]})
			o.bytes += len(msg) - n
			o.mu.Unlock()
			o.signal()
			return true
		}
	}
	if begin && o.synced {
		o.stalled = true // later begins do not wait for it until a write to it succeeds
		o.mu.Unlock()
		h.countBeginDropped(hc)
		return false
	}
	if len(o.q) >= h.maxQueued || o.bytes+len(msg) > h.maxQueuedBytes {
		o.mu.Unlock()
		h.disconnect(hc, "its notice queue is full: it does not read its notices")
		return false
	}
	own, err := dupFds(fds)
	if err != nil {
		o.mu.Unlock()
		h.disconnect(hc, "its notice's descriptor could not be duplicated: "+err.Error())
		return false
	}
	o.q = append(o.q, outMsg{msg, own})
	o.bytes += len(msg)
	o.mu.Unlock()
	o.signal()
	return true
}

// awaitTurn waits (o.mu held, released meanwhile) until a begin may go straight to the
// socket: for a begin being written (sendBegin: one at a time; a consumer that reads takes a
// large one within the write timeout), and, unless the consumer stalled, up to beginGrace for
// the notices queued before it to be written (a begin cannot queue behind them).
func (hc *hubConn) awaitTurn(h *Hub) {
	o := &hc.out
	start := time.Now()
	for !o.closed {
		switch now := time.Now(); {
		case o.sending && now.Sub(start) < h.wtimeout:
			sent := o.sent
			o.mu.Unlock()
			t := time.NewTimer(h.wtimeout - now.Sub(start))
			select {
			case <-sent:
			case <-t.C:
			}
			t.Stop()
			o.mu.Lock()
		case o.synced && !o.sending && !o.stalled && (o.busy || len(o.q) > 0) && now.Sub(start) < beginGrace:
			o.mu.Unlock()
			time.Sleep(200 * time.Microsecond)
			o.mu.Lock()
		default:
			return
		}
	}
}

// sendBegin writes a begin notice whole or not at all (o.mu held on entry, released): at once
// when the socket has room; else, unless the consumer stalled before, it waits up to beginGrace
// for room; the rest of a begin the socket took only part of (it is larger than the socket's
// free space) within the write timeout. Notices meanwhile queue behind it. It reports whether
// the consumer will get it.
func (hc *hubConn) sendBegin(h *Hub, msg []byte) bool {
	o := &hc.out
	o.sending, o.sent = true, make(chan struct{})
	grace := !o.stalled
	o.mu.Unlock()
	n, err := hc.trySend(msg, nil)
	if err == nil && n == 0 && grace {
		n, err = hc.sendSome(msg, min(beginGrace, h.wtimeout))
	}
	if err == nil && n > 0 && n < len(msg) {
		err = hc.send(h.wtimeout, msg[n:], nil)
	}
	o.mu.Lock()
	o.sending = false
	close(o.sent)
	o.stalled = n == 0 && err == nil
	o.mu.Unlock()
	o.signal() // the writer: notices queued meanwhile
	switch {
	case err != nil:
		h.disconnect(hc, "it does not read its notices: a begin notice: "+err.Error())
		return false
	case n == 0:
		h.countBeginDropped(hc)
		return false
	}
	return true
}

// sendSome writes part of msg, waiting up to d for the socket to take any of it: the bytes it
// took (0 when none within d).
func (hc *hubConn) sendSome(msg []byte, d time.Duration) (int, error) {
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	hc.c.SetWriteDeadline(time.Now().Add(d))
	n, _, err := hc.c.WriteMsgUnix(msg, nil, nil)
	if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, nil
	}
	if n > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		err = nil // the rest follows within the write timeout
	}
	return n, err
}

// trySend writes msg (with fds) once, without waiting: the bytes the socket took (0 when it is
// full).
func (hc *hubConn) trySend(msg []byte, fds []int) (int, error) {
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	hc.c.SetWriteDeadline(time.Time{}) // the last send's deadline would refuse the try
	rc, err := hc.c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	var n int
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		n, serr = unix.SendmsgN(int(fd), msg, oob, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
		return true // one try: never wait for room
	}); err != nil {
		return 0, err
	}
	if errors.Is(serr, unix.EAGAIN) {
		return 0, nil
	}
	return max(n, 0), serr
}

// queued is the number of notices waiting in the queue.
func (o *outbox) queued() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.q)
}

// close ends the queue: what is queued is dropped (its descriptors closed) and the writer
// returns.
func (o *outbox) close() {
	o.mu.Lock()
	q := o.q
	o.q, o.bytes, o.closed = nil, 0, true
	o.mu.Unlock()
	for _, m := range q {
		closeFds(m.fds)
	}
	o.signal()
}

// writeLoop writes a consumer's queued notices in order, each within the write timeout, the
// handshake's synced once the queue first runs empty, until the queue closes; a notice not
// taken in time disconnects the consumer.
func (h *Hub) writeLoop(hc *hubConn) {
	defer h.wg.Done()
	o := &hc.out
	fail := func(err error) {
		h.disconnect(hc, "it does not read its notices: "+err.Error())
		o.close()
	}
	for {
		o.mu.Lock()
		if o.closed {
			o.mu.Unlock()
			return
		}
		if o.sending { // a begin is being written: the queue goes after it (sendBegin wakes us)
			o.mu.Unlock()
			<-o.wake
			continue
		}
		q := o.q
		o.q, o.bytes = nil, 0
		if len(q) == 0 {
			if !o.synced {
				// The handshake's synced, at once when the socket takes it (then notices go
				// straight to the socket: no begin after it is dropped for the writer's sake);
				// else busy still while it is written, so a begin meanwhile is dropped (it
				// would follow synced, maybe after the request's records) and other notices
				// queue behind it.
				o.synced = true
				msg := encodeHubMsg(nil, hubMsg{typ: msgSynced})
				n, err := hc.trySend(msg, nil)
				if err == nil && n == len(msg) {
					o.busy = false
					o.mu.Unlock()
					continue
				}
				o.mu.Unlock()
				if err == nil {
					err = hc.send(h.wtimeout, msg[n:], nil)
				}
				if err != nil {
					fail(err)
					return
				}
				continue
			}
			o.busy = false
			o.mu.Unlock()
			<-o.wake
			continue
		}
		o.busy = true
		o.mu.Unlock()
		for i, m := range q {
			err := hc.send(h.wtimeout, m.msg, m.fds)
			closeFds(m.fds)
			q[i] = outMsg{}
			if err != nil {
				for _, r := range q[i+1:] {
					closeFds(r.fds)
				}
				fail(err)
				return
			}
		}
		o.mu.Lock()
		o.stalled = false // it reads again: a begin may wait for room
		o.mu.Unlock()
	}
}

// disconnect drops a consumer that does not take its notices, counted per name: its
// connection closes, and its read loop then ends its requests (drop).
func (h *Hub) disconnect(hc *hubConn, why string) {
	h.mu.Lock()
	first := !hc.kicked
	hc.kicked = true
	if first {
		h.disconnects[hc.name]++
	}
	h.mu.Unlock()
	if first {
		h.log.Warn("shmsteer: dropping capture consumer: "+why, "consumer", hc.name, "pid", hc.pid)
	}
	hc.c.Close()
}

// countBeginDropped counts a begin the consumer was not told of.
func (h *Hub) countBeginDropped(hc *hubConn) {
	h.mu.Lock()
	h.beginsDropped[hc.name]++
	h.mu.Unlock()
}
