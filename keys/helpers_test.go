package keys

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/shmsteer/shmsteer/internal/proctest"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/stretchr/testify/require"
)

// testRegion is small, so tests start fast.
var testRegion = shm.Config{IndexSlots: 1024, ArenaBytes: 1 << 20, ReaderSlots: 64}

func randHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// testEnv is a fresh secret and namespace, so tests never meet each other's owners.
type testEnv struct {
	secret    ipc.Secret
	secretStr string
	ns        string
}

func newTestEnv() testEnv {
	s := "test-secret-" + randHex(16)
	return testEnv{secret: ipc.NewSecret([]byte(s)), secretStr: s, ns: "ns-" + randHex(8)}
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// ownerOpts are an owner's and its registry's options; the Logger serves both.
type ownerOpts struct {
	ipc.OwnerOptions
	Grace       time.Duration
	MaxKeyBytes int
}

func (e testEnv) ownerOpts() ownerOpts {
	return ownerOpts{OwnerOptions: ipc.OwnerOptions{Secret: &e.secret, Namespace: e.ns, Region: testRegion, Logger: quietLogger()}}
}

func (e testEnv) clientOpts() ipc.ClientOptions {
	return ipc.ClientOptions{Secret: &e.secret, Namespace: e.ns}
}

// testOwner is an owner and its registry; testClient a client and its.
type testOwner struct {
	*ipc.Owner
	reg *Owner
}

type testClient struct {
	*ipc.Client
	reg *Worker
}

func newTestOwner(t testing.TB, opts ownerOpts) testOwner {
	t.Helper()
	o, err := ipc.NewOwner(opts.OwnerOptions)
	require.NoError(t, err)
	t.Cleanup(func() { o.Close() })
	k, err := Open(o, Options{Grace: opts.Grace, MaxKeyBytes: opts.MaxKeyBytes, Logger: opts.Logger})
	require.NoError(t, err)
	return testOwner{o, k}
}

func attach(t testing.TB, opts ipc.ClientOptions) testClient {
	t.Helper()
	c, err := ipc.Attach(opts)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	k, err := Attach(c)
	require.NoError(t, err)
	return testClient{c, k}
}

// syncBuffer is a log sink safe for the owner's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
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

// Multi-process tests. The test binary re-executes itself as TestHelperProcess with
// SHMSTEER_TEST_ROLE=client; the child attaches (ipc.Attach, then Attach) and answers line
// commands on stdin with one line on stdout.

const (
	roleEnv = "SHMSTEER_TEST_ROLE"
	nsEnv   = "SHMSTEER_TEST_NS"
	spinEnv = "SHMSTEER_TEST_SPIN" // ClientOptions.SpinWait, a time.Duration string
)

var sentinelNames = proctest.Sentinels{
	{"ErrNotFound", ErrNotFound},
	{"ErrRevoked", ErrRevoked},
	{"ErrRequestIDTooLong", ErrRequestIDTooLong},
	{"ErrTooLarge", ErrTooLarge},
	{"ErrOwnerGone", ipc.ErrOwnerGone},
	{"ErrClosed", shm.ErrClosed},
}

func reply(err error, ok string) string { return sentinelNames.Reply(err, ok) }

func TestHelperProcess(t *testing.T) {
	if os.Getenv(roleEnv) != "client" {
		t.Skip("helper process for the multi-process tests")
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) { fmt.Fprintln(out, s); out.Flush() }
	opts := ipc.ClientOptions{Namespace: os.Getenv(nsEnv)}
	if v := os.Getenv(spinEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			say(reply(err, ""))
			os.Exit(1)
		}
		opts.SpinWait = d
	}
	c, err := ipc.Attach(opts)
	var keys *Worker
	if err == nil {
		keys, err = Attach(c)
	}
	say(reply(err, "ready"))
	if err != nil {
		os.Exit(1)
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "get":
			v, err := keys.Get(f[1], nil)
			say(reply(err, hex.EncodeToString(v)))
		case "set":
			v, _ := hex.DecodeString(f[2])
			say(reply(keys.Set(f[1], v), ""))
		case "remove":
			say(reply(keys.Remove(f[1]), ""))
		case "len":
			n, _, err := keys.Count()
			say(reply(err, strconv.Itoa(n)))
		case "benchset", "benchget", "benchregget":
			// Timed in the child: the RPC or the read from a separate process.
			n, _ := strconv.Atoi(f[1])
			ids := benchKeys(1024)
			key := make([]byte, 32)
			buf := make([]byte, 0, 64)
			kr, err := keys.NewReader()
			if err != nil {
				say(reply(err, ""))
				continue
			}
			start := time.Now()
			for i := 0; i < n && err == nil; i++ {
				switch f[0] {
				case "benchset":
					err = keys.Set(ids[i&1023], key)
				case "benchget":
					buf, err = kr.Get(ids[i&1023], buf[:0])
				default:
					buf, err = keys.Get(ids[i&1023], buf[:0])
				}
			}
			elapsed := time.Since(start)
			kr.Close()
			say(reply(err, strconv.FormatInt(int64(elapsed), 10)))
		case "exit":
			os.Exit(0)
		default:
			say("err unknown-command")
		}
	}
	os.Exit(0)
}

// proc is a child test process.
type proc = proctest.Proc

// startClient starts a helper process attached to env's owner, with env's secret and namespace
// and the extra environment variables.
func startClient(t testing.TB, env testEnv, extra ...string) *proc {
	t.Helper()
	vars := append([]string{roleEnv + "=client", ipc.SecretEnv + "=" + env.secretStr, nsEnv + "=" + env.ns}, extra...)
	return proctest.Start(t, proctest.Command(os.Args[0], []string{"-test.run=^TestHelperProcess$", "-test.count=1"},
		[]string{ipc.SecretEnv + "=", "SHMSTEER_TEST_"}, vars...))
}

func hexOf(s string) string { return hex.EncodeToString([]byte(s)) }

// benchKeys are UUID-shaped request ids with 32-byte keys, as in bench/keys.go.
func benchKeys(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%08x-1234-5678-9abc-%012x", i, i*7919)
	}
	return ids
}

func sprintf(format string, a ...any) string { return fmt.Sprintf(format, a...) }
