package ipc

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/shmsteer/shmsteer/internal/proctest"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Multi-process tests. The test binary re-executes itself as TestHelperProcess with
// SHMSTEER_TEST_ROLE set; the child answers line commands on stdin with one line on stdout.

const (
	roleEnv          = "SHMSTEER_TEST_ROLE"
	nsEnv            = "SHMSTEER_TEST_NS"
	handleEnv        = "SHMSTEER_TEST_HANDLE"          // impostor: connect here whatever the secret
	spinEnv          = "SHMSTEER_TEST_SPIN"            // client: ClientOptions.SpinWait, a time.Duration string
	nondumpEnv       = "SHMSTEER_TEST_NONDUMP"         // owner, client: NonDumpable
	ownerUIDsEnv     = "SHMSTEER_TEST_OWNER_UIDS"      // client: ClientOptions.OwnerUIDs, comma-separated
	squatEnv         = "SHMSTEER_TEST_SQUAT"           // squatter: abstract names to bind and listen on, comma-separated
	squatBindOnlyEnv = "SHMSTEER_TEST_SQUAT_BIND_ONLY" // squatter: bind without listening
	frameTimeoutEnv  = "SHMSTEER_TEST_FRAME_TIMEOUT"   // owner: OwnerOptions.FrameTimeout
	nofileEnv        = "SHMSTEER_TEST_NOFILE"          // owner: RLIMIT_NOFILE to set first
)

var sentinelNames = proctest.Sentinels{
	{"ErrAuthSecretNotDefined", ErrAuthSecretNotDefined},
	{"ErrNotYetInitialized", ErrNotYetInitialized},
	{"ErrPreviouslyInitialized", ErrPreviouslyInitialized},
	{"ErrAuthFailed", ErrAuthFailed},
	{"ErrOwnerGone", ErrOwnerGone},
	{"ErrTimeout", ErrTimeout},
	{"ErrIncompatible", ErrIncompatible},
	{"ErrNotFound", shm.ErrNotFound},
	{"ErrClosed", ErrClosed},
}

func errName(err error) string { return sentinelNames.Name(err) }

func reply(err error, ok string) string { return sentinelNames.Reply(err, ok) }

// mappedRegions counts this process's mappings and descriptors of shmsteer memfds.
func mappedRegions() int {
	n := 0
	if maps, err := os.ReadFile("/proc/self/maps"); err == nil {
		n += strings.Count(string(maps), "memfd:shmsteer")
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(l, "memfd:shmsteer") {
			n++
		}
	}
	return n
}

// squatted keeps a squatter's listeners open.
var squatted []*net.UnixListener

func TestHelperProcess(t *testing.T) {
	role := os.Getenv(roleEnv)
	if role == "" {
		t.Skip("helper process for the multi-process tests")
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) { fmt.Fprintln(out, s); out.Flush() }
	h := &helperProc{role: role, ns: os.Getenv(nsEnv), say: say}
	say(reply(h.start(), "ready"))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if f := strings.Fields(in.Text()); len(f) > 0 {
			say(h.command(f))
		}
	}
	os.Exit(0)
}

// helperProc is TestHelperProcess's child in its role: what it attached, once it has.
type helperProc struct {
	role   string
	ns     string
	say    func(string)
	kv     *store // the test store (helpers_test.go), once attached
	region func() *shm.Region
	owner  *Owner
	client *Client
}

// start starts the role: an owner, a client, a squatter on the names in the environment, a
// probe (which attaches nothing) or an attach loop (which never returns).
func (h *helperProc) start() error {
	switch h.role {
	case "owner":
		return h.startOwner()
	case "probe":
		return nil // answers "probe PID" without attaching
	case "attachloop":
		attachLoop(h.ns, h.say) // answers "stats"; never returns
	case "squatter":
		return squatEnvNames()
	case "client":
		return h.startClient()
	default:
		return fmt.Errorf("unknown role %q", h.role)
	}
	return nil
}

func (h *helperProc) startOwner() error {
	frameTimeout, _ := time.ParseDuration(os.Getenv(frameTimeoutEnv))
	if n, err := strconv.ParseUint(os.Getenv(nofileEnv), 10, 64); err == nil {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
			return err
		}
	}
	o, err := NewOwner(OwnerOptions{Namespace: h.ns, Region: testRegion, Logger: quietLogger(),
		NonDumpable: os.Getenv(nondumpEnv) == "1", FrameTimeout: frameTimeout})
	if err != nil {
		return err
	}
	s := ownerStore(o)
	h.owner, h.kv, h.region = o, &s, o.Region
	return nil
}

