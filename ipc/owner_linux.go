package ipc

import (
	"cmp"
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
	// DefaultWriteTimeout bounds each of the owner's writes when OwnerOptions.WriteTimeout is 0.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultFrameTimeout is OwnerOptions.FrameTimeout's default.
	DefaultFrameTimeout = 10 * time.Second
	// DefaultMaxPendingHandshakes is OwnerOptions.MaxPendingHandshakes's default.
	DefaultMaxPendingHandshakes = 64
	// maxRefusing bounds the connections of refused uids being told so at once; beyond it
	// they are closed without a word.
	maxRefusing = 16
	// handshakeTimeout bounds an attach on the owner's side.
	handshakeTimeout = 5 * time.Second
	// releaseWait is how long the owner sweeps for a disconnected client's reader slots
	// (see releaseReaders); the periodic sweep covers anything later.
	releaseWait = time.Second
	// refuseWait bounds how long the owner waits for a refused client's hello.
	refuseWait = time.Second
)

// OwnerOptions configures NewOwner.
type OwnerOptions struct {
	// Secret authenticates clients and derives the handle. Without it (and without
	// SecretFile) the secret comes from SHMSTEER_SECRET_FILE or SHMSTEER_SECRET.
	Secret *Secret
	// SecretFile names a file holding the secret (see SecretFromFile). Setting both Secret and
	// SecretFile is ErrSecretConflict; either wins over the environment.
	SecretFile string
	// NonDumpable makes this process non-dumpable (prctl PR_SET_DUMPABLE 0) before the secret
	// is read: processes of the same uid can then no longer read its memory through
	// /proc/PID/mem or ptrace, nor its descriptors (the region's memfds) through /proc/PID/fd,
	// and it leaves no core dump. It applies to the whole process and is not undone on Close.
	NonDumpable bool
	// Namespace distinguishes several owners that share a secret.
	Namespace string
	// Region sizes the shared region.
	Region shm.Config
	// MaxFrameBytes bounds one RPC frame, header included; 0 means DefaultMaxFrameBytes
	// (64 MiB). At most MaxFrameBytesLimit.
	MaxFrameBytes int
	// MaxBufferedBytes bounds the bytes all connections together buffer for incoming frames
	// beyond a small per-connection buffer (64 KiB); 0 means 2 × MaxFrameBytes. At least
	// MaxFrameBytes. A connection whose frame finds no room waits (it reads nothing
	// meanwhile, so its sender blocks) for at most FrameTimeout, then is dropped with
	// ErrBusy. Frame buffers above 1 MiB are anonymous mappings whose pages are discarded
	// once the frame is served, so the memory goes back to the system at once.
	MaxBufferedBytes int
	// FrameTimeout bounds, each, the wait for room in MaxBufferedBytes and the time from a
	// frame's first byte to its last: a client that starts a frame and stalls is dropped
	// (ErrBusy) and its buffer freed. 0 means DefaultFrameTimeout (10 s).
	FrameTimeout time.Duration
	// WriteTimeout bounds each write of a reply: a client that sends requests but does not
	// read the replies is dropped once one write stalls that long, rather than holding an
	// owner goroutine forever. 0 means DefaultWriteTimeout (10 s).
	WriteTimeout time.Duration
	// MaxPendingHandshakes bounds connections accepted but not yet through the handshake;
	// 0 means DefaultMaxPendingHandshakes (64). When the bound is reached, or accept fails
	// because the process is out of descriptors (EMFILE, ENFILE), the oldest pending
	// handshake is closed, so idle connections cannot keep a legitimate attach out.
	// Connections of uids not allowed are refused before they count.
	MaxPendingHandshakes int
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
	handle   string // the candidate name bound
	ownerKey string // the first candidate: the key in ownerHandles
	region   *shm.Region
	ln       *net.UnixListener
	lobby    *net.UnixListener // namespace-derived; see lobbyName
	maxFrame int
	spin     time.Duration
	allow    []int

	budget       *byteBudget
	frameTimeout time.Duration
	writeTimeout time.Duration
	maxPending   int
	refusing     chan struct{} // a token per refusal in progress (maxRefusing)

	uidRefusals atomic.Uint64

	pmu       sync.Mutex
	pending   []*net.UnixConn // accepted, handshake not done; oldest first
	evictions int

	hmu      sync.RWMutex
	handlers map[uint16]Handler

	mu      sync.Mutex
	conns   map[*net.UnixConn]struct{}
	closed  bool
	onClose []func() // OnClose's functions, run by Close in order
	clients atomic.Int32
	wg      sync.WaitGroup
	done    chan struct{}
}

