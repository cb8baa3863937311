package mirror

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/shmsteer/shmsteer/internal/proctest"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
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

func runHost() {
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) { fmt.Fprintln(out, s); out.Flush() }
	fail := func(err error) { say("err " + strings.ReplaceAll(err.Error(), "\n", " ")); os.Exit(1) }
	rc, err := steer.RegionConfig(testCfg, shm.Config{IndexSlots: 1 << 14, ArenaBytes: 64 << 20, ReaderSlots: 64})
	if err != nil {
		fail(err)
	}
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Namespace: os.Getenv(nsEnv), Region: rc, Logger: quiet()})
	if err != nil {
		fail(err)
	}
	eng, err := steer.Open(owner.Region(), &testCfg, steer.Options{Clients: owner.Clients})
	if err != nil {
		fail(err)
	}
	eng.Serve(func(op uint16, h func([]byte) ([]byte, error)) { owner.Handle(op, h) })
	reg, err := keys.Open(owner, keys.Options{Logger: quiet()})
	if err != nil {
		fail(err)
	}
	secret, err := ipc.SecretFromEnv()
	if err != nil {
		fail(err)
	}
	inline, _ := strconv.Atoi(os.Getenv(limitEnv))
	purgeMS, _ := strconv.Atoi(os.Getenv(purgeEnv))
	remoteN, _ := strconv.Atoi(os.Getenv(remoteEnv))
	m, err := Start(context.Background(), Options{URL: os.Getenv(urlEnv), HostID: os.Getenv(hostEnv),
		MirrorKeys: os.Getenv(keysEnv) == "1", Secret: &secret, Engine: eng, Keys: reg,
		InlineLimit: inline, RemoteEntries: remoteN, KeyPurgeAfter: time.Duration(purgeMS) * time.Millisecond, Logger: quiet()})
	if err != nil {
		fail(err)
	}
	say("ok ready")
	var load sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		arg := func(i int) uint64 { n, _ := strconv.ParseUint(f[i], 10, 64); return n }
		switch f[0] {
		case "reg": // reg NAME SEED N: replies with the wall time just before the write
			t0 := time.Now().UnixNano()
			_, err := eng.Register(f[1], vecs(arg(2), int(arg(3))))
			say(reply(err, strconv.FormatInt(t0, 10)))
		case "unreg":
			_, err := eng.Unregister(f[1])
			say(reply(err, ""))
		case "conv": // conv TENANT ID ("-": none): the conversation's gates entry's length, or none
			tenant := f[1]
			if tenant == "-" {
				tenant = ""
			}
			b, found, err := eng.GateConversation(steer.ConvKey{Tenant: tenant, ID: f[2]})
			switch {
			case err != nil:
				say("err " + err.Error())
			case !found:
				say("none")
			default:
				say(fmt.Sprintf("ok %d", len(b)))
			}
		case "mkconv": // mkconv ID: admit request ID in conversation ID with a rest_of_conversation gate
			k := steer.ConvKey{ID: f[1]}
			_, err := eng.Admit(convAdmission(f[1], k))
			if err == nil {
				_, err = eng.End(f[1]) // the conversation's entry stays
			}
			say(reply(err, ""))
		case "dropconv": // dropconv ID: drop conversation ID's entry
			found, err := eng.DropGateConversation(steer.ConvKey{ID: f[1]})
			say(reply(err, strconv.FormatBool(found)))
		case "reghint": // reghint NAME SEED N HINT: with a model hint
			_, err := eng.Register(f[1], vecs(arg(2), int(arg(3))), steer.ModelHint(f[4]))
			say(reply(err, ""))
		case "regprobe": // regprobe NAME SEED: a probe vector (one site)
			_, err := eng.RegisterProbe(f[1], vecs(arg(2), 1))
			say(reply(err, ""))
		case "unregprobe":
			_, err := eng.UnregisterProbe(f[1])
			say(reply(err, ""))
		case "global": // global NAME STRENGTH (NAME "-" clears)
			g := steer.Steering{}
			if f[1] != "-" {
				g.Base.Refs = []steer.Ref{{Name: f[1], Strength: float32(arg(2))}}
			}
			_, err := eng.SetGlobal(g)
			say(reply(err, ""))
		case "setkey":
			v, _ := hex.DecodeString(f[2])
			say(reply(reg.Set(f[1], v), ""))
		case "rmkey":
			say(reply(reg.Remove(f[1]), ""))
		case "load": // load RATE MS: set keys ld-0..ld-1023 at RATE/s for MS, in the background
			rate, ms := arg(1), arg(2)
			load.Add(1)
			go func() {
				defer load.Done()
				tick := time.NewTicker(time.Second / time.Duration(rate))
				defer tick.Stop()
				end := time.Now().Add(time.Duration(ms) * time.Millisecond)
				key := make([]byte, 32)
				for i := 0; time.Now().Before(end); i++ {
					<-tick.C
					key[0] = byte(i)
					reg.Set(fmt.Sprintf("ld-%d", i%1024), key)
				}
			}()
			say("ok")
		case "fill": // fill N: set keys ld-0..ld-N-1 (32 zero bytes) now
			var err error
			for i := range int(arg(1)) {
				if err = reg.Set(fmt.Sprintf("ld-%d", i), make([]byte, 32)); err != nil {
					break
				}
			}
			say(reply(err, ""))
		case "loadwait":
			load.Wait()
			say("ok")
		case "drain": // wait until every local change is acknowledged by the server
			deadline := time.Now().Add(30 * time.Second)
			for !m.idle() && time.Now().Before(deadline) {
				time.Sleep(2 * time.Millisecond)
			}
			say(reply(nil, strconv.FormatBool(m.idle())))
		case "entries":
			m.mu.Lock()
			n := len(m.entries)
			m.mu.Unlock()
			say(reply(nil, strconv.Itoa(n)))
		case "status":
			b, _ := json.Marshal(m.Status())
			say("ok " + string(b))
		case "exit":
			m.Close()
			owner.Close()
			os.Exit(0)
		default:
			say("err unknown-command")
		}
	}
}

