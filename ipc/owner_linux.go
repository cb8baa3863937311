package ipc

import (
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"golang.org/x/sys/unix"
)

const (
	// DefaultGrace is how long a removed key's revoked sentinel stands before it is purged.
	DefaultGrace = 60 * time.Second
	// DefaultMaxKeyBytes is the default bound on one key.
	DefaultMaxKeyBytes = 4096
	// handshakeTimeout bounds an attach on the owner's side.
	handshakeTimeout = 5 * time.Second
	// releaseWait is how long the owner waits for a disconnected client's process to exit
	// before giving up on freeing its reader slots (shm's reclamation still frees them once
	// the process is gone). The socket closes a moment before the process is reaped; the
	// bound is generous for loaded machines.
	releaseWait = time.Second
)

// OwnerOptions configures NewOwner.
type OwnerOptions struct {
	// Secret authenticates clients and derives the handle; nil reads SHMSTEER_SECRET.
	Secret *Secret
	// Namespace distinguishes several owners that share a secret.
	Namespace string
	// Region sizes the shared region.
	Region shm.Config
	// Grace is how long a removed key's revoked sentinel stands before it is purged; 0 means
	// DefaultGrace (60 s).
	Grace time.Duration
	// MaxKeyBytes bounds one key; 0 means DefaultMaxKeyBytes (4096).
	MaxKeyBytes int
	// MaxFrameBytes bounds one RPC frame, header included; 0 means DefaultMaxFrameBytes
	// (64 MiB). At most MaxFrameBytesLimit.
	MaxFrameBytes int
	// AllowUIDs lists uids allowed to attach besides the owner's own.
	AllowUIDs []int
	// SpinWait is how long the owner, having answered a request, polls that connection for
	// its next request before parking in the netpoller: back-to-back RPCs from a client then
	// skip the owner's wakeup, at the cost of up to SpinWait of CPU after each request (none
	// while no requests come). 0 means DefaultSpinWait; a negative value turns spinning off.
	SpinWait time.Duration
	// DropEnv unsets SHMSTEER_SECRET once the secret is resolved, so child processes started
	// later do not inherit it (pass it to them explicitly). The kernel's copy of the initial
	// environment (/proc/self/environ) is not affected.
	DropEnv bool
	// Logger receives attach, detach and auth-failure events; nil means slog.Default(). The
	// secret is never logged.
	Logger *slog.Logger
}

// Handler serves one extension RPC op in the owner. req is valid only during the call (it is
// zeroed afterwards); the returned bytes are sent back and may be reused after Handler returns
// only if the handler does not retain them elsewhere. A returned error reaches the client
// with its message, and errors.Is keeps working there for sentinels given to RegisterError.
type Handler func(req []byte) ([]byte, error)

// Owner creates the region, is its only writer, and serves attaches and RPCs on the handle
// derived from the secret. Its methods are safe for concurrent use.
type Owner struct {
	log      *slog.Logger
	secret   Secret
	ns       string
	handle   string
	region   *shm.Region
	keys     *Registry
	ln       *net.UnixListener
	lobby    *net.UnixListener // namespace-derived; see lobbyName
	maxFrame int
	maxKey   int
	grace    time.Duration
	spin     time.Duration
	allow    []int

	hmu      sync.RWMutex
	handlers map[uint16]Handler

	mu      sync.Mutex
	conns   map[*net.UnixConn]struct{}
	closed  bool
	clients atomic.Int32
	wg      sync.WaitGroup
	done    chan struct{}

	// kmu serializes the key registry's writes with the purge schedule.
	kmu            sync.Mutex
	purges         purgeQueue
	wake           chan struct{}
	revokeUnmarked atomic.Uint64 // see RevokedWithoutSentinel
}

// handles in use by owners of this process: a second owner for one handle is refused before it
// tries to bind.
var (
	handlesMu sync.Mutex
	handles   = map[string]bool{}
)

