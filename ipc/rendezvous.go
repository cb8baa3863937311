package ipc

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Rendezvous. Abstract unix socket names have no permissions: any local user can bind any
// name first. So an owner does not own one name but a sequence of candidates, and both sides
// check who listens before they trust a name (see the package documentation, Squatting).

// rendezvousCandidates is how many candidate names a handle (and a lobby) has: a squatter
// must hold all of them, under the eyes of the owner's log, to keep an owner from starting.
const rendezvousCandidates = 64

// candidateSeed is the derivation input for candidate i: u32 length of the namespace, the
// namespace, u32 i (little-endian), after a label; unambiguous for any namespace.
func candidateSeed(label, ns string, i int) []byte {
	b := append([]byte(label), 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ns)))
	b = append(b, ns...)
	return binary.LittleEndian.AppendUint32(b, uint32(i))
}

// handleNames are the attach handle's candidate names (without the leading NUL):
// "shmsteer-" + hex(HMAC-SHA256(secret, "shmsteer/handle/v2" 0 len(ns) ns i)). Finding them
// needs the secret; connecting to one proves nothing, which is why the handshake follows.
func handleNames(s Secret, ns string) []string {
	names := make([]string, rendezvousCandidates)
	for i := range names {
		m := s.mac(candidateSeed("shmsteer/handle/v2", ns, i))
		names[i] = "shmsteer-" + hex.EncodeToString(m[:])
	}
	return names
}

// lobbyNames are the candidate names of the owner's second socket, derived from the namespace
// alone. A client whose secret derives no live handle knocks there before it gives up, so a
// wrong secret is reported as ErrAuthFailed (the handshake fails as on the handle) rather than
// as "no owner". They reveal only that an owner serves the namespace, which /proc/net/unix
// shows anyway; they also let an owner find another owner of its namespace, whatever its
// secret.
func lobbyNames(ns string) []string {
	names := make([]string, rendezvousCandidates)
	for i := range names {
		h := sha256.Sum256(candidateSeed("shmsteer/lobby/v2", ns, i))
		names[i] = "shmsteer-lobby-" + hex.EncodeToString(h[:16])
	}
	return names
}

// Fresh names. Every candidate above can be held by another uid: the lobby's are predictable
// from the namespace, and a handle's, though they need the secret, are listed in
// /proc/net/unix once an owner has bound them, so a squatter can take each as a restarted
// owner's predecessor frees it. An owner that finds every candidate held therefore binds a
// fresh name, drawn at random at each start, that no other uid can predict, and clients find
// it among the bound names the kernel lists (eachUnixSocket):
//
//	fresh handle = "shmsteer-h-" + hex(n) + "-" + hex(HMAC-SHA256(secret, "shmsteer/handle-fresh/v1" 0 u32(len ns) ns u32(0), n)[:16])
//	fresh lobby  = "shmsteer-lobby-" + hex(SHA-256("shmsteer/lobby-fresh/v1" 0 u32(len ns) ns u32(0))[:16]) + "-" + hex(n)
//
// with n 16 random bytes. A client accepts a fresh handle only if its tag verifies under its
// secret; a fresh lobby only tells the namespace, as a lobby does. Copies of a dead owner's
// fresh names held by a squatter are skipped by uid like any other.
const (
	freshHandlePrefix = "shmsteer-h-"
	freshNonceLen     = 16
)

func freshHandleTag(s Secret, ns string, nonce []byte) []byte {
	m := s.mac(candidateSeed("shmsteer/handle-fresh/v1", ns, 0), nonce)
	return m[:16]
}

// freshHandleName draws a fresh handle name for this secret and namespace.
func freshHandleName(s Secret, ns string) string {
	n := make([]byte, freshNonceLen)
	rand.Read(n)
	return freshHandlePrefix + hex.EncodeToString(n) + "-" + hex.EncodeToString(freshHandleTag(s, ns, n))
}