// squatEnvNames binds the abstract names in squatEnv: listening on them, or (squatBindOnlyEnv) bound
// but never listening, so that connects are refused.
func squatEnvNames() error {
	if os.Getenv(squatBindOnlyEnv) == "1" {
		for _, name := range strings.Split(os.Getenv(squatEnv), ",") {
			fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
			if err != nil {
				return err
			}
			if err := unix.Bind(fd, &unix.SockaddrUnix{Name: "@" + name}); err != nil {
				return err
			}
		}
		return nil
	}
	return squatMore(strings.Split(os.Getenv(squatEnv), ","))
}

// squatMore listens on the abstract names, keeping the listeners until the process exits.
func squatMore(names []string) error {
	for _, name := range names {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: "@" + name, Net: "unix"})
		if err != nil {
			return err
		}
		squatted = append(squatted, ln)
	}
	return nil
}

func (h *helperProc) startClient() error {
	opts := ClientOptions{Namespace: h.ns, handle: os.Getenv(handleEnv), NonDumpable: os.Getenv(nondumpEnv) == "1"}
	for _, u := range strings.Split(os.Getenv(ownerUIDsEnv), ",") {
		if n, err := strconv.Atoi(u); err == nil {
			opts.OwnerUIDs = append(opts.OwnerUIDs, n)
		}
	}
	if v := os.Getenv(spinEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		opts.SpinWait = d
	}
	c, err := Attach(opts)
	if err != nil {
		return err
	}
	s := clientStore(c)
	h.client, h.kv, h.region = c, &s, c.Region
	return nil
}

// command answers one line; commands other than the unattached ones need the role started.
func (h *helperProc) command(f []string) string {
	switch f[0] {
	case "mapped", "attach", "exit", "probe", "attachn", "squat":
	default:
		if h.kv == nil {
			return "err not-attached"
		}
	}
	switch f[0] {
	case "attach":
		return reply(h.start(), "")
	case "squat": // squatter: bind and listen on more names
		return reply(squatMore(f[1:]), "")
	case "probe": // can this process read another's memory and descriptors?
		return probeProc(f[1])
	case "attachn": // attach N times; print how many distinct errors and the last
		n, _ := strconv.Atoi(f[1])
		return h.attachN(n)
	case "get":
		v, err := h.kv.Get(f[1], nil)
		return reply(err, hex.EncodeToString(v))
	case "set":
		v, _ := hex.DecodeString(f[2])
		return reply(h.kv.Set(f[1], v), "")
	case "remove":
		return reply(h.kv.Remove(f[1]), "")
	case "len":
		n, err := h.kv.Len()
		return reply(err, strconv.Itoa(n))
	case "claimed":
		return reply(nil, strconv.FormatUint(h.region().Stats().ReadersClaimed, 10))
	case "clients":
		return reply(nil, strconv.Itoa(h.owner.Clients()))
	case "mapped":
		return reply(nil, strconv.Itoa(mappedRegions()))
	case "benchping": // timed in the child: an empty RPC from a separate process
		n, _ := strconv.Atoi(f[1])
		var err error
		start := time.Now()
		for i := 0; i < n && err == nil; i++ {
			err = h.client.Ping()
		}
		return reply(err, strconv.FormatInt(int64(time.Since(start)), 10))
	case "exit":
		os.Exit(0)
	}
	return "err unknown-command"
}

// attachN attaches n times: "ok DISTINCT LAST", how many distinct outcomes and the last.
func (h *helperProc) attachN(n int) string {
	seen := map[string]bool{}
	var last string
	for range n {
		c, err := Attach(ClientOptions{Namespace: h.ns, OwnerUIDs: []int{0}})
		if err == nil {
			c.Close()
			last = "ok"
		} else {
			last = errName(err) + ": " + err.Error()
		}
		seen[last] = true
	}
	return fmt.Sprintf("ok %d %s", len(seen), last)
}

// proc is a child test process.
type proc = proctest.Proc

func startProc(t testing.TB, role string, env ...string) *proc {
	t.Helper()
	return startProcAs(t, os.Args[0], nil, role, env...)
}

// startProcAs starts exe (a copy of the test binary) as a helper process, as the user cred
// if not nil (see nobodyExe).
func startProcAs(t testing.TB, exe string, cred *syscall.Credential, role string, env ...string) *proc {
	t.Helper()
	if cred != nil {
		dir := filepath.Dir(exe)
		env = append(env, "HOME="+dir, "TMPDIR="+dir)
	}
	cmd := helperCmd(exe, role, env...)
	if cred != nil {
		cmd.Dir = filepath.Dir(exe)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	}
	return proctest.Start(t, cmd)
}

// helperCmd is the command of a helper process in role: exe (the test binary or a copy) with
// this process's environment, less the secret and other tests' variables, plus env.
func helperCmd(exe, role string, env ...string) *exec.Cmd {
	return proctest.Command(exe, []string{"-test.run=^TestHelperProcess$", "-test.count=1"},
		[]string{SecretEnv + "=", "SHMSTEER_TEST_"}, append([]string{roleEnv + "=" + role}, env...)...)
}