// handles in use by owners of this process: a second owner for one handle is refused before it
// tries to bind.
var (
	handlesMu    sync.Mutex
	ownerHandles = map[string]bool{}
)

// NewOwner creates the region and starts serving the handle derived from the secret and
// namespace (the first free of its candidate names, or a fresh name if other users hold
// them all; see the package documentation, Squatting). ErrAuthSecretNotDefined without a
// secret; ErrPreviouslyInitialized if an owner of this uid already serves the namespace, in
// this process or another (the error names its pid); ErrRendezvousTaken only if not even a
// fresh name can be bound.
func NewOwner(opts OwnerOptions) (*Owner, error) {
	if opts.NonDumpable {
		if err := setNonDumpable(); err != nil {
			return nil, err
		}
	}
	secret, err := resolveSecret(opts.Secret, opts.SecretFile, opts.DropEnv)
	if err != nil {
		return nil, err
	}
	o := &Owner{
		log:      opts.Logger,
		secret:   secret,
		ns:       opts.Namespace,
		maxFrame: opts.MaxFrameBytes,
		spin:     spinBudget(opts.SpinWait),
		allow:    slices.Clone(opts.AllowUIDs),
		handlers: map[uint16]Handler{},
		conns:    map[*net.UnixConn]struct{}{},
		done:     make(chan struct{}),
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if o.maxFrame == 0 {
		o.maxFrame = DefaultMaxFrameBytes
	}
	o.frameTimeout = cmp.Or(opts.FrameTimeout, DefaultFrameTimeout)
	o.writeTimeout = cmp.Or(opts.WriteTimeout, DefaultWriteTimeout)
	o.maxPending = cmp.Or(opts.MaxPendingHandshakes, DefaultMaxPendingHandshakes)
	o.refusing = make(chan struct{}, maxRefusing)
	maxBuffered := cmp.Or(opts.MaxBufferedBytes, 2*o.maxFrame)
	switch {
	case o.maxFrame < minFrameBytes || o.maxFrame > MaxFrameBytesLimit:
		err = fmt.Errorf("%w: MaxFrameBytes %d must be in [%d, %d]", shm.ErrBadConfig, o.maxFrame, minFrameBytes, MaxFrameBytesLimit)
	case maxBuffered < o.maxFrame:
		err = fmt.Errorf("%w: MaxBufferedBytes %d must be at least MaxFrameBytes (%d)", shm.ErrBadConfig, maxBuffered, o.maxFrame)
	case o.frameTimeout < 0 || o.writeTimeout < 0 || o.maxPending < 0:
		err = fmt.Errorf("%w: FrameTimeout, WriteTimeout and MaxPendingHandshakes must not be negative", shm.ErrBadConfig)
	}
	o.budget = newByteBudget(maxBuffered)
	if err != nil {
		o.secret.wipe()
		return nil, err
	}
	handles := handleNames(secret, opts.Namespace)
	ownerKey := handles[0]
	o.ownerKey = ownerKey
	handlesMu.Lock()
	if ownerHandles[ownerKey] {
		handlesMu.Unlock()
		o.secret.wipe()
		return nil, fmt.Errorf("%w (in this process)", ErrPreviouslyInitialized)
	}
	ownerHandles[ownerKey] = true
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
		delete(ownerHandles, ownerKey)
		handlesMu.Unlock()
		return nil, err
	}

	// Bind before creating the region, so a second owner allocates nothing. Any live owner
	// of the namespace, whatever its secret, listens on one of the lobby candidates: look for
	// one of this uid on all of them first (it need not hold the first free one).
	lobbies := lobbyNames(o.ns)
	if l, ok := findLiveOwner(append(lobbies, freshLobbies(o.ns, func(uid int) bool { return uid == os.Getuid() })...)); ok {
		return fail(fmt.Errorf("%w: %v serves the namespace", ErrPreviouslyInitialized, l))
	}
	if o.lobby, err = o.bindFirstFree(lobbies, "lobby", func() string { return freshLobbyName(o.ns) }); err != nil {
		return fail(err)
	}
	if o.ln, err = o.bindFirstFree(handles, "attach handle", func() string { return freshHandleName(o.secret, o.ns) }); err != nil {
		return fail(err)
	}
	o.handle = o.ln.Addr().(*net.UnixAddr).Name[1:]
	if o.region, err = shm.Create(opts.Region); err != nil {
		return fail(err)
	}
	o.wg.Add(3)
	go o.acceptLoop(o.ln)
	go o.acceptLoop(o.lobby)
	go o.sweepLoop()
	o.log.Debug("shmsteer: owner serving", "namespace", o.ns, "pid", os.Getpid())
	return o, nil
}