// NewOwner creates the region and starts serving the handle derived from the secret and
// namespace. ErrAuthSecretNotDefined without a secret; ErrPreviouslyInitialized if an owner
// already serves the handle, in this process or another.
func NewOwner(opts OwnerOptions) (*Owner, error) {
	secret, err := resolveSecret(opts.Secret, opts.DropEnv)
	if err != nil {
		return nil, err
	}
	o := &Owner{
		log:      opts.Logger,
		secret:   secret,
		ns:       opts.Namespace,
		maxFrame: opts.MaxFrameBytes,
		maxKey:   opts.MaxKeyBytes,
		grace:    opts.Grace,
		spin:     spinBudget(opts.SpinWait),
		allow:    slices.Clone(opts.AllowUIDs),
		handlers: map[uint16]Handler{},
		conns:    map[*net.UnixConn]struct{}{},
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.maxFrame == 0 {
		o.maxFrame = DefaultMaxFrameBytes
	}
	if o.maxKey == 0 {
		o.maxKey = DefaultMaxKeyBytes
	}
	if o.grace == 0 {
		o.grace = DefaultGrace
	}
	switch {
	case o.maxFrame < minFrameBytes || o.maxFrame > MaxFrameBytesLimit:
		err = fmt.Errorf("%w: MaxFrameBytes %d must be in [%d, %d]", shm.ErrBadConfig, o.maxFrame, minFrameBytes, MaxFrameBytesLimit)
	case o.maxKey < 0 || o.maxKey > o.maxFrame-frameHeader-2-MaxRequestIDLen:
		err = fmt.Errorf("%w: MaxKeyBytes %d must be in [0, MaxFrameBytes-%d]", shm.ErrBadConfig, o.maxKey, frameHeader+2+MaxRequestIDLen)
	case o.grace < 0:
		err = fmt.Errorf("%w: Grace %v is negative", shm.ErrBadConfig, o.grace)
	}
	if err != nil {
		o.secret.wipe()
		return nil, err
	}
	o.handle = handleName(secret, opts.Namespace)

	handlesMu.Lock()
	if handles[o.handle] {
		handlesMu.Unlock()
		o.secret.wipe()
		return nil, fmt.Errorf("%w (in this process)", ErrPreviouslyInitialized)
	}
	handles[o.handle] = true
	handlesMu.Unlock()
	fail := func(err error) (*Owner, error) {
		if o.ln != nil {
			o.ln.Close()
		}
		if o.lobby != nil {
			o.lobby.Close()
		}
		o.secret.wipe()
		handlesMu.Lock()
		delete(handles, o.handle)
		handlesMu.Unlock()
		return nil, err
	}

	// Bind before creating the region, so a second owner allocates nothing.
	o.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: "@" + o.handle, Net: "unix"})
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fail(fmt.Errorf("%w (another process serves the handle)", ErrPreviouslyInitialized))
		}
		return fail(fmt.Errorf("shmsteer: listening on the attach handle: %w", err))
	}
	o.lobby, err = net.ListenUnix("unix", &net.UnixAddr{Name: "@" + lobbyName(o.ns), Net: "unix"})
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fail(fmt.Errorf("%w (another owner, with another secret, serves the namespace)", ErrPreviouslyInitialized))
		}
		return fail(fmt.Errorf("shmsteer: listening on the lobby: %w", err))
	}
	if o.region, err = shm.Create(opts.Region); err != nil {
		return fail(err)
	}
	o.keys = &Registry{region: o.region, maxKey: o.maxKey, owner: o}
	o.wg.Add(4)
	go o.acceptLoop(o.ln)
	go o.acceptLoop(o.lobby)
	go o.purgeLoop()
	go o.sweepLoop()
	o.log.Debug("shmsteer: owner serving", "namespace", o.ns, "pid", os.Getpid())
	return o, nil
}

// Region is the owner's region handle (read-write).
func (o *Owner) Region() *shm.Region { return o.region }

// Keys is the key registry, written directly in the owner.
func (o *Owner) Keys() *Registry { return o.keys }

// Clients is the number of clients attached now.
func (o *Owner) Clients() int { return int(o.clients.Load()) }

// Handle registers h for an extension op (MinUserOp to MaxUserOp; it panics on others) that
// clients send with Client.Call. A later registration for the same op replaces the earlier.
func (o *Owner) Handle(op uint16, h Handler) {
	if op < MinUserOp || op > MaxUserOp || h == nil {
		panic(fmt.Sprintf("ipc: Owner.Handle: op %d must be in [%d, %d] with a non-nil handler", op, MinUserOp, MaxUserOp))
	}
	o.hmu.Lock()
	o.handlers[op] = h
	o.hmu.Unlock()
}

// Close stops serving (attached clients then get ErrOwnerGone on writes and keep reading),
// stops the purge schedule, unmaps the region and wipes the secret. Memory stays alive while
// clients map it.
func (o *Owner) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return ErrClosed
	}
	o.closed = true
	conns := make([]*net.UnixConn, 0, len(o.conns))
	for c := range o.conns {
		conns = append(conns, c)
	}
	o.mu.Unlock()
	close(o.done)
	err := errors.Join(o.ln.Close(), o.lobby.Close())
	for _, c := range conns {
		c.Close()
	}
	o.wg.Wait()
	err = errors.Join(err, o.region.Close())
	o.secret.wipe()
	handlesMu.Lock()
	delete(handles, o.handle)
	handlesMu.Unlock()
	return err
}

