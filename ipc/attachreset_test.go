package ipc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fakeOwnerPair is a connected pair: the client's end as a *net.UnixConn and the owner's end
// as a raw descriptor, so the owner can stop at any byte and close with or without unread
// data (with unread data the kernel resets the client's end: ECONNRESET).
func fakeOwnerPair(t *testing.T) (*net.UnixConn, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fds[0]), "client-end")
	nc, err := net.FileConn(f)
	f.Close()
	require.NoError(t, err)
	return nc.(*net.UnixConn), fds[1]
}

// peekFrame waits for a whole frame on fd and returns it without consuming it (MSG_PEEK), so
// it is still unread when the owner closes.
func peekFrame(fd int, skip int) ([]byte, error) {
	buf := make([]byte, 4096)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(fd, buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if err != nil && !errors.Is(err, unix.EAGAIN) {
			return nil, err
		}
		if n > skip {
			if f, m, err := decodeFrame(buf[skip:n], handshakeMaxFrame); err != nil {
				return nil, err
			} else if m > 0 {
				return f.payload, nil
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
	return nil, errors.New("no frame from the client")
}

// TestAttachResetAtEveryByte: an owner that goes away after any number of bytes of its side of
// the handshake (challenge, then welcome with the region's descriptors), by a plain close (the
// client reads EOF) or a reset (it closes with the client's bytes unread: ECONNRESET, which
// recvmsg reports as n = -1), gives the client ErrOwnerGone: never a panic, never
// ErrAuthFailed.
func TestAttachResetAtEveryByte(t *testing.T) {
	env := newTestEnv()
	region, err := shm.Create(testRegion)
	require.NoError(t, err)
	defer region.Close()
	data, readers := region.Files()
	w := welcome{regionID: region.ID(), ownerPID: uint32(os.Getpid()), maxFrame: DefaultMaxFrameBytes}
	welcomeFrame := appendFrame(nil, opWelcome, 0, w.encode())
	challengeLen := len(appendFrame(nil, opChallenge, 0, make([]byte, 1+nonceLen+macLen)))
	total := challengeLen + len(welcomeFrame)
	helloLen := len(appendFrame(nil, opHello, 0, encodeHello(make([]byte, nonceLen))))

	panics, wrong := 0, 0
	for cut := 0; cut < total; cut++ {
		for _, reset := range []bool{false, true} {
			conn, ofd := fakeOwnerPair(t)
			ownerDone := make(chan error, 1)
			go func() {
				ownerDone <- func() error {
					defer unix.Close(ofd)
					hello, err := peekFrame(ofd, 0)
					if err != nil {
						return err
					}
					cn, err := decodeHello(hello)
					if err != nil {
						return err
					}
					var on [nonceLen]byte
					ch := appendFrame(nil, opChallenge, 0, encodeChallenge(on[:], proof(env.secret, ownerProofLabel, env.ns, cn, on[:])))
					if _, err := unix.Write(ofd, ch[:min(cut, len(ch))]); err != nil {
						return err
					}
					if cut >= len(ch) {
						if _, err := peekFrame(ofd, helloLen); err != nil { // the client's proof
							return err
						}
					}
					if cut > len(ch) {
						if err := unix.Sendmsg(ofd, welcomeFrame[:cut-len(ch)], unix.UnixRights(int(data.Fd()), int(readers.Fd())), nil, 0); err != nil {
							return err
						}
					}
					if !reset { // consume what the client sent: a plain close, EOF
						buf := make([]byte, 4096)
						for {
							if n, _, err := unix.Recvfrom(ofd, buf, unix.MSG_DONTWAIT); n <= 0 || err != nil {
								break
							}
						}
					}
					return nil
				}()
			}()
			c := &Client{conn: conn}
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			herr := func() (err error) {
				defer func() {
					if p := recover(); p != nil {
						panics++
						err = fmt.Errorf("panic: %v", p)
					}
				}()
				_, err = c.handshake(env.secret, env.ns)
				return err
			}()
			require.NoError(t, <-ownerDone)
			c.fr.wipe()
			conn.Close()
			if c.region != nil {
				c.region.Close()
			}
			if !errors.Is(herr, ErrOwnerGone) || errors.Is(herr, ErrAuthFailed) {
				wrong++
				if wrong <= 5 {
					t.Errorf("cut at byte %d of %d (reset %v): %v", cut, total, reset, herr)
				}
			}
		}
	}
	require.Zero(t, panics, "panics in %d cut points", 2*total)
	require.Zero(t, wrong, "errors other than ErrOwnerGone in %d cut points", 2*total)
}
