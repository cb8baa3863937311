package ipc

import (
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds an attach and each RPC when ClientOptions.Timeout is 0.
const DefaultTimeout = 5 * time.Second

// ClientOptions configures Attach.
type ClientOptions struct {
	// Secret proves this process to the owner and finds its handle. Without it (and without
	// SecretFile) the secret comes from SHMSTEER_SECRET_FILE or SHMSTEER_SECRET.
	Secret *Secret
	// SecretFile names a file holding the secret (see SecretFromFile). Setting both Secret and
	// SecretFile is ErrSecretConflict; either wins over the environment.
	SecretFile string
	// NonDumpable makes this process non-dumpable (prctl PR_SET_DUMPABLE 0) before the secret
	// is read; see OwnerOptions.NonDumpable.
	NonDumpable bool
	// Namespace must match the owner's.
	Namespace string
	// OwnerUIDs lists the uids, besides this process's own, whose listeners this client
	// accepts as the owner. Before it sends a byte, a client reads the listener's uid
	// (SO_PEERCRED) and skips a listener of any other uid: abstract socket names have no
	// permissions, so anyone can bind one (see the package documentation, Squatting).
	OwnerUIDs []int
	// Timeout bounds the attach and each RPC; 0 means DefaultTimeout (5 s).
	Timeout time.Duration
	// DropEnv unsets SHMSTEER_SECRET once the secret is resolved.
	DropEnv bool
	// SpinWait is how long an RPC polls the socket for the owner's reply before parking in
	// the netpoller (within Timeout): it saves the cross-process wakeup of a prompt reply at
	// the cost of up to SpinWait of CPU per RPC. 0 means DefaultSpinWait; a negative value
	// turns spinning off.
	SpinWait time.Duration

	// handle overrides the derived handle name (tests: an impostor that knows where the
	// owner listens but not its secret).
	handle string
}

// Client is an attached process: it reads the region straight from its mapping and sends
// writes to the owner over the attach socket. Its methods are safe for concurrent use; RPCs
// from several goroutines are sent one at a time.
type Client struct {
	ns       string
	region   *shm.Region
	timeout  time.Duration
	spin     time.Duration
	maxFrame int
	ownerPID int

	mu     sync.Mutex // one RPC in flight; guards everything below
	conn   *net.UnixConn
	sc     *spinConn
	read   func([]byte) (int, error) // sc.read
	fr     frameReader
	wbuf   []byte
	nextID uint32
	gone   error // set once the owner is gone or the stream is unusable
	closed bool
}

// Attach finds the owner through the handle derived from the secret and namespace, runs the
// mutual handshake, receives the region's file descriptors and maps the region (read-only).
// Errors: ErrAuthSecretNotDefined, ErrSecretFile, ErrSecretConflict, ErrNotYetInitialized
// (no owner of an accepted uid answers; see OwnerUIDs), ErrAuthFailed (a proof does not
// match, or the owner refuses this uid), ErrOwnerGone (the owner closed or reset the
// connection mid-handshake without a reason: it exited; retry), ErrIncompatible, ErrTimeout.
func Attach(opts ClientOptions) (*Client, error) {
	if opts.NonDumpable {
		if err := setNonDumpable(); err != nil {
			return nil, err
		}
	}
	secret, err := resolveSecret(opts.Secret, opts.SecretFile, opts.DropEnv)
	if err != nil {
		return nil, err
	}
	defer secret.wipe() // a client needs the secret only for the handshake
	timeout := opts.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	deadline := time.Now().Add(timeout)
	allowed := func(uid int) bool { return uidIn(uid, opts.OwnerUIDs) }
	names := []string{opts.handle}
	if opts.handle == "" {
		names = handleNames(secret, opts.Namespace)
	}
	conn, skipped, err := dialFirstAllowed(names, allowed, deadline)
	// next tries more names while no allowed listener answered.
	next := func(more func() []string) {
		if err == nil && conn == nil && opts.handle == "" {
			var s []listener
			conn, s, err = dialFirstAllowed(more(), allowed, deadline)
			skipped = append(skipped, s...)
		}
	}
	// An owner whose candidates other users hold serves on a fresh name (see the package
	// documentation, Squatting).
	next(func() []string { return freshHandles(secret, opts.Namespace, allowed) })
	// No owner at our handle. If one serves the namespace under another secret, its lobby
	// answers and the handshake below fails with ErrAuthFailed, which says what is wrong.
	next(func() []string { return lobbyNames(opts.Namespace) })
	next(func() []string { return freshLobbies(opts.Namespace, allowed) })
	switch {
	case err != nil:
		return nil, err
	case conn == nil && len(skipped) > 0:
		return nil, fmt.Errorf("%w (skipped listeners of uids this client does not accept, ClientOptions.OwnerUIDs: %s)", ErrNotYetInitialized, describeListeners(skipped))
	case conn == nil:
		return nil, ErrNotYetInitialized
	}
	c := &Client{conn: conn, timeout: timeout, ns: opts.Namespace}
	conn.SetDeadline(deadline)
	w, err := c.handshake(secret, opts.Namespace)
	if err != nil {
		c.fr.wipe()
		conn.Close()
		return nil, err
	}
	conn.SetDeadline(time.Time{})
	if c.sc, err = newSpinConn(conn); err != nil {
		c.fr.wipe()
		conn.Close()
		c.region.Close()
		return nil, fmt.Errorf("shmsteer: attach socket: %w", err)
	}
	c.read = c.sc.read
	c.spin = spinBudget(opts.SpinWait)
	c.maxFrame = int(w.maxFrame)
	c.ownerPID = int(w.ownerPID)
	return c, nil
}

// handshakeErr maps an I/O error during the handshake.
func handshakeErr(err error) error {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("%w: during the attach handshake", ErrTimeout)
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		// An owner that refuses a client says why (an error frame) before it closes: a
		// connection closed or reset without one means the owner exited, or dropped this attach
		// (for example as the oldest pending handshake). Retrying is the remedy, not the secret.
		return fmt.Errorf("%w: the owner closed the connection during the attach handshake (it exited or dropped this attach); retry the attach", ErrOwnerGone)
	case errors.Is(err, ErrFrameTooLarge):
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return err
}

// readHandshake reads one handshake frame and turns an error frame into its error.
func (c *Client) readHandshake(read func([]byte) (int, error), want uint16) ([]byte, error) {
	f, err := c.fr.next(read, handshakeMaxFrame)
	if err != nil {
		return nil, handshakeErr(err)
	}
	switch f.op {
	case want:
		return f.payload, nil
	case opError:
		code, msg, err := decodeError(f.payload)
		if err != nil {
			return nil, err
		}
		return nil, remoteError(code, msg)
	}
	return nil, fmt.Errorf("%w: expected handshake op %d, got %d", ErrProtocol, want, f.op)
}

func (c *Client) handshake(secret Secret, ns string) (welcome, error) {
	clientNonce := make([]byte, nonceLen)
	rand.Read(clientNonce)
	if _, err := c.conn.Write(appendFrame(nil, opHello, 0, encodeHello(clientNonce))); err != nil {
		// The owner may have answered with an error and closed before our hello went out:
		// its error frame is still there to read, and says more than the write's EPIPE.
		var re *RemoteError
		if _, rerr := c.readHandshake(c.conn.Read, opChallenge); errors.As(rerr, &re) {
			return welcome{}, rerr
		}
		return welcome{}, handshakeErr(err)
	}
	p, err := c.readHandshake(c.conn.Read, opChallenge)
	if err != nil {
		return welcome{}, err
	}
	on, ownerProof, err := decodeChallenge(p)
	if err != nil {
		return welcome{}, err
	}
	ownerNonce := append([]byte(nil), on...)
	want := proof(secret, ownerProofLabel, ns, clientNonce, ownerNonce)
	if !hmac.Equal(ownerProof, want[:]) {
		c.conn.Write(appendFrame(nil, opError, 0, appendError(nil, codeAuthFailed, "shmsteer: authentication failed: the owner's proof does not match this client's secret")))
		return welcome{}, fmt.Errorf("%w: the owner's proof does not match", ErrAuthFailed)
	}
	mine := proof(secret, clientProofLabel, ns, clientNonce, ownerNonce)
	if _, err := c.conn.Write(appendFrame(nil, opProof, 0, mine[:])); err != nil {
		return welcome{}, handshakeErr(err)
	}

	// The welcome carries the region's descriptors: read it with recvmsg and keep every
	// descriptor that arrives, to use or close.
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	oob := make([]byte, unix.CmsgSpace(4*4))
	var oobErr error
	read := func(b []byte) (int, error) {
		n, oobn, flags, _, err := c.conn.ReadMsgUnix(b, oob)
		if oobn > 0 {
			got, perr := parseRights(oob[:oobn])
			fds = append(fds, got...)
			if perr != nil && oobErr == nil {
				oobErr = perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 && oobErr == nil {
			oobErr = fmt.Errorf("%w: descriptors truncated", ErrProtocol)
		}
		if n < 0 { // a reset: recvmsg's -1, not a count
			n = 0
		}
		return n, err
	}
	if p, err = c.readHandshake(read, opWelcome); err != nil {
		return welcome{}, err
	}
	w, err := decodeWelcome(p)
	if err != nil {
		return welcome{}, err
	}
	if oobErr != nil {
		return welcome{}, oobErr
	}
	if len(fds) != 2 {
		return welcome{}, fmt.Errorf("%w: welcome carried %d descriptors, want 2", ErrProtocol, len(fds))
	}
	data, readers := os.NewFile(uintptr(fds[0]), "shmsteer-data"), os.NewFile(uintptr(fds[1]), "shmsteer-readers")
	fds = nil
	region, err := shm.Open(data, readers)
	data.Close()
	readers.Close()
	if err != nil {
		if errors.Is(err, shm.ErrIncompatible) {
			return welcome{}, fmt.Errorf("%w: %w", ErrIncompatible, err)
		}
		return welcome{}, err
	}
	if region.ID() != w.regionID {
		region.Close()
		return welcome{}, fmt.Errorf("%w: descriptors of another region", ErrProtocol)
	}
	c.region = region
	return w, nil
}

// parseRights extracts descriptors from control messages, marking them close-on-exec.
func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %w", ErrProtocol, err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		for _, fd := range got {
			unix.CloseOnExec(fd)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// Region is the mapped region, read-only in a client (writes give shm.ErrReadOnly). It stays
// readable after the owner is gone, showing the last state.
func (c *Client) Region() *shm.Region { return c.region }

// OwnerPID is the owner's process id.
func (c *Client) OwnerPID() int { return c.ownerPID }

// Call sends an extension RPC (op from MinUserOp to MaxUserOp, served by the owner's
// Owner.Handle) and returns the reply, which the caller owns. Errors: ErrOwnerGone,
// ErrTimeout, ErrFrameTooLarge, ErrUnknownOp, or the handler's error (errors.Is works for
// sentinels registered with RegisterError).
func (c *Client) Call(op uint16, req []byte) ([]byte, error) {
	if op < MinUserOp || op > MaxUserOp {
		return nil, fmt.Errorf("%w: op %d is outside [%d, %d]", ErrUnknownOp, op, MinUserOp, MaxUserOp)
	}
	var out []byte
	err := c.call(op, req, &out)
	return out, err
}

// Ping round-trips an empty RPC: nil while the owner serves.
func (c *Client) Ping() error { return c.call(opPing, nil, nil) }

// call sends one request with payload req and waits for its reply, which it copies into *out
// (a non-nil slice, empty for an empty reply) unless out is nil. Replies to earlier requests
// that timed out are skipped by id. The frame's bytes are zeroed once sent (they may hold a
// secret); req is the caller's.
func (c *Client) call(op uint16, req []byte, out *[]byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.gone != nil {
		return c.gone
	}
	defer c.fr.release() // a large reply's memory goes back now
	c.nextID++
	if c.nextID == 0 {
		c.nextID = 1
	}
	id := c.nextID
	c.wbuf = append(beginFrame(c.wbuf[:0], op, id), req...)
	defer func() {
		clear(c.wbuf)
		if cap(c.wbuf) > readerKeep {
			c.wbuf = nil
		}
	}()
	if len(c.wbuf) > c.maxFrame {
		return fmt.Errorf("%w: request of %d bytes, the owner takes at most %d", ErrFrameTooLarge, len(c.wbuf), c.maxFrame)
	}
	finishFrame(c.wbuf, 0)
	deadline := time.Now().Add(c.timeout)
	c.conn.SetDeadline(deadline)
	if n, err := c.conn.Write(c.wbuf); err != nil {
		if n > 0 { // a partial frame went out: the stream cannot be resynchronized
			c.gone = fmt.Errorf("%w: connection unusable after a partial write (%v); re-attach", ErrOwnerGone, err)
			// The owner may have dropped us with a reason (ErrBusy, ErrFrameTooLarge): it
			// is still there to read.
			c.conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if f, rerr := c.fr.next(c.conn.Read, c.maxFrame); rerr == nil && f.op == opReplyErr && f.id == id {
				if code, msg, derr := decodeError(f.payload); derr == nil {
					c.gone = fmt.Errorf("%w: the owner dropped the connection: %w", ErrOwnerGone, remoteError(code, msg))
				}
			}
			c.conn.Close()
			return c.gone
		}
		return c.ioErr(err)
	}
	if c.spin > 0 {
		// Poll for the reply before parking; never past the call's deadline.
		until := time.Now().Add(c.spin)
		if until.After(deadline) {
			until = deadline
		}
		c.sc.spinUntil(until)
	}
	for {
		f, err := c.fr.next(c.read, c.maxFrame)
		if err != nil {
			return c.ioErr(err)
		}
		if f.id != id {
			continue // the reply to a call that timed out
		}
		switch f.op {
		case opReplyOK:
			if out != nil {
				*out = append([]byte{}, f.payload...)
			}
			return nil
		case opReplyErr:
			code, msg, err := decodeError(f.payload)
			if err != nil {
				return err
			}
			return remoteError(code, msg)
		}
		c.gone = fmt.Errorf("%w: unexpected op %d from the owner; re-attach", ErrProtocol, f.op)
		c.conn.Close()
		return c.gone
	}
}

// ioErr maps an RPC I/O error; a closed stream marks the owner gone for good.
func (c *Client) ioErr(err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w: after %v", ErrTimeout, c.timeout)
	}
	if errors.Is(err, ErrProtocol) || errors.Is(err, ErrFrameTooLarge) {
		c.gone = fmt.Errorf("%w: %w", ErrOwnerGone, err)
	} else {
		c.gone = ErrOwnerGone
	}
	c.conn.Close()
	return c.gone
}

// Close detaches: it tells the owner (so it need not look for a dead process), releases this
// process's reader slots and unmaps the region.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.closed = true
	if c.gone == nil {
		c.conn.SetWriteDeadline(time.Now().Add(c.timeout))
		c.conn.Write(appendFrame(nil, opBye, 0, nil))
	}
	c.conn.Close()
	c.fr.wipe()
	return c.region.Close()
}

// setTimeout changes the RPC timeout (tests).
func (c *Client) setTimeout(d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.timeout = d
	return nil
}
