//go:build linux

package capture

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/steer"
	"golang.org/x/sys/unix"
)

// WorkerOptions configure RegisterWorker.
type WorkerOptions struct {
	// Capacity is the ring's data bytes; 0 means 64 MiB. A record (one site of one request in
	// one step) may take at most half of it.
	Capacity uint64
	// Slots is the most consumers that can read the ring at once; 0 means MaxRingSlots.
	Slots int
	// Wait bounds how long one append waits for a Block consumer that lags (each consumer may
	// set a shorter bound): a step never waits longer per record. 0 means 10 ms.
	Wait time.Duration
}

// Worker is a worker's capture ring, registered with the owner's hub: every consumer that
// attaches (now or later) receives it.
type Worker struct {
	ring *Ring
	w    *RingWriter
	conn *hubLink
}

// RegisterWorker creates the worker's ring and hands its memfd to the owner's hub over c (the
// worker's ipc.Client): ErrNoHub when the owner serves no capture. It returns once every
// consumer attached at the time reads the ring (or the hub's bound passed), so what the
// worker captures from then on reaches them. Close it when the worker
// stops (the hub also notices the worker's exit and tells consumers its ring is gone).
func RegisterWorker(c steer.Caller, opts WorkerOptions) (*Worker, error) {
	if opts.Capacity == 0 {
		opts.Capacity = 64 << 20
	}
	if opts.Slots == 0 {
		opts.Slots = MaxRingSlots
	}
	if opts.Wait == 0 {
		opts.Wait = 10 * time.Millisecond
	}
	r, err := CreateRing(opts.Capacity, opts.Slots)
	if err != nil {
		return nil, err
	}
	link, err := dialHub(c, roleWorker, "")
	if err != nil {
		r.Close()
		return nil, err
	}
	if err := link.send(encodeHubMsg(nil, hubMsg{typ: msgRing}), []int{r.Fd()}); err != nil {
		link.close()
		r.Close()
		return nil, err
	}
	// The hub says synced once the consumers attached now read the ring (bounded by the hub).
	if m, err := link.recv(2 * ringSyncWait); err != nil || m.typ != msgSynced {
		link.close()
		r.Close()
		switch {
		case err != nil:
		case m.typ == msgRefused:
			err = fmt.Errorf("%w: the owner's hub refused the ring: %s", ErrRingLayout, strings.TrimPrefix(m.message, "shmsteer: "))
		default:
			err = fmt.Errorf("%w: no ring acknowledgement from the hub (message type %d)", ErrHubGone, m.typ)
		}
		return nil, err
	}
	return &Worker{ring: r, w: r.Writer(opts.Wait), conn: link}, nil
}

// Ring is the worker's ring.
func (w *Worker) Ring() *Ring { return w.ring }

// Writer is the ring's single writer (the hooks' sink appends through it).
func (w *Worker) Writer() *RingWriter { return w.w }

// Close leaves the hub (consumers are told the ring is gone) and unmaps the ring.
func (w *Worker) Close() error {
	w.conn.close()
	return w.ring.Close()
}

// hubLink is a client's capture connection (a raw socket: reads never block unless asked).
type hubLink struct {
	fd  int
	buf []byte
	fds []int
}

// dialHub gets a ticket over c and opens the capture connection with it.
func dialHub(c steer.Caller, role byte, name string) (*hubLink, error) {
	reply, err := c.Call(uint16(proto.OpCaptureTicket), append([]byte{role}, name...))
	if err != nil {
		if isUnknownOp(err) {
			return nil, fmt.Errorf("%w: the owner has no capture hub (declare a capture consumer in the owner)", ErrNoHub)
		}
		return nil, err
	}
	sock, t, err := ticketReply(reply)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: socket: %v", ErrHubGone, err)
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + sock}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: connect: %v", ErrHubGone, err)
	}
	l := &hubLink{fd: fd}
	// The hub must be the owner's: a listener of our uid (or root).
	cred, err := unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
	if err != nil || (int(cred.Uid) != unix.Getuid() && cred.Uid != 0) {
		l.close()
		return nil, fmt.Errorf("%w: the capture socket's listener is not of this uid", ErrHubGone)
	}
	tv := unix.NsecToTimeval(int64(5 * time.Second))
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := l.send(encodeHubMsg(nil, hubMsg{typ: msgHello, role: role, ticket: t}), nil); err != nil {
		l.close()
		return nil, err
	}
	m, err := l.recv(5 * time.Second)
	if err != nil {
		l.close()
		return nil, err
	}
	switch m.typ {
	case msgWelcome:
		return l, nil
	case msgRefused:
		l.close()
		return nil, fmt.Errorf("%w: %s", ErrHubGone, m.message)
	}
	l.close()
	return nil, fmt.Errorf("%w: message type %d before welcome", ErrHubProtocol, m.typ)
}

func (l *hubLink) send(msg []byte, fds []int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for len(msg) > 0 {
		n, err := unix.SendmsgN(l.fd, msg, oob, nil, unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrHubGone, err)
		}
		msg, oob = msg[n:], nil
	}
	return nil
}

// recv returns the next message, waiting at most wait (0: not at all; it then returns
// typ 0 when none is whole yet).
func (l *hubLink) recv(wait time.Duration) (hubMsg, error) {
	deadline := time.Now().Add(wait)
	for {
		m, n, err := decodeHubMsg(l.buf)
		if err != nil {
			return hubMsg{}, err
		}
		if n > 0 {
			m = cloneMsg(m)
			l.buf = l.buf[:copy(l.buf, l.buf[n:])]
			return m, nil
		}
		var b [64 << 10]byte
		oob := make([]byte, unix.CmsgSpace(4*8))
		k, oobn, _, _, err := unix.Recvmsg(l.fd, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if oobn > 0 {
			fds, perr := parseFds(oob[:oobn])
			l.fds = append(l.fds, fds...)
			if perr != nil {
				return hubMsg{}, perr
			}
		}
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			left := time.Until(deadline)
			if left <= 0 {
				return hubMsg{}, nil
			}
			pfd := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLIN}}
			unix.Poll(pfd, int(min(left, time.Second)/time.Millisecond)+1)
			continue
		case err != nil:
			return hubMsg{}, fmt.Errorf("%w: %v", ErrHubGone, err)
		case k == 0:
			return hubMsg{}, fmt.Errorf("%w: the connection closed", ErrHubGone)
		}
		l.buf = append(l.buf, b[:k]...)
	}
}

func (l *hubLink) takeFd() (int, bool) {
	if len(l.fds) == 0 {
		return -1, false
	}
	fd := l.fds[0]
	l.fds = l.fds[1:]
	return fd, true
}

func (l *hubLink) close() {
	for _, fd := range l.fds {
		unix.Close(fd)
	}
	l.fds = nil
	if l.fd >= 0 {
		unix.Close(l.fd)
		l.fd = -1
	}
}

func isUnknownOp(err error) bool { return errors.Is(err, proto.ErrUnknownOp) }

// recvWait waits at most d for the connection to have bytes to read.
func (l *hubLink) recvWait(d time.Duration) {
	pfd := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLIN}}
	ms := int(d / time.Millisecond)
	if ms < 1 {
		ms = 1
	}
	unix.Poll(pfd, ms)
}

func closeFd(fd int) { unix.Close(fd) }

// Sink is the steer.CaptureSink the worker's Stepper captures into (CaptureOptions.Sink).
func (w *Worker) Sink() *RingSink { return NewRingSink(w.w) }