func (e testEnv) childEnv() []string {
	return []string{SecretEnv + "=" + e.secretStr, nsEnv + "=" + e.ns}
}

func hexOf(s string) string { return hex.EncodeToString([]byte(s)) }

func TestProcOwnerToClients(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	require.NoError(t, ownerStore(o).Set("req-a", []byte("alpha")))

	const n = 3
	var kids []*proc
	for i := range n {
		p := startProc(t, "client", env.childEnv()...)
		require.Equal(t, "ok ready", p.Line(), "child %d", i)
		kids = append(kids, p)
	}
	require.Equal(t, n, o.Clients())
	for i, p := range kids {
		require.Equal(t, "ok "+hexOf("alpha"), p.Do("get req-a"))
		require.Equal(t, "ok", p.Do(fmt.Sprintf("set child-%d %s", i, hexOf(fmt.Sprint("key-", i)))))
	}
	for i, p := range kids {
		got, err := ownerStore(o).Get(fmt.Sprintf("child-%d", i), nil)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint("key-", i), string(got))
		// Each child reads what another child wrote.
		j := (i + 1) % n
		require.Equal(t, "ok "+hexOf(fmt.Sprint("key-", j)), p.Do(fmt.Sprintf("get child-%d", j)))
		require.Equal(t, "ok 4", p.Do("len"))
	}
	require.NoError(t, ownerStore(o).Set("req-a", []byte("beta")))
	require.Equal(t, "ok "+hexOf("beta"), kids[0].Do("get req-a"))
	for _, p := range kids {
		p.Exit()
	}
	require.Eventually(t, func() bool { return o.Clients() == 0 }, 20*time.Second, time.Millisecond)
}

func TestProcAuthErrors(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	require.NoError(t, ownerStore(o).Set("req", []byte("secret-key")))

	tests := []struct {
		name, role string
		env        []string
		want       string
	}{
		{"wrong secret at the owner's handle", "client",
			[]string{SecretEnv + "=wrong-" + env.secretStr, nsEnv + "=" + env.ns, handleEnv + "=" + o.handle}, "err ErrAuthFailed"},
		{"wrong secret", "client", []string{SecretEnv + "=wrong-" + env.secretStr, nsEnv + "=" + env.ns}, "err ErrAuthFailed"},
		{"no secret client", "client", []string{nsEnv + "=" + env.ns}, "err ErrAuthSecretNotDefined"},
		{"empty secret client", "client", []string{SecretEnv + "=", nsEnv + "=" + env.ns}, "err ErrAuthSecretNotDefined"},
		{"no secret owner", "owner", []string{nsEnv + "=" + env.ns}, "err ErrAuthSecretNotDefined"},
		{"other namespace", "client", []string{SecretEnv + "=" + env.secretStr, nsEnv + "=" + env.ns + "-other"}, "err ErrNotYetInitialized"},
		{"second owner in another process", "owner", env.childEnv(), "err ErrPreviouslyInitialized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := startProc(t, tt.role, tt.env...)
			require.Equal(t, tt.want, p.Line())
			require.Equal(t, "ok 0", p.Do("mapped"), "nothing of the region is mapped")
			require.Equal(t, "err not-attached", p.Do("get req"))
			p.Exit()
		})
	}
	require.Zero(t, o.Clients())
	_, err := NewOwner(env.ownerOpts())
	require.ErrorIs(t, err, ErrPreviouslyInitialized, "second owner in this process")
}

func TestProcAttachBeforeOwner(t *testing.T) {
	env := newTestEnv()
	p := startProc(t, "client", env.childEnv()...)
	require.Equal(t, "err ErrNotYetInitialized", p.Line())
	o := newTestOwner(t, env.ownerOpts())
	require.NoError(t, ownerStore(o).Set("req", []byte("k")))
	require.Equal(t, "ok", p.Do("attach"))
	require.Equal(t, "ok "+hexOf("k"), p.Do("get req"))
	p.Exit()
}

// listing returns the names in dir.
func listing(t *testing.T, dir string) map[string]bool {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	require.NoError(t, err)
	m := map[string]bool{}
	for _, e := range ents {
		m[e.Name()] = true
	}
	return m
}

