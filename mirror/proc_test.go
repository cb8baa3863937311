package mirror

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/internal/proctest"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// Multi-process tests. The test binary re-executes itself: as a NATS server ("nats", the
// embedded nats-server package, so a test can SIGKILL it and restart it on the same store),
// as a host's owner ("host": ipc owner + steer engine + mirror) and as a host's worker
// ("worker": attached to its host's owner). Hosts and workers answer line commands on stdin
// with one line on stdout.

const (
	roleEnv  = "MIRROR_TEST_ROLE"
	nsEnv    = "MIRROR_TEST_NS"
	hostEnv  = "MIRROR_TEST_HOST"
	urlEnv   = "MIRROR_TEST_URL"
	dirEnv   = "MIRROR_TEST_DIR"
	portEnv  = "MIRROR_TEST_PORT"
	keysEnv  = "MIRROR_TEST_KEYS"
	limitEnv = "MIRROR_TEST_INLINE"
	purgeEnv = "MIRROR_TEST_PURGE_MS"
	// remoteEnv is Options.RemoteEntries.
	remoteEnv = "MIRROR_TEST_REMOTE_N"
	// syncEnv "always" makes the server fsync every message before acknowledging it (NATS's
	// sync_interval: always); by default it fsyncs every 2 minutes, but writes each message
	// to its file before the acknowledgement (a stream of one replica flushes in place), so
	// a SIGKILLed server loses nothing it acknowledged; only a machine crash could.
	syncEnv = "MIRROR_TEST_SYNC"
)

// testCfg: 16 KiB vectors; 80 entries make a 1.3 MB set, above NATS's 1 MB max payload.
var testCfg = steer.ModelConfig{Hidden: 4096, Layers: 16}

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "":
		os.Exit(m.Run())
	case "nats":
		runNATS()
	case "host":
		runHost()
	case "worker":
		runWorker()
	}
	os.Exit(0)
}

func quiet() *slog.Logger {
	if os.Getenv("SHMSTEER_MIRROR_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// runNATS serves JetStream on 127.0.0.1:$port with its store in $dir until killed.
func runNATS() {
	port, _ := strconv.Atoi(os.Getenv(portEnv))
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true,
		StoreDir: os.Getenv(dirEnv), SyncAlways: os.Getenv(syncEnv) == "always", NoSigs: true, NoLog: true})
	if err != nil {
		fmt.Println("err", err)
		return
	}
	s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		fmt.Println("err not ready")
		return
	}
	fmt.Println("ok ready")
	select {}
}

// vecs is a deterministic steering set: n entries, the first float of each is seed.
func vecs(seed uint64, n int) []steer.Vector {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([]steer.Vector, n)
	for i := range out {
		d := make([]float32, testCfg.Hidden)
		for j := range d {
			d[j] = float32(rng.NormFloat64()) * 0.01
		}
		d[0] = float32(seed)
		out[i] = steer.Vector{Hook: steer.DefaultHooks[i%5], Layer: i / 5, Scale: 1, Data: d}
	}
	return out
}

// proc is a child process speaking the line protocol.
type proc struct {
	*proctest.Proc
	t testing.TB
}

func startProc(t testing.TB, role string, env ...string) *proc {
	t.Helper()
	cmd := proctest.Command(os.Args[0], []string{"-test.run=^$"},
		[]string{ipc.SecretEnv + "=", "MIRROR_TEST_"}, append([]string{roleEnv + "=" + role}, env...)...)
	p := &proc{Proc: proctest.Start(t, cmd), t: t}
	p.Timeout = 40 * time.Second
	return p
}

func (p *proc) status() Status {
	p.t.Helper()
	var st Status
	require.NoError(p.t, json.Unmarshal([]byte(p.OK("status")), &st))
	return st
}

