package ipc

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// squat starts a process of uid 65534 that binds and listens on names, and returns its pid.
func squat(t *testing.T, exe string, names ...string) int { return squatAs(t, exe, false, names...) }

// squatAs is squat; with bindOnly the squatter binds the names without listening.
func squatAs(t *testing.T, exe string, bindOnly bool, names ...string) int {
	t.Helper()
	env := []string{squatEnv + "=" + strings.Join(names, ",")}
	if bindOnly {
		env = append(env, squatBindOnlyEnv+"=1")
	}
	p := startProcAs(t, exe, nobodyCred, "squatter", env...)
	require.Equal(t, "ok ready", p.Line())
	return p.Cmd.Process.Pid
}

// syncBuffer is a log sink safe for the owner's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSquatters: another uid binds the names an owner would use. The owner starts on the
// next free candidates and says who squats; clients skip the squatter before they send a
// byte, at once rather than after their timeout.
func TestSquatters(t *testing.T) {
	exe := nobodyExe(t)
	env := newTestEnv()
	handles, lobbies := handleNames(env.secret, env.ns), lobbyNames(env.ns)
	pid := squat(t, exe, handles[0], handles[1], lobbies[0])

	var logs syncBuffer
	opts := env.ownerOpts()
	opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	o := newTestOwner(t, opts)
	require.Equal(t, handles[2], o.handle, "the first free candidate")
	require.Contains(t, logs.String(), fmt.Sprintf("uid=%d pid=%d", nobody, pid), "the owner names the squatter")
	require.NoError(t, ownerStore(o).Set("req", []byte("k")))

	co := env.clientOpts()
	co.Timeout = 3 * time.Second
	start := time.Now()
	c, err := Attach(co)
	took := time.Since(start)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.Less(t, took, time.Second, "a squatter costs a client no timeout")
	t.Logf("attach past a squatter on 2 of 64 handle candidates: %v", took)
	got, err := clientStore(c).Get("req", nil)
	require.NoError(t, err)
	require.Equal(t, "k", string(got))

	// A wrong secret still finds the owner's lobby past the squatter: ErrAuthFailed.
	wrong := NewSecret([]byte("wrong-" + env.secretStr))
	start = time.Now()
	_, err = Attach(ClientOptions{Secret: &wrong, Namespace: env.ns, Timeout: 3 * time.Second})
	require.ErrorIs(t, err, ErrAuthFailed)
	require.Less(t, time.Since(start), time.Second)
}

// TestSquattersOnly: a client that finds only a squatter (no owner) gets ErrNotYetInitialized
// at once, naming it.
func TestSquattersOnly(t *testing.T) {
	exe := nobodyExe(t)
	env := newTestEnv()
	pid := squat(t, exe, handleNames(env.secret, env.ns)[0], lobbyNames(env.ns)[0])
	co := env.clientOpts()
	co.Timeout = 3 * time.Second
	start := time.Now()
	_, err := Attach(co)
	took := time.Since(start)
	require.ErrorIs(t, err, ErrNotYetInitialized)
	require.Contains(t, err.Error(), fmt.Sprintf("uid %d pid %d", nobody, pid))
	require.Less(t, took, time.Second)
	t.Logf("ErrNotYetInitialized past a squatter, 128 candidates tried: %v", took)
}

// TestSquattersEverywhere: with every candidate of the handle or of the lobby held by another
// uid (listening, or bound without listening), the owner still starts, on a fresh name, and
// says who holds the candidates; a client in another process attaches, a wrong secret still
// gets ErrAuthFailed, and a second owner of the namespace is still refused.
func TestSquattersEverywhere(t *testing.T) {
	exe := nobodyExe(t)
	for _, tt := range []struct {
		which    string
		bindOnly bool
	}{{"lobby", false}, {"attach handle", false}, {"lobby", true}, {"attach handle", true}} {
		t.Run(fmt.Sprintf("%s bind only %v", tt.which, tt.bindOnly), func(t *testing.T) {
			env := newTestEnv()
			names := lobbyNames(env.ns)
			if tt.which != "lobby" {
				names = handleNames(env.secret, env.ns)
			}
			pid := squatAs(t, exe, tt.bindOnly, names...)
			var logs syncBuffer
			opts := env.ownerOpts()
			opts.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			o := newTestOwner(t, opts)
			require.Contains(t, logs.String(), "serving on a fresh name")
			require.Contains(t, logs.String(), fmt.Sprintf("uid %d pid %d (64 names)", nobody, pid))
			if tt.which != "lobby" {
				require.True(t, isFreshHandle(env.secret, env.ns, o.handle), "fresh handle %q", o.handle)
			}
			require.NoError(t, ownerStore(o).Set("req", []byte("k")))
			kid := startProc(t, "client", env.childEnv()...)
			require.Equal(t, "ok ready", kid.Line())
			require.Equal(t, "ok "+hexOf("k"), kid.Do("get req"))
			kid.Exit()

			wrong := NewSecret([]byte("wrong-" + env.secretStr))
			_, err := Attach(ClientOptions{Secret: &wrong, Namespace: env.ns, Timeout: 3 * time.Second})
			require.ErrorIs(t, err, ErrAuthFailed, "a wrong secret is told so past the squatter")
			_, err = NewOwner(OwnerOptions{Secret: &wrong, Namespace: env.ns, Region: testRegion, Logger: quietLogger()})
			require.ErrorIs(t, err, ErrPreviouslyInitialized, "the owner on a fresh lobby is still found")
		})
	}
}