// isFreshHandle reports whether name is a fresh handle name of this secret and namespace.
func isFreshHandle(s Secret, ns, name string) bool {
	rest, ok := strings.CutPrefix(name, freshHandlePrefix)
	if !ok {
		return false
	}
	nh, th, ok := strings.Cut(rest, "-")
	n, err1 := hex.DecodeString(nh)
	tag, err2 := hex.DecodeString(th)
	return ok && err1 == nil && err2 == nil && len(n) == freshNonceLen && hmac.Equal(tag, freshHandleTag(s, ns, n))
}

// freshLobbyPrefix starts every fresh lobby name of the namespace.
func freshLobbyPrefix(ns string) string {
	h := sha256.Sum256(candidateSeed("shmsteer/lobby-fresh/v1", ns, 0))
	return "shmsteer-lobby-" + hex.EncodeToString(h[:16]) + "-"
}

func freshLobbyName(ns string) string {
	n := make([]byte, freshNonceLen)
	rand.Read(n)
	return freshLobbyPrefix(ns) + hex.EncodeToString(n)
}

// freshHandles and freshLobbies list the fresh names bound now by sockets of a uid allowed
// accepts (none if the kernel's socket diagnostics are unavailable): a squatter's copies are
// left out before anything is dialed, however many it makes. A fresh handle's tag must verify.
func freshHandles(s Secret, ns string, allowed func(uid int) bool) []string {
	names, _ := abstractNames(func(name string, uid int) bool { return allowed(uid) && isFreshHandle(s, ns, name) })
	return names
}

func freshLobbies(ns string, allowed func(uid int) bool) []string {
	prefix := freshLobbyPrefix(ns)
	names, _ := abstractNames(func(name string, uid int) bool { return allowed(uid) && strings.HasPrefix(name, prefix) })
	return names
}

// listener describes who holds a name: SO_PEERCRED of a connection to it (the credentials
// the listener had when it called listen), or, for a socket that takes no connection (bound
// without listening, or its backlog full), the kernel's socket diagnostics (abstractHolder:
// the uid, and the pid where /proc shows it; 0 otherwise). known is false when nothing could
// be learnt.
type listener struct {
	uid, pid int
	known    bool
}

func (l listener) String() string {
	switch {
	case !l.known:
		return "a socket of unknown uid and pid"
	case l.pid == 0:
		return fmt.Sprintf("uid %d pid unknown", l.uid)
	}
	return fmt.Sprintf("uid %d pid %d", l.uid, l.pid)
}

// describeListeners summarizes holders, grouping names held by one process.
func describeListeners(ls []listener) string {
	type key = listener
	var order []key
	count := map[key]int{}
	for _, l := range ls {
		if count[l] == 0 {
			order = append(order, l)
		}
		count[l]++
	}
	parts := make([]string, 0, len(order))
	for _, l := range order {
		parts = append(parts, fmt.Sprintf("%v (%d names)", l, count[l]))
	}
	return strings.Join(parts, ", ")
}

// errNoListener means nothing accepts connections on a name (absent, or bound and not
// listening), errBacklogFull that a listener's backlog is full; the caller moves on to the
// next candidate.
var (
	errNoListener  = errors.New("no listener")
	errBacklogFull = errors.New("listener's backlog full")
)

// dialName connects to an abstract name without sending anything and returns the connection
// and the listener's credentials. Absent names, names bound without listening and listeners
// whose backlog is full fail at once (errNoListener): the unix connect does not wait.
func dialName(name string, deadline time.Time) (*net.UnixConn, listener, error) {
	d := net.Dialer{Deadline: deadline}
	nc, err := d.Dial("unix", "@"+name)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ENOENT):
			return nil, listener{}, errNoListener
		case errors.Is(err, syscall.EAGAIN):
			return nil, listener{}, errBacklogFull
		}
		return nil, listener{}, err
	}
	c := nc.(*net.UnixConn)
	cred, err := peerCred(c)
	if err != nil {
		c.Close()
		return nil, listener{}, fmt.Errorf("shmsteer: reading the listener's credentials: %w", err)
	}
	return c, listener{uid: int(cred.Uid), pid: int(cred.Pid), known: true}, nil
}

