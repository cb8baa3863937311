//go:build linux

package capture

import (
	"fmt"
	"io"
	"net"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// The hub's connections: reading messages and descriptors, writing one whole.

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, cerr
}

// send writes one message (with fds) within timeout, whole.
func (hc *hubConn) send(timeout time.Duration, msg []byte, fds []int) error {
	hc.wmu.Lock()
	defer hc.wmu.Unlock()
	hc.c.SetWriteDeadline(time.Now().Add(timeout))
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := hc.c.WriteMsgUnix(msg, oob, nil)
	if err == nil && n < len(msg) {
		// A stream socket took part of it (its buffer filled): the rest, within the same
		// deadline (the descriptors went with the first byte).
		_, err = hc.c.Write(msg[n:])
	}
	return err
}

// msgReader reads hub messages from a connection, keeping the descriptors that arrive.
type msgReader struct {
	c   *net.UnixConn
	buf []byte
	fds []int
}

func (rd *msgReader) next() (hubMsg, error) {
	for {
		m, n, err := decodeHubMsg(rd.buf)
		if err != nil {
			return hubMsg{}, err
		}
		if n > 0 {
			m = cloneMsg(m)
			rd.buf = rd.buf[:copy(rd.buf, rd.buf[n:])]
			return m, nil
		}
		var b [64 << 10]byte
		oob := make([]byte, unix.CmsgSpace(4*8))
		k, oobn, _, _, err := rd.c.ReadMsgUnix(b[:], oob)
		if oobn > 0 {
			fds, perr := parseFds(oob[:oobn])
			rd.fds = append(rd.fds, fds...)
			if perr != nil {
				return hubMsg{}, perr
			}
		}
		if k > 0 {
			rd.buf = append(rd.buf, b[:k]...)
			continue
		}
		if err == nil {
			err = io.EOF
		}
		return hubMsg{}, err
	}
}

func (rd *msgReader) takeFd() (int, bool) {
	if len(rd.fds) == 0 {
		return -1, false
	}
	fd := rd.fds[0]
	rd.fds = rd.fds[1:]
	return fd, true
}

func (rd *msgReader) closeFds() {
	for _, fd := range rd.fds {
		unix.Close(fd)
	}
	rd.fds = nil
}

// cloneMsg copies the fields that alias the read buffer.
func cloneMsg(m hubMsg) hubMsg {
	m.ticket = slices.Clone(m.ticket)
	m.spec = slices.Clone(m.spec)
	return m
}

// parseFds extracts SCM_RIGHTS descriptors, marking them close-on-exec.
func parseFds(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %v", ErrHubProtocol, err)
	}
	var out []int
	for i := range msgs {
		fds, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range fds {
			unix.CloseOnExec(fd)
		}
		out = append(out, fds...)
	}
	return out, nil
}

// ticketReply decodes an OpCaptureTicket reply: the hub's socket name and the ticket.
func ticketReply(b []byte) (string, []byte, error) {
	if len(b) < 1 || len(b) != 1+int(b[0])+ticketLen {
		return "", nil, fmt.Errorf("%w: ticket reply of %d bytes", ErrHubProtocol, len(b))
	}
	return string(b[1 : 1+int(b[0])]), b[1+int(b[0]):], nil
}