// Region is the owner's region handle (read-write).
func (o *Owner) Region() *shm.Region { return o.region }

// MaxPayload is the largest request payload a handler can be sent (OwnerOptions.MaxFrameBytes
// less the frame header).
func (o *Owner) MaxPayload() int { return o.maxFrame - frameHeader }

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

// OnClose registers fn to run in Close, once serving has stopped (no handler runs any more)
// and before the region is unmapped: a room above ipc that runs goroutines on the owner's
// region (package keys' purge loop) stops them there. Functions run in the order registered;
// after Close, OnClose runs fn at once.
func (o *Owner) OnClose(fn func()) {
	o.mu.Lock()
	if !o.closed {
		o.onClose = append(o.onClose, fn)
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	fn()
}

// Close stops serving (attached clients then get ErrOwnerGone on writes and keep reading),
// runs the OnClose functions, unmaps the region and wipes the secret. Memory stays alive while
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
	for _, fn := range o.onClose {
		fn()
	}
	err = errors.Join(err, o.region.Close())
	o.secret.wipe()
	handlesMu.Lock()
	delete(ownerHandles, o.ownerKey)
	handlesMu.Unlock()
	return err
}

// acceptLoop serves one listener (the handle or the lobby): both run the same handshake.
// Peers of uids not allowed are refused here, before they count as pending handshakes.
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
			if (errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)) && o.evictOldestPending("out of file descriptors") {
				continue // a descriptor is free again
			}
			o.log.Warn("shmsteer: accept failed", "err", err)
			select {
			case <-o.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		cred, err := peerCred(c)
		if err != nil {
			o.log.Warn("shmsteer: attach refused: no peer credentials", "err", err)
			c.Close()
			continue
		}
		if !o.uidAllowed(cred.Uid) {
			// 1st, 2nd, 4th, 8th...: a flood of connections does not flood the log.
			if n := o.uidRefusals.Add(1); n&(n-1) == 0 {
				o.log.Warn("shmsteer: attach refused: uid not allowed", "pid", cred.Pid, "uid", cred.Uid, "refusals", n)
			}
			select {
			case o.refusing <- struct{}{}:
				if !o.track(c) {
					<-o.refusing
					return
				}
				go func() {
					defer func() { <-o.refusing }()
					defer o.untrack(c)
					var fr frameReader
					defer fr.wipe()
					o.refuse(c, &fr, codeAuthFailed, msgUIDRefused)
				}()
			default: // too many refusals at once: no word for this one
				c.Close()
			}
			continue
		}
		if !o.track(c) {
			return
		}
		o.addPending(c)
		go o.serve(c, cred)
	}
}

// track registers a connection (closed by Close) and counts it in wg; false, with c closed,
// once the owner is closed.
func (o *Owner) track(c *net.UnixConn) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		c.Close()
		return false
	}
	o.conns[c] = struct{}{}
	o.wg.Add(1)
	return true
}

// untrack closes and forgets a tracked connection; its goroutine is done.
func (o *Owner) untrack(c *net.UnixConn) {
	o.mu.Lock()
	delete(o.conns, c)
	o.mu.Unlock()
	c.Close()
	o.wg.Done()
}

// addPending counts c as a pending handshake, first closing the oldest if at the bound.
func (o *Owner) addPending(c *net.UnixConn) {
	if o.pendingCount() >= o.maxPending {
		o.evictOldestPending("MaxPendingHandshakes reached")
	}
	o.pmu.Lock()
	o.pending = append(o.pending, c)
	o.pmu.Unlock()
}

func (o *Owner) pendingCount() int {
	o.pmu.Lock()
	defer o.pmu.Unlock()
	return len(o.pending)
}

// donePending forgets c as a pending handshake (it finished, failed, or was evicted).
func (o *Owner) donePending(c *net.UnixConn) {
	o.pmu.Lock()
	defer o.pmu.Unlock()
	if i := slices.Index(o.pending, c); i >= 0 {
		o.pending = slices.Delete(o.pending, i, i+1)
	}
}

// evictOldestPending closes the oldest pending handshake; false if there is none. Its serve
// goroutine then fails its read and cleans up.
func (o *Owner) evictOldestPending(why string) bool {
	o.pmu.Lock()
	if len(o.pending) == 0 {
		o.pmu.Unlock()
		return false
	}
	c := o.pending[0]
	o.pending = slices.Delete(o.pending, 0, 1)
	o.evictions++
	n := o.evictions
	o.pmu.Unlock()
	c.Close()
	if n&(n-1) == 0 { // 1, 2, 4, 8...: a flood of idle connections does not flood the log
		o.log.Warn("shmsteer: closed the oldest pending attach handshake", "why", why, "evictions", n)
	}
	return true
}

