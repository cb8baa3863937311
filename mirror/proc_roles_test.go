package mirror

import (
	"bufio"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// The child roles of the multi-process tests (proc_test.go): a host's owner and a host's
// worker, each answering line commands on stdin with one line on stdout.

// say writes one reply line to stdout.
func say(s string) { fmt.Fprintln(os.Stdout, s) }

// sayErr replies with err on one line and exits.
func sayErr(err error) {
	say("err " + strings.ReplaceAll(err.Error(), "\n", " "))
	os.Exit(1)
}

// lineLoop answers each non-empty line of stdin, split into fields, with do's reply.
func lineLoop(do func(f []string) string) {
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if f := strings.Fields(in.Text()); len(f) > 0 {
			say(do(f))
		}
	}
}

// hostProc is the "host" role: an ipc owner with a steer engine, a key registry and a mirror.
type hostProc struct {
	owner *ipc.Owner
	eng   *steer.Owner
	reg   *keys.Owner
	m     *Mirror
	load  sync.WaitGroup
}

func runHost() {
	h, err := startHostProc()
	if err != nil {
		sayErr(err)
	}
	say("ok ready")
	lineLoop(h.command)
}

// startHostProc opens the owner, its engine and registry, and starts the mirror as the
// environment says (the *Env constants).
func startHostProc() (*hostProc, error) {
	h := &hostProc{}
	rc, err := steer.RegionConfig(testCfg, shm.Config{IndexSlots: 1 << 14, ArenaBytes: 64 << 20, ReaderSlots: 64})
	if err != nil {
		return nil, err
	}
	if h.owner, err = ipc.NewOwner(ipc.OwnerOptions{Namespace: os.Getenv(nsEnv), Region: rc, Logger: quiet()}); err != nil {
		return nil, err
	}
	if h.eng, err = steer.Open(h.owner.Region(), &testCfg, steer.Options{Clients: h.owner.Clients}); err != nil {
		return nil, err
	}
	h.eng.Serve(func(op uint16, fn func([]byte) ([]byte, error)) { h.owner.Handle(op, fn) })
	if h.reg, err = keys.Open(h.owner, keys.Options{Logger: quiet()}); err != nil {
		return nil, err
	}
	secret, err := ipc.SecretFromEnv()
	if err != nil {
		return nil, err
	}
	inline, _ := strconv.Atoi(os.Getenv(limitEnv))
	purgeMS, _ := strconv.Atoi(os.Getenv(purgeEnv))
	remoteN, _ := strconv.Atoi(os.Getenv(remoteEnv))
	h.m, err = Start(context.Background(), Options{URL: os.Getenv(urlEnv), HostID: os.Getenv(hostEnv),
		MirrorKeys: os.Getenv(keysEnv) == "1", Secret: &secret, Engine: h.eng, Keys: h.reg,
		InlineLimit: inline, RemoteEntries: remoteN, KeyPurgeAfter: time.Duration(purgeMS) * time.Millisecond, Logger: quiet()})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// uintArg is field i of f as an unsigned number (0 if it is not one).
func uintArg(f []string, i int) uint64 { n, _ := strconv.ParseUint(f[i], 10, 64); return n }

// command answers the vector and conversation commands; keyCommand the rest.
func (h *hostProc) command(f []string) string {
	eng := h.eng
	switch f[0] {
	case "reg": // reg NAME SEED N: replies with the wall time just before the write
		t0 := time.Now().UnixNano()
		_, err := eng.Register(f[1], vecs(uintArg(f, 2), int(uintArg(f, 3))))
		return reply(err, strconv.FormatInt(t0, 10))
	case "unreg":
		_, err := eng.Unregister(f[1])
		return reply(err, "")
	case "conv": // conv TENANT ID ("-": none): the conversation's gates entry's length, or none
		tenant := f[1]
		if tenant == "-" {
			tenant = ""
		}
		b, found, err := eng.GateConversation(steer.ConvKey{Tenant: tenant, ID: f[2]})
		switch {
		case err != nil:
			return "err " + err.Error()
		case !found:
			return "none"
		}
		return fmt.Sprintf("ok %d", len(b))
	case "mkconv": // mkconv ID: admit request ID in conversation ID with a rest_of_conversation gate
		k := steer.ConvKey{ID: f[1]}
		_, err := eng.Admit(convAdmission(f[1], k))
		if err == nil {
			_, err = eng.End(f[1]) // the conversation's entry stays
		}
		return reply(err, "")
	case "dropconv": // dropconv ID: drop conversation ID's entry
		found, err := eng.DropGateConversation(steer.ConvKey{ID: f[1]})
		return reply(err, strconv.FormatBool(found))
	case "reghint": // reghint NAME SEED N HINT: with a model hint
		_, err := eng.Register(f[1], vecs(uintArg(f, 2), int(uintArg(f, 3))), steer.ModelHint(f[4]))
		return reply(err, "")
	case "regprobe": // regprobe NAME SEED: a probe vector (one site)
		_, err := eng.RegisterProbe(f[1], vecs(uintArg(f, 2), 1))
		return reply(err, "")
	case "unregprobe":
		_, err := eng.UnregisterProbe(f[1])
		return reply(err, "")
	case "global": // global NAME STRENGTH (NAME "-" clears)
		g := steer.Steering{}
		if f[1] != "-" {
			g.Base.Refs = []steer.Ref{{Name: f[1], Strength: float32(uintArg(f, 2))}}
		}
		_, err := eng.SetGlobal(g)
		return reply(err, "")
	}
	return h.keyCommand(f)
}

// keyCommand answers the key registry's and the mirror's commands.
func (h *hostProc) keyCommand(f []string) string {
	switch f[0] {
	case "setkey":
		v, _ := hex.DecodeString(f[2])
		return reply(h.reg.Set(f[1], v), "")
	case "rmkey":
		return reply(h.reg.Remove(f[1]), "")
	case "load": // load RATE MS: set keys ld-0..ld-1023 at RATE/s for MS, in the background
		h.startLoad(uintArg(f, 1), uintArg(f, 2))
		return "ok"
	case "fill": // fill N: set keys ld-0..ld-N-1 (32 zero bytes) now
		var err error
		for i := range int(uintArg(f, 1)) {
			if err = h.reg.Set(fmt.Sprintf("ld-%d", i), make([]byte, 32)); err != nil {
				break
			}
		}
		return reply(err, "")
	case "loadwait":
		h.load.Wait()
		return "ok"
	case "drain": // wait until every local change is acknowledged by the server
		deadline := time.Now().Add(30 * time.Second)
		for !h.m.idle() && time.Now().Before(deadline) {
			time.Sleep(2 * time.Millisecond)
		}
		return reply(nil, strconv.FormatBool(h.m.idle()))
	case "entries":
		h.m.mu.Lock()
		n := len(h.m.entries)
		h.m.mu.Unlock()
		return reply(nil, strconv.Itoa(n))
	case "status":
		b, _ := json.Marshal(h.m.Status())
		return "ok " + string(b)
	case "exit":
		h.m.Close()
		h.owner.Close()
		os.Exit(0)
	}
	return "err unknown-command"
}

// startLoad sets keys ld-0..ld-1023 at rate a second for ms milliseconds, in the background.
func (h *hostProc) startLoad(rate, ms uint64) {
	h.load.Add(1)
	go func() {
		defer h.load.Done()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		end := time.Now().Add(time.Duration(ms) * time.Millisecond)
		key := make([]byte, 32)
		for i := 0; time.Now().Before(end); i++ {
			<-tick.C
			key[0] = byte(i)
			h.reg.Set(fmt.Sprintf("ld-%d", i%1024), key)
		}
	}()
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

// workerProc is the "worker" role: a client attached to its host's owner, with a steer engine
// and a key reader.
type workerProc struct {
	c   *ipc.Client
	eng *steer.Worker
	kr  *keys.Reader
}

func runWorker() {
	w, err := startWorkerProc()
	if err != nil {
		say(reply(err, ""))
		os.Exit(1)
	}
	say("ok ready")
	lineLoop(w.command)
}

func startWorkerProc() (*workerProc, error) {
	w := &workerProc{}
	var err error
	if w.c, err = ipc.Attach(ipc.ClientOptions{Namespace: os.Getenv(nsEnv), Timeout: 20 * time.Second}); err != nil {
		return nil, err
	}
	if w.eng, err = steer.Attach(w.c.Region(), &testCfg, steer.Options{Caller: w.c}); err != nil {
		return nil, err
	}
	reg, err := keys.Attach(w.c)
	if err != nil {
		return nil, err
	}
	if w.kr, err = reg.NewReader(); err != nil {
		return nil, err
	}
	return w, nil
}

// seedOfKind reads the first float of a named vector of the kind read reads and the vector's
// count, "SEED/N" ("none" if not registered).
func (w *workerProc) seedOfKind(name string, read func(*shm.Snapshot, string) (steer.NamedVector, error)) string {
	s, err := w.c.Region().Snapshot()
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

// seedOf is seedOfKind for a steering vector.
func (w *workerProc) seedOf(name string) string { return w.seedOfKind(name, w.eng.Vector) }

// command answers the vector commands; keyCommand the rest.
func (w *workerProc) command(f []string) string {
	switch f[0] {
	case "reg": // reg NAME SEED N: a worker's write, through the owner (RPC)
		n, _ := strconv.Atoi(f[3])
		seed, _ := strconv.ParseUint(f[2], 10, 64)
		_, err := w.eng.Register(f[1], vecs(seed, n))
		return reply(err, "")
	case "vec":
		return w.seedOf(f[1])
	case "probe":
		return w.seedOfKind(f[1], w.eng.Probe)
	case "hint": // hint NAME: the vector's seed and model hint, "SEED/N HINT"
		s, err := w.c.Region().Snapshot()
		if err != nil {
			return "err " + err.Error()
		}
		meta, err := w.eng.VectorMeta(&s, f[1])
		s.Close()
		return reply(err, w.seedOf(f[1])+" "+meta.ModelHint)
	case "wait": // wait NAME WANT: poll until seedOf(NAME) == WANT; reply with the wall time
		deadline := time.Now().Add(20 * time.Second)
		got := w.seedOf(f[1])
		for got != f[2] && time.Now().Before(deadline) {
			// Leave the CPU to the others (2 cores here) for ~10 µs: time.Sleep rounds this
			// up to about a millisecond on this kernel, nanosleep(2) to ~80 µs.
			syscall.Nanosleep(&syscall.Timespec{Nsec: 10_000}, nil)
			got = w.seedOf(f[1])
		}
		t1 := time.Now().UnixNano()
		if got != f[2] {
			return "err timeout: " + got
		}
		return "ok " + strconv.FormatInt(t1, 10)
	case "global":
		return w.global()
	}
	return w.keyCommand(f)
}

// global is the global composition's one reference as "NAME*STRENGTH", or "none".
func (w *workerProc) global() string {
	s, err := w.c.Region().Snapshot()
	if err != nil {
		return reply(err, "")
	}
	b, _, found, err := w.eng.Encoding(&s, steer.ChangeGlobal, "")
	res := "none"
	if found {
		g, _, derr := steer.DecodeSteering(b, testCfg)
		err = derr
		if err == nil && len(g.Base.Refs) == 1 {
			res = fmt.Sprintf("%s*%g", g.Base.Refs[0].Name, g.Base.Refs[0].Strength)
		}
	}
	s.Close()
	return reply(err, res)
}

// keyCommand answers the key reader's commands and exit.
func (w *workerProc) keyCommand(f []string) string {
	switch f[0] {
	case "key":
		v, err := w.kr.Get(f[1], nil)
		return reply(err, hex.EncodeToString(v))
	case "getlat": // getlat N: time N Gets of 1024 keys ld-*, one by one; reply p50 p99 ns
		n, _ := strconv.Atoi(f[1])
		return w.getLatency(n)
	case "exit":
		w.kr.Close()
		w.c.Close()
		os.Exit(0)
	}
	return "err unknown-command"
}

// getLatency times n Gets of the 1024 keys ld-*, one by one: "ok P50 P99" in ns.
func (w *workerProc) getLatency(n int) string {
	ids := make([]string, 1024)
	for i := range ids {
		ids[i] = fmt.Sprintf("ld-%d", i)
	}
	lat := make([]int64, n)
	buf := make([]byte, 0, 64)
	var gerr error
	for i := range n {
		t := time.Now()
		buf, gerr = w.kr.Get(ids[i&1023], buf[:0])
		lat[i] = int64(time.Since(t))
		if gerr != nil {
			break
		}
	}
	if gerr != nil {
		return reply(gerr, "")
	}
	slices.Sort(lat)
	return fmt.Sprintf("ok %d %d", lat[n/2], lat[n*99/100])
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