func TestProcOwnerKilled(t *testing.T) {
	env := newTestEnv()
	beforeShm, beforeTmp := listing(t, "/dev/shm"), listing(t, os.TempDir())
	ownerTmp := t.TempDir()

	owner := startProc(t, "owner", append(env.childEnv(), "TMPDIR="+ownerTmp)...)
	require.Equal(t, "ok ready", owner.Line())
	require.Equal(t, "ok", owner.Do("set req "+hexOf("last-state")))
	handle := handleNames(env.secret, env.ns)[0]
	unixTable, err := os.ReadFile("/proc/net/unix")
	require.NoError(t, err)
	require.Contains(t, string(unixTable), "@"+handle)

	kid := startProc(t, "client", env.childEnv()...)
	require.Equal(t, "ok ready", kid.Line())
	c := attach(t, env.clientOpts()) // this process attaches too
	require.Equal(t, "ok 2", owner.Do("clients"))
	require.Equal(t, "ok "+hexOf("last-state"), kid.Do("get req"))
	require.NoError(t, clientStore(c).Set("from-parent", []byte("p")))

	owner.Kill()

	got, err := clientStore(c).Get("req", nil)
	require.NoError(t, err, "reads go on from the last state")
	require.Equal(t, "last-state", string(got))
	got, err = clientStore(c).Get("from-parent", nil)
	require.NoError(t, err)
	require.Equal(t, "p", string(got))
	require.ErrorIs(t, clientStore(c).Set("req", []byte("new")), ErrOwnerGone)
	require.ErrorIs(t, clientStore(c).Remove("req"), ErrOwnerGone)
	require.ErrorIs(t, c.Ping(), ErrOwnerGone)

	require.Equal(t, "ok "+hexOf("last-state"), kid.Do("get req"))
	require.Equal(t, "err ErrOwnerGone", kid.Do("set req "+hexOf("x")))
	require.Equal(t, "err ErrOwnerGone", kid.Do("remove req"))
	kid.Exit()

	_, err = Attach(env.clientOpts())
	require.ErrorIs(t, err, ErrNotYetInitialized)

	// Nothing left behind: no socket name, no files. /tmp and /dev/shm are shared with other
	// processes on this machine, so only entries that could be ours count.
	unixTable, err = os.ReadFile("/proc/net/unix")
	require.NoError(t, err)
	require.NotContains(t, string(unixTable), handle)
	require.Empty(t, listing(t, ownerTmp), "the owner wrote nothing in its TMPDIR")
	for dir, before := range map[string]map[string]bool{"/dev/shm": beforeShm, os.TempDir(): beforeTmp} {
		for name := range listing(t, dir) {
			if before[name] {
				continue
			}
			// Only a name carrying this test's namespace or the owner's pid is the owner's:
			// other test binaries (cmd/shmsteer's shmsteer-e2e-* dirs, other packages run in
			// parallel by go test) create "shmsteer" names here at the same time. The owner's
			// own temporary files would be in ownerTmp, checked empty above.
			ours := strings.Contains(name, env.ns) ||
				strings.Contains(name, strconv.Itoa(owner.Cmd.Process.Pid))
			require.False(t, ours, "left behind: %s/%s", dir, name)
			if dir == "/dev/shm" || strings.Contains(name, "shmsteer") {
				t.Logf("new entry in %s (another process's?): %s", dir, name)
			}
		}
	}
}

func TestProcClientKilled(t *testing.T) {
	env := newTestEnv()
	o := newTestOwner(t, env.ownerOpts())
	require.NoError(t, ownerStore(o).Set("req", []byte("k")))
	base := o.Region().Stats().ReadersClaimed

	kids := []*proc{startProc(t, "client", env.childEnv()...), startProc(t, "client", env.childEnv()...)}
	for _, p := range kids {
		require.Equal(t, "ok ready", p.Line())
		require.Equal(t, "ok "+hexOf("k"), p.Do("get req")) // claims a reader slot
	}
	require.Equal(t, base+2, o.Region().Stats().ReadersClaimed)
	require.Equal(t, 2, o.Clients())

	kids[0].Kill()
	require.Eventually(t, func() bool {
		return o.Region().Stats().ReadersClaimed == base+1 && o.Clients() == 1
	}, 20*time.Second, time.Millisecond, "the killed client's slot is freed")
	require.Equal(t, "ok "+hexOf("k"), kids[1].Do("get req"), "the other client is untouched")
	require.Equal(t, base+1, o.Region().Stats().ReadersClaimed)

	kids[1].Exit() // clean exit: releases its own slot
	require.Eventually(t, func() bool {
		return o.Region().Stats().ReadersClaimed == base && o.Clients() == 0
	}, 20*time.Second, time.Millisecond)
}

// probeProc reports whether this process can open /proc/PID/mem and list /proc/PID/fd.
func probeProc(pid string) string {
	res := func(err error) string {
		if err != nil {
			return "denied"
		}
		return "ok"
	}
	f, err := os.Open("/proc/" + pid + "/mem")
	if err == nil {
		f.Close()
	}
	_, ferr := os.ReadDir("/proc/" + pid + "/fd")
	return "mem " + res(err) + " fd " + res(ferr)
}