// acceptLoop serves one listener (the handle or the lobby): both run the same handshake.
func (o *Owner) acceptLoop(ln *net.UnixListener) {
	defer o.wg.Done()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			select {
			case <-o.done:
				return
			default:
			}
			o.log.Warn("shmsteer: accept failed", "err", err)
			select {
			case <-o.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		o.mu.Lock()
		if o.closed {
			o.mu.Unlock()
			c.Close()
			return
		}
		o.conns[c] = struct{}{}
		o.wg.Add(1)
		o.mu.Unlock()
		go o.serve(c)
	}
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

func (o *Owner) uidAllowed(uid uint32) bool {
	return int(uid) == os.Getuid() || slices.Contains(o.allow, int(uid))
}

// serve runs one client connection: credentials, handshake, fds, then RPCs until it closes.
func (o *Owner) serve(c *net.UnixConn) {
	defer o.wg.Done()
	defer func() {
		o.mu.Lock()
		delete(o.conns, c)
		o.mu.Unlock()
		c.Close()
	}()
	cred, err := peerCred(c)
	if err != nil {
		o.log.Warn("shmsteer: attach refused: no peer credentials", "err", err)
		return
	}
	pid := int(cred.Pid)
	var fr frameReader
	defer fr.wipe()
	if !o.uidAllowed(cred.Uid) {
		o.log.Warn("shmsteer: attach refused: uid not allowed", "pid", pid, "uid", cred.Uid)
		o.sendError(c, codeAuthFailed, "shmsteer: authentication failed: uid not allowed by the owner (OwnerOptions.AllowUIDs)")
		return
	}
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	if err := o.handshake(c, &fr); err != nil {
		o.log.Warn("shmsteer: attach refused", "pid", pid, "uid", cred.Uid, "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	o.log.Debug("shmsteer: client attached", "pid", pid, "uid", cred.Uid)
	clean := o.rpcLoop(c, &fr)
	o.clients.Add(-1)
	o.log.Debug("shmsteer: client detached", "pid", pid, "clean", clean)
	if !clean {
		o.wg.Add(1)
		go o.releaseReaders(pid)
	}
}

func (o *Owner) sendError(c *net.UnixConn, code uint16, msg string) {
	c.SetWriteDeadline(time.Now().Add(time.Second))
	c.Write(appendFrame(nil, opError, 0, appendError(nil, code, msg)))
}

// Proofs bind the protocol version, the namespace and both nonces; the two directions use
// different labels, so one side's proof is never valid as the other's.
func proof(s Secret, label, ns string, clientNonce, ownerNonce []byte) [macLen]byte {
	return s.mac([]byte(label), []byte{protoVersion}, []byte(ns), []byte{0}, clientNonce, ownerNonce)
}

const (
	ownerProofLabel  = "shmsteer/owner-proof/v1"
	clientProofLabel = "shmsteer/client-proof/v1"
)

func (o *Owner) handshake(c *net.UnixConn, fr *frameReader) error {
	f, err := fr.next(c.Read, handshakeMaxFrame)
	if err != nil {
		return err
	}
	if f.op != opHello {
		return fmt.Errorf("%w: expected hello, got op %d", ErrProtocol, f.op)
	}
	cn, err := decodeHello(f.payload)
	if err != nil {
		if errors.Is(err, ErrIncompatible) {
			o.sendError(c, codeIncompatible, err.Error())
		}
		return err
	}
	clientNonce := slices.Clone(cn)
	ownerNonce := make([]byte, nonceLen)
	rand.Read(ownerNonce)
	p := proof(o.secret, ownerProofLabel, o.ns, clientNonce, ownerNonce)
	if _, err := c.Write(appendFrame(nil, opChallenge, 0, encodeChallenge(ownerNonce, p))); err != nil {
		return err
	}
	if f, err = fr.next(c.Read, handshakeMaxFrame); err != nil {
		return err
	}
	if f.op == opError { // the client refused our proof
		code, msg, _ := decodeError(f.payload)
		return remoteError(code, msg)
	}
	if f.op != opProof {
		return fmt.Errorf("%w: expected proof, got op %d", ErrProtocol, f.op)
	}
	got, err := decodeProof(f.payload)
	if err != nil {
		return err
	}
	want := proof(o.secret, clientProofLabel, o.ns, clientNonce, ownerNonce)
	if !hmac.Equal(got, want[:]) {
		o.sendError(c, codeAuthFailed, "shmsteer: authentication failed: the client's proof does not match this owner's secret")
		return fmt.Errorf("%w: client proof mismatch", ErrAuthFailed)
	}
	data, readers := o.region.Files()
	w := welcome{
		regionID: o.region.ID(),
		ownerPID: uint32(os.Getpid()),
		maxFrame: uint32(o.maxFrame),
		maxKey:   uint32(o.maxKey),
	}
	msg := appendFrame(nil, opWelcome, 0, w.encode())
	o.clients.Add(1) // counted before the client can see the welcome
	n, _, err := c.WriteMsgUnix(msg, unix.UnixRights(int(data.Fd()), int(readers.Fd())), nil)
	if err == nil && n != len(msg) {
		err = io.ErrShortWrite
	}
	if err != nil {
		o.clients.Add(-1)
	}
	return err
}

// rpcLoop serves requests until the client leaves; it reports whether it said bye (and so
// released its own reader slots).
func (o *Owner) rpcLoop(c *net.UnixConn, fr *frameReader) (clean bool) {
	read := c.Read
	var sc *spinConn
	if o.spin > 0 {
		var err error
		if sc, err = newSpinConn(c); err != nil {
			o.log.Warn("shmsteer: dropping client: attach socket", "err", err)
			return false
		}
		read = sc.read
	}
	var wbuf []byte
	defer func() { clear(wbuf) }()
	for {
		f, err := fr.next(read, o.maxFrame)
		if err != nil {
			if errors.Is(err, ErrProtocol) || errors.Is(err, ErrFrameTooLarge) {
				o.log.Warn("shmsteer: dropping client after a bad frame", "err", err)
				c.Write(appendFrame(nil, opReplyErr, 0, appendError(nil, codeOf(err), err.Error())))
			}
			return false
		}
		if f.op == opBye {
			return true
		}
		wbuf = beginFrame(wbuf[:0], opReplyOK, f.id)
		var herr error
		wbuf, herr = o.dispatch(f, wbuf)
		clear(f.payload) // it may hold a key
		if herr != nil {
			wbuf = beginFrame(wbuf[:0], opReplyErr, f.id)
			wbuf = appendError(wbuf, codeOf(herr), herr.Error())
		}
		if len(wbuf) > o.maxFrame {
			herr = fmt.Errorf("%w: reply to op %d is %d bytes, at most %d", ErrFrameTooLarge, f.op, len(wbuf), o.maxFrame)
			wbuf = appendError(beginFrame(wbuf[:0], opReplyErr, f.id), codeFrameTooLarge, herr.Error())
		}
		finishFrame(wbuf, 0)
		_, err = c.Write(wbuf)
		clear(wbuf)
		if cap(wbuf) > readerKeep {
			wbuf = nil
		}
		if err != nil {
			return false
		}
		if sc != nil {
			sc.spinUntil(time.Now().Add(o.spin)) // the client's next request may follow at once
		}
	}
}

// dispatch runs one request and appends its reply payload to dst.
func (o *Owner) dispatch(f frame, dst []byte) (out []byte, err error) {
	switch f.op {
	case opPing:
		return dst, nil
	case opKeySet:
		id, key, err := decodeKeySet(f.payload)
		if err != nil {
			return dst, err
		}
		return dst, o.keys.Set(string(id), key)
	case opKeyRemove:
		return dst, o.keys.Remove(string(f.payload))
	}
	if f.op < MinUserOp || f.op > MaxUserOp {
		return dst, fmt.Errorf("%w: op %d", ErrUnknownOp, f.op)
	}
	o.hmu.RLock()
	h := o.handlers[f.op]
	o.hmu.RUnlock()
	if h == nil {
		return dst, fmt.Errorf("%w: op %d", ErrUnknownOp, f.op)
	}
	defer func() {
		if p := recover(); p != nil {
			o.log.Error("shmsteer: RPC handler panicked", "op", f.op, "panic", p)
			out, err = dst, fmt.Errorf("shmsteer: owner's handler for op %d panicked", f.op)
		}
	}()
	reply, err := h(f.payload)
	if err != nil {
		return dst, err
	}
	return append(dst, reply...), nil
}

// releaseReaders frees the reader slots of a client whose socket closed without a bye (it
// crashed or was killed). The socket closes as the process exits, a moment before the kernel
// drops the leases on its slots (both happen as its descriptors close), so it sweeps a few
// times over releaseWait; the owner's periodic sweep covers anything later.
func (o *Owner) releaseReaders(pid int) {
	defer o.wg.Done()
	deadline := time.Now().Add(releaseWait)
	pause := time.Millisecond
	for {
		n, err := o.region.SweepReaders()
		if err != nil {
			return
		}
		if n > 0 {
			o.log.Debug("shmsteer: freed reader slots of a departed client", "pid", pid, "slots", n)
			return
		}
		if time.Now().After(deadline) {
			return
		}
		select {
		case <-o.done:
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, 100*time.Millisecond)
	}
}