func (o *Owner) uidAllowed(uid uint32) bool {
	return uidIn(int(uid), o.allow)
}

// serve runs one client connection: handshake, fds, then RPCs until it closes.
func (o *Owner) serve(c *net.UnixConn, cred *unix.Ucred) {
	defer o.untrack(c)
	pid := int(cred.Pid)
	fr := frameReader{budget: o.budget, budgetWait: o.frameTimeout, done: o.done}
	defer fr.wipe()
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	err := o.handshake(c, &fr)
	o.donePending(c)
	if err != nil {
		if (errors.Is(err, io.EOF) && fr.end == 0) || errors.Is(err, net.ErrClosed) {
			// Closed before a byte (a client that skipped us, or another owner looking for
			// a live owner of the namespace), or evicted as the oldest pending handshake.
			o.log.Debug("shmsteer: connection closed before the handshake", "pid", pid, "uid", cred.Uid, "err", err)
			return
		}
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

// msgUIDRefused is what a client of a uid the owner does not allow is told.
const msgUIDRefused = "shmsteer: authentication failed: uid not allowed by the owner (OwnerOptions.AllowUIDs)"

// refuse reads the client's hello, then answers with an error and returns (the caller
// closes). Reading first makes the client's hello write succeed whatever the timing, so it
// always reads this error rather than sometimes failing its write on a closed socket.
func (o *Owner) refuse(c *net.UnixConn, fr *frameReader, code uint16, msg string) {
	c.SetReadDeadline(time.Now().Add(refuseWait))
	fr.next(c.Read, handshakeMaxFrame)
	o.sendError(c, code, msg)
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
	baseRead := c.Read
	var sc *spinConn
	if o.spin > 0 {
		var err error
		if sc, err = newSpinConn(c); err != nil {
			o.log.Warn("shmsteer: dropping client: attach socket", "err", err)
			return false
		}
		baseRead = sc.read
	}
	// An idle connection may wait for ever, but once a frame has begun it must arrive
	// whole within FrameTimeout: a sender that stalls midway cannot hold its buffer.
	midFrame := false
	read := func(b []byte) (int, error) {
		if !midFrame && fr.buffered() > 0 {
			c.SetReadDeadline(time.Now().Add(o.frameTimeout))
			midFrame = true
		}
		return baseRead(b)
	}
	var wbuf []byte
	defer func() { clear(wbuf) }()
	for {
		f, err := fr.next(read, o.maxFrame)
		if err != nil {
			if midFrame && errors.Is(err, os.ErrDeadlineExceeded) {
				err = fmt.Errorf("%w: a frame did not arrive whole within FrameTimeout (%v)", ErrBusy, o.frameTimeout)
			}
			if errors.Is(err, ErrProtocol) || errors.Is(err, ErrFrameTooLarge) || errors.Is(err, ErrBusy) {
				o.log.Warn("shmsteer: dropping client after a bad or stalled frame", "err", err)
				id, _ := fr.pendingID()
				c.SetWriteDeadline(time.Now().Add(time.Second))
				c.Write(appendFrame(nil, opReplyErr, id, appendError(nil, codeOf(err), err.Error())))
			}
			return false
		}
		if midFrame {
			c.SetReadDeadline(time.Time{})
			midFrame = false
		}
		if f.op == opBye {
			return true
		}
		wbuf = beginFrame(wbuf[:0], opReplyOK, f.id)
		var herr error
		wbuf, herr = o.dispatch(f, wbuf)
		clear(f.payload) // it may hold a key
		fr.release()     // a large frame's memory goes back now, not at the next frame
		if herr != nil {
			wbuf = beginFrame(wbuf[:0], opReplyErr, f.id)
			wbuf = appendError(wbuf, codeOf(herr), herr.Error())
		}
		if len(wbuf) > o.maxFrame {
			herr = fmt.Errorf("%w: reply to op %d is %d bytes, at most %d", ErrFrameTooLarge, f.op, len(wbuf), o.maxFrame)
			wbuf = appendError(beginFrame(wbuf[:0], opReplyErr, f.id), codeFrameTooLarge, herr.Error())
		}
		finishFrame(wbuf, 0)
		c.SetWriteDeadline(time.Now().Add(o.writeTimeout))
		_, err = c.Write(wbuf)
		clear(wbuf)
		if cap(wbuf) > readerKeep {
			wbuf = nil
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				o.log.Warn("shmsteer: dropping client: it does not read its replies", "writeTimeout", o.writeTimeout)
			}
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