// TestSquatterFollowsRestarts: after each owner's life a squatter binds the names that owner
// used (they are listed in /proc/net/unix), 70 times: past the 64 candidates each restarted
// owner still starts, on names never used before, and clients attach to it (the last round's
// from another process).
func TestSquatterFollowsRestarts(t *testing.T) {
	exe := nobodyExe(t)
	env := newTestEnv()
	sq := startProcAs(t, exe, nobodyCred, "squatter", squatEnv+"=shmsteer-test-"+randHex(8))
	require.Equal(t, "ok ready", sq.Line())
	used := map[string]bool{}
	const rounds = rendezvousCandidates + 6
	for round := range rounds {
		o, err := NewOwner(env.ownerOpts())
		require.NoError(t, err, "round %d", round)
		lobby := o.lobby.Addr().(*net.UnixAddr).Name[1:]
		require.False(t, used[o.handle] || used[lobby], "round %d reuses a name", round)
		used[o.handle], used[lobby] = true, true
		require.NoError(t, ownerStore(o).Set("req", []byte(fmt.Sprint("k", round))))
		c, err := Attach(env.clientOpts())
		require.NoError(t, err, "round %d", round)
		got, err := clientStore(c).Get("req", nil)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("k", round), string(got))
		c.Close()
		if round == rounds-1 {
			kid := startProc(t, "client", env.childEnv()...)
			require.Equal(t, "ok ready", kid.Line(), "round %d", round)
			require.Equal(t, "ok "+hexOf(fmt.Sprint("k", round)), kid.Do("get req"))
			kid.Exit()
		}
		require.NoError(t, o.Close())
		// The squatter takes what the dead owner freed.
		require.Equal(t, "ok", sq.Do("squat "+o.handle+" "+lobby), "round %d", round)
	}
	require.True(t, isFreshHandle(env.secret, env.ns, func() string {
		o := newTestOwner(t, env.ownerOpts())
		return o.handle
	}()), "past the candidates, handles are fresh")
}

// TestLiveOwnerOnLaterCandidate: an owner that had to take a later candidate still keeps a
// second owner of its namespace (any secret) from starting once the squatter is gone.
func TestLiveOwnerOnLaterCandidate(t *testing.T) {
	exe := nobodyExe(t)
	env := newTestEnv()
	p := startProcAs(t, exe, nobodyCred, "squatter", squatEnv+"="+lobbyNames(env.ns)[0])
	require.Equal(t, "ok ready", p.Line())
	o := newTestOwner(t, env.ownerOpts())
	p.Kill()
	for _, s := range []Secret{env.secret, NewSecret([]byte("another"))} {
		opts := env.ownerOpts()
		opts.Secret = &s
		_, err := NewOwner(opts)
		require.ErrorIs(t, err, ErrPreviouslyInitialized)
	}
	c := attach(t, env.clientOpts())
	require.NoError(t, c.Ping())
	_ = o
}

// TestHolderOfBoundName: a name bound without listening refuses connections, so its holder
// is found through the kernel's socket diagnostics; one of the owner's own uid is taken for a
// live owner (ErrPreviouslyInitialized naming its pid).
func TestHolderOfBoundName(t *testing.T) {
	env := newTestEnv()
	name := lobbyNames(env.ns)[0]
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + name}))
	l, err := abstractHolder(name)
	require.NoError(t, err)
	require.Equal(t, listener{uid: os.Getuid(), pid: os.Getpid(), known: true}, l)
	_, err = abstractHolder(name + "-absent")
	require.Error(t, err)

	_, err = NewOwner(env.ownerOpts())
	require.ErrorIs(t, err, ErrPreviouslyInitialized)
	require.Contains(t, err.Error(), fmt.Sprintf("uid %d pid %d holds the lobby", os.Getuid(), os.Getpid()))
}

// TestFreshLobbyDecoys: a squatter holding every lobby candidate also binds 300 names of the
// namespace's fresh-lobby form. They are left out by uid before anything is dialed: a wrong
// secret still gets ErrAuthFailed at once, and a second owner still finds the first.
func TestFreshLobbyDecoys(t *testing.T) {
	exe := nobodyExe(t)
	env := newTestEnv()
	names := lobbyNames(env.ns)
	for range 300 {
		names = append(names, freshLobbyName(env.ns))
	}
	squat(t, exe, names...)
	newTestOwner(t, env.ownerOpts())
	wrong := NewSecret([]byte("wrong-" + env.secretStr))
	start := time.Now()
	_, err := Attach(ClientOptions{Secret: &wrong, Namespace: env.ns, Timeout: 3 * time.Second})
	require.ErrorIs(t, err, ErrAuthFailed)
	require.Less(t, time.Since(start), time.Second)
	_, err = NewOwner(OwnerOptions{Secret: &wrong, Namespace: env.ns, Region: testRegion, Logger: quietLogger()})
	require.ErrorIs(t, err, ErrPreviouslyInitialized)
	c := attach(t, env.clientOpts())
	require.NoError(t, c.Ping())
}