// idle reports whether no local change waits to be published or acknowledged.
func (m *Mirror) idle() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.queue) > 0 || m.sending > 0 {
		return false
	}
	for _, e := range m.entries {
		if e.queued || e.inflight {
			return false
		}
	}
	return true
}

func runWorker() {
	out := bufio.NewWriter(os.Stdout)
	say := func(s string) { fmt.Fprintln(out, s); out.Flush() }
	c, err := ipc.Attach(ipc.ClientOptions{Namespace: os.Getenv(nsEnv), Timeout: 20 * time.Second})
	if err != nil {
		say(reply(err, ""))
		os.Exit(1)
	}
	eng, err := steer.Attach(c.Region(), &testCfg, steer.Options{Caller: c})
	if err != nil {
		say(reply(err, ""))
		os.Exit(1)
	}
	reg, err := keys.Attach(c)
	if err != nil {
		say(reply(err, ""))
		os.Exit(1)
	}
	kr, err := reg.NewReader()
	if err != nil {
		say(reply(err, ""))
		os.Exit(1)
	}
	say("ok ready")
	// seedOf reads the first float of a named vector (its seed; "none" if not registered).
	seedOfKind := func(name string, read func(*shm.Snapshot, string) (steer.NamedVector, error)) string {
		s, err := c.Region().Snapshot()
		if err != nil {
			return "err " + err.Error()
		}
		defer s.Close()
		nv, err := read(&s, name)
		if errors.Is(err, steer.ErrUnknownVector) {
			return "none"
		} else if err != nil {
			return "err " + err.Error()
		}
		return fmt.Sprintf("%d/%d", int64(nv.Vectors[0].Data[0]), len(nv.Vectors))
	}
	seedOf := func(name string) string { return seedOfKind(name, eng.Vector) }
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "reg": // reg NAME SEED N: a worker's write, through the owner (RPC)
			n, _ := strconv.Atoi(f[3])
			seed, _ := strconv.ParseUint(f[2], 10, 64)
			_, err := eng.Register(f[1], vecs(seed, n))
			say(reply(err, ""))
		case "vec":
			say(seedOf(f[1]))
		case "probe":
			say(seedOfKind(f[1], eng.Probe))
		case "hint": // hint NAME: the vector's seed and model hint, "SEED/N HINT"
			s, err := c.Region().Snapshot()
			if err != nil {
				say("err " + err.Error())
				continue
			}
			meta, err := eng.VectorMeta(&s, f[1])
			s.Close()
			say(reply(err, seedOf(f[1])+" "+meta.ModelHint))
		case "wait": // wait NAME WANT: poll until seedOf(NAME) == WANT; reply with the wall time
			deadline := time.Now().Add(20 * time.Second)
			got := seedOf(f[1])
			for got != f[2] && time.Now().Before(deadline) {
				// Leave the CPU to the others (2 cores here) for ~10 µs: time.Sleep rounds this
				// up to about a millisecond on this kernel, nanosleep(2) to ~80 µs.
				syscall.Nanosleep(&syscall.Timespec{Nsec: 10_000}, nil)
				got = seedOf(f[1])
			}
			t1 := time.Now().UnixNano()
			if got != f[2] {
				say("err timeout: " + got)
				continue
			}
			say("ok " + strconv.FormatInt(t1, 10))
		case "global":
			s, err := c.Region().Snapshot()
			if err != nil {
				say(reply(err, ""))
				continue
			}
			b, _, found, err := eng.Encoding(&s, steer.ChangeGlobal, "")
			res := "none"
			if found {
				g, _, derr := steer.DecodeSteering(b, testCfg)
				err = derr
				if err == nil && len(g.Base.Refs) == 1 {
					res = fmt.Sprintf("%s*%g", g.Base.Refs[0].Name, g.Base.Refs[0].Strength)
				}
			}
			s.Close()
			say(reply(err, res))
		case "key":
			v, err := kr.Get(f[1], nil)
			say(reply(err, hex.EncodeToString(v)))
		case "getlat": // getlat N: time N Gets of 1024 keys ld-*, one by one; reply p50 p99 ns
			n, _ := strconv.Atoi(f[1])
			ids := make([]string, 1024)
			for i := range ids {
				ids[i] = fmt.Sprintf("ld-%d", i)
			}
			lat := make([]int64, n)
			buf := make([]byte, 0, 64)
			var gerr error
			for i := range n {
				t := time.Now()
				buf, gerr = kr.Get(ids[i&1023], buf[:0])
				lat[i] = int64(time.Since(t))
				if gerr != nil {
					break
				}
			}
			if gerr != nil {
				say(reply(gerr, ""))
				continue
			}
			slices.Sort(lat)
			say(fmt.Sprintf("ok %d %d", lat[n/2], lat[n*99/100]))
		case "exit":
			kr.Close()
			c.Close()
			os.Exit(0)
		default:
			say("err unknown-command")
		}
	}
}

func reply(err error, ok string) string {
	if err != nil {
		switch {
		case errors.Is(err, keys.ErrRevoked):
			return "err revoked"
		case errors.Is(err, keys.ErrNotFound):
			return "err notfound"
		}
		return "err " + strings.ReplaceAll(err.Error(), "\n", " ")
	}
	return strings.TrimSpace("ok " + ok)
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
