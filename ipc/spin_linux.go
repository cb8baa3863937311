package ipc

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultSpinWait is how long a client waits for a reply, and the owner for a connection's
// next request, by polling the socket before parking in the netpoller, when
// ClientOptions.SpinWait or OwnerOptions.SpinWait is 0. See the package documentation for the
// trade-off.
const DefaultSpinWait = 50 * time.Microsecond

// spinBudget resolves a SpinWait option: 0 means DefaultSpinWait, a negative value no spin.
func spinBudget(d time.Duration) time.Duration {
	switch {
	case d == 0:
		return DefaultSpinWait
	case d < 0:
		return 0
	}
	return d
}

// spinConn reads a connection for a frameReader. Once armed (spinUntil), its next read polls
// the socket without parking, yielding the CPU between polls (sched_yield), until data
// arrives or the spin deadline passes, and only then parks in the netpoller like
// net.Conn.Read; the connection's read deadline applies throughout (a client arms the spin
// no later than its call's deadline). The spin is disarmed as soon as data arrives or it runs
// out, so one arming spins at most once, for at most its budget.
type spinConn struct {
	conn  *net.UnixConn
	rc    syscall.RawConn
	until time.Time // spin until then; zero: park at once
	// The read in progress, for readFd (a closure made once, so reads allocate nothing).
	b      []byte
	n      int
	err    error
	readFd func(fd uintptr) bool
}

func newSpinConn(c *net.UnixConn) (*spinConn, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &spinConn{conn: c, rc: rc}
	s.readFd = s.readOnce
	return s, nil
}

// spinUntil arms the next read to poll until t (a zero t disarms it).
func (s *spinConn) spinUntil(t time.Time) { s.until = t }

// readOnce is the RawConn.Read callback: it reads what is there (the descriptor is
// non-blocking under the netpoller) and reports false, to park, only when nothing is there
// and the spin is over.
func (s *spinConn) readOnce(fd uintptr) bool {
	for {
		n, err := unix.Read(int(fd), s.b)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if !s.until.IsZero() && time.Now().Before(s.until) {
				// Give the CPU to any thread waiting for it, the peer perhaps: a busy
				// poll that does not yield was measured slower than no spin at all on a
				// 2-core machine (see the package documentation).
				unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
				continue
			}
			s.until = time.Time{}
			return false
		}
		s.until = time.Time{}
		s.n, s.err = max(n, 0), err
		return true
	}
}

// read has net.Conn.Read's results: io.EOF at the end of the stream, a deadline error that
// matches os.ErrDeadlineExceeded.
func (s *spinConn) read(b []byte) (int, error) {
	if s.until.IsZero() || len(b) == 0 {
		return s.conn.Read(b)
	}
	s.b = b
	err := s.rc.Read(s.readFd)
	n, rerr := s.n, s.err
	s.b, s.n, s.err = nil, 0, nil
	switch {
	case err != nil: // deadline passed or connection closed while parked
		return 0, err
	case rerr != nil:
		return 0, os.NewSyscallError("read", rerr)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}