// dialFirstAllowed tries names in order and returns the first connection whose listener's uid
// is allowed; others are closed before a byte is sent, and listed in skipped. It returns a nil
// connection and no error if no name has an allowed listener; an error only for a deadline.
func dialFirstAllowed(names []string, allowed func(uid int) bool, deadline time.Time) (c *net.UnixConn, skipped []listener, err error) {
	for _, name := range names {
		c, l, err := dialName(name, deadline)
		switch {
		case err == nil && allowed(l.uid):
			return c, skipped, nil
		case err == nil:
			c.Close()
			skipped = append(skipped, l)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return nil, skipped, fmt.Errorf("%w: connecting to the owner", ErrTimeout)
		}
		// Absent names and other dial errors: try the next candidate.
	}
	return nil, skipped, nil
}

// probeName learns who holds a name that could not be bound: from a connection if it takes
// one, else from the kernel's socket diagnostics.
func probeName(name string) listener {
	c, l, err := dialName(name, time.Now().Add(100*time.Millisecond))
	if err == nil {
		c.Close()
		return l
	}
	if l, err := abstractHolder(name); err == nil {
		return l
	}
	return listener{}
}

// bindFirstFree binds the first candidate name that is free and returns its listener.
// A candidate held by a process of this uid means an owner runs: ErrPreviouslyInitialized
// naming its pid. One held by another uid (or by a socket that tells nothing) is skipped with
// a warning. If every candidate is held, it binds a fresh name (see freshHandleName), so
// whatever other uids hold, the owner starts; ErrRendezvousTaken, naming the holders, only if
// not even a fresh name can be bound.
func (o *Owner) bindFirstFree(names []string, what string, fresh func() string) (*net.UnixListener, error) {
	var held []listener
	for i, name := range names {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
		if err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("shmsteer: listening on the %s: %w", what, err)
		}
		l := probeName(name)
		if l.known && l.uid == os.Getuid() {
			return nil, fmt.Errorf("%w: %v holds the %s", ErrPreviouslyInitialized, l, what)
		}
		o.log.Warn("shmsteer: rendezvous name held by another user's process; skipping it",
			"name", what, "candidate", i, "holder", l.String(), "uid", l.uid, "pid", l.pid)
		held = append(held, l)
	}
	var err error
	for range 3 { // a fresh name is taken only by a collision of random draws
		var ln *net.UnixListener
		if ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: "@" + fresh(), Net: "unix"}); err == nil {
			o.log.Warn("shmsteer: every rendezvous candidate is held by other users' processes; serving on a fresh name instead (clients find it; stop the holders to silence this)",
				"name", what, "candidates", len(names), "holders", describeListeners(held))
			return ln, nil
		}
	}
	return nil, fmt.Errorf("%w: all %d %s candidates are held by %s, and a fresh name could not be bound: %w", ErrRendezvousTaken, len(names), what, describeListeners(held), err)
}

// findLiveOwner looks for a process of this uid listening on any of names (another owner of
// the namespace, whatever its secret).
func findLiveOwner(names []string) (listener, bool) {
	deadline := time.Now().Add(time.Second)
	for _, name := range names {
		if l, ok := liveOwnerAt(name, deadline); ok {
			return l, true
		}
	}
	return listener{}, false
}

// liveOwnerAt reports whether a process of this uid listens on name.
func liveOwnerAt(name string, deadline time.Time) (listener, bool) {
	c, l, err := dialName(name, deadline)
	switch {
	case err == nil:
		c.Close()
	case errors.Is(err, errBacklogFull): // an owner under a flood of connections?
		if l, err = abstractHolder(name); err != nil {
			return listener{}, false
		}
	default:
		return listener{}, false
	}
	return l, l.uid == os.Getuid()
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

// uidIn reports whether uid is this process's or one of extra.
func uidIn(uid int, extra []int) bool { return uid == os.Getuid() || slices.Contains(extra, uid) }