// natsServer is a JetStream server in a child process with its store in a temp dir.
type natsServer struct {
	t    testing.TB
	dir  string
	port int
	p    *proc
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func startNATS(t testing.TB) *natsServer {
	n := &natsServer{t: t, dir: filepath.Join(t.TempDir(), "js"), port: freePort(t)}
	n.start()
	return n
}

func (n *natsServer) start() {
	n.t.Helper()
	n.p = startProc(n.t, "nats", dirEnv+"="+n.dir, portEnv+"="+strconv.Itoa(n.port), syncEnv+"="+os.Getenv("SHMSTEER_MIRROR_SYNC"))
	if l := n.p.Line(); l != "ok ready" {
		n.t.Skipf("the embedded NATS server did not start: %s", l)
	}
}

func (n *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// proxy forwards TCP to target until cut: then it drops every connection and refuses new
// ones, a network partition between one host and NATS.
type proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  map[net.Conn]struct{}
}

func startProxy(t testing.TB, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.setCut(true) })
	go p.serve()
	return p
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			p.mu.Lock()
			cut := p.cut
			p.mu.Unlock()
			if cut {
				c.Close()
				return
			}
			b, err := net.DialTimeout("tcp", p.target, time.Second)
			if err != nil {
				c.Close()
				return
			}
			p.mu.Lock()
			if p.cut {
				p.mu.Unlock()
				c.Close()
				b.Close()
				return
			}
			p.conns[c], p.conns[b] = struct{}{}, struct{}{}
			p.mu.Unlock()
			done := func() {
				c.Close()
				b.Close()
				p.mu.Lock()
				delete(p.conns, c)
				delete(p.conns, b)
				p.mu.Unlock()
			}
			go func() { io.Copy(b, c); done() }()
			io.Copy(c, b)
			done()
		}()
	}
}

func (p *proxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for c := range p.conns {
			c.Close()
		}
	}
}

// host is one simulated host: an owner with a mirror and one attached worker.
type host struct {
	id     string
	secret string
	owner  *proc
	worker *proc
	proxy  *proxy
}

type hostOpts struct {
	keys   bool
	inline int
	proxy  bool // connect through a proxy that can be cut
	purge  time.Duration
	remote int // Options.RemoteEntries
}

func startHosts(t testing.TB, n *natsServer, secret string, ids []string, o hostOpts) []*host {
	t.Helper()
	var hs []*host
	for _, id := range ids {
		h := &host{id: id, secret: secret}
		url := n.url()
		if o.proxy {
			h.proxy = startProxy(t, fmt.Sprintf("127.0.0.1:%d", n.port))
			url = h.proxy.url()
		}
		ns := fmt.Sprintf("mirror-test-%s-%d-%s", id, os.Getpid(), secret[len(secret)-8:])
		keys := "0"
		if o.keys {
			keys = "1"
		}
		env := []string{ipc.SecretEnv + "=" + secret, nsEnv + "=" + ns, hostEnv + "=" + id, urlEnv + "=" + url,
			keysEnv + "=" + keys, limitEnv + "=" + strconv.Itoa(o.inline), remoteEnv + "=" + strconv.Itoa(o.remote), purgeEnv + "=" + strconv.Itoa(int(o.purge/time.Millisecond))}
		h.owner = startProc(t, "host", env...)
		require.Equal(t, "ok ready", h.owner.Line(), "host %s", id)
		h.worker = startProc(t, "worker", ipc.SecretEnv+"="+secret, nsEnv+"="+ns)
		require.Equal(t, "ok ready", h.worker.Line(), "worker of %s", id)
		hs = append(hs, h)
	}
	return hs
}

func newSecret() string { return fmt.Sprintf("mirror-test-secret-%016x", rand.Uint64()) }

// eventually polls cmd on p until it answers want.
func eventually(t testing.TB, p *proc, cmd, want string, within time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(within)
	got := ""
	for time.Now().Before(deadline) {
		if got = p.Do(cmd); got == want {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	require.Failf(t, "no convergence", "%s: %s answers %q, want %q", what, cmd, got, want)
}
