// Package demo is `shmsteer demo`: an owner process and N re-executed worker processes steer a
// stream of synthetic requests through the shared region, each worker checks every result
// against a plain reference computation, and the workers' determinism checksums must agree.
//
// It must not reach below the public APIs of steer, ipc, shm and kernels, and it owns no state
// format: it is an example of their use that checks itself, not API (hence internal/).
//
// To start: `shmsteer demo --help`; cmd/shmsteer binds BindFlags and calls Main, and a binary
// that runs the demo calls RunWorkerIfRequested first thing in main (workers re-execute it).
package demo

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// RoleEnv marks a re-executed worker; its value is the worker number.
const RoleEnv = "SHMSTEER_DEMO_WORKER"

// Options are the demo's sizes, the flags of `shmsteer demo` ([BindFlags] defines them).
type Options struct {
	Workers  int    `json:"workers"`           // worker processes
	Steps    int    `json:"steps"`             // generation steps
	Hidden   int    `json:"hidden"`            // hidden size
	Layers   int    `json:"layers"`            // layers, each with the 5 default hooks
	Tokens   int    `json:"tokens"`            // at most this many rows per step
	Requests int    `json:"requests"`          // requests in flight
	Seed     uint64 `json:"seed"`              // seed of the synthetic workload
	MaxConv  int    `json:"max_conversations"` // latch count cap
	MaxBytes int64  `json:"max_latched_bytes"` // latch byte cap
}

// params are what every worker is sent: the options and the owner's namespace.
type params struct {
	Options
	Namespace string `json:"namespace"`
}

// stepMsg is the owner's instruction for one step; every worker gets the same.
type stepMsg struct {
	Step    int          `json:"step"`
	Version uint64       `json:"version"`
	Batch   []steer.Span `json:"batch,omitempty"`
	Quit    bool         `json:"quit,omitempty"`
}

// reply is a worker's answer: first a hello, then one per step.
type reply struct {
	Worker     int    `json:"worker"`
	Registered string `json:"registered,omitempty"`
	Step       int    `json:"step"`
	Sum        uint64 `json:"sum"`
	Mismatches int    `json:"mismatches"`
	FirstBad   string `json:"first_bad,omitempty"`
	ApplyNs    int64  `json:"apply_ns"`
	BareNs     int64  `json:"bare_ns"`
	Rows       int    `json:"rows"`
	Lookups    int    `json:"lookups"`
	LookupNs   int64  `json:"lookup_ns"`
	Err        string `json:"err,omitempty"`
}

// BindFlags defines the flags of `shmsteer demo` on fs, with their defaults, and returns where
// they land.
func BindFlags(fs *pflag.FlagSet) *Options {
	o := &Options{}
	fs.IntVar(&o.Workers, "workers", 2, "worker processes")
	fs.IntVar(&o.Steps, "steps", 160, "generation steps")
	fs.IntVar(&o.Hidden, "hidden", 2048, "hidden size")
	fs.IntVar(&o.Layers, "layers", 8, "layers (each with the 5 default hooks)")
	fs.IntVar(&o.Tokens, "tokens", 128, "at most this many rows per step")
	fs.IntVar(&o.Requests, "requests", 48, "requests in flight")
	// Small latch caps by default so a short run shows evictions and oversize refusals; the
	// library defaults are 1024 conversations and 256 MiB.
	fs.IntVar(&o.MaxConv, "max-conversations", 16, "latch count cap")
	fs.Int64Var(&o.MaxBytes, "max-latched-bytes", 256<<10, "latch byte cap")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the synthetic workload")
	return o
}

// ErrUsage reports option values the demo cannot run with (found before anything starts).
var ErrUsage = errors.New("shmsteer: demo: bad flags")

// Main runs `shmsteer demo` with o: the summary on stdout, progress and the workers' logs on
// stderr. It returns an error wrapping [ErrUsage] for a size below 1, before anything starts,
// or what made the run fail (a reference mismatch, checksums that differ, a worker gone).
func Main(o Options, stdout, stderr io.Writer) error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"workers", int64(o.Workers)}, {"steps", int64(o.Steps)}, {"hidden", int64(o.Hidden)}, {"layers", int64(o.Layers)},
		{"tokens", int64(o.Tokens)}, {"requests", int64(o.Requests)}, {"max-conversations", int64(o.MaxConv)}, {"max-latched-bytes", o.MaxBytes}} {
		if f.v < 1 {
			return fmt.Errorf("%w: --%s must be at least 1 (got %d)", ErrUsage, f.name, f.v)
		}
	}
	return run(params{Options: o}, stdout, stderr)
}

type worker struct {
	cmd *exec.Cmd
	in  *json.Encoder
	out *bufio.Scanner
}

func (w *worker) read() (reply, error) {
	var r reply
	if !w.out.Scan() {
		if err := w.out.Err(); err != nil {
			return r, err
		}
		return r, io.ErrUnexpectedEOF
	}
	if err := json.Unmarshal(w.out.Bytes(), &r); err != nil {
		return r, err
	}
	if r.Err != "" {
		return r, errors.New(r.Err)
	}
	return r, nil
}

// lockedWriter serializes writes from the worker pipes' copiers and the owner's own logging.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// cluster is the demo's owner side: the region's owner and engine, the worker processes and
// the named vectors they all know.
type cluster struct {
	p       params
	cfg     steer.ModelConfig
	secret  string // hex, handed to the workers in their environment
	owner   *ipc.Owner
	keys    *keys.Owner
	eng     *steer.Owner
	workers []*worker
	names   []string
	stderr  io.Writer
}

// tally sums the workers' replies over the run.
type tally struct {
	sums                       []uint64
	applyNs, bareNs, lookupNs  []int64
	lookups                    []int
	mismatches, disagree, rows int
	firstBad                   string
}

func run(p params, stdout, stderr io.Writer) error {
	start := time.Now()
	stderr = &lockedWriter{w: stderr}
	c, err := startOwner(p, stderr)
	if err != nil {
		return err
	}
	defer c.owner.Close()
	rng := mrand.New(mrand.NewPCG(p.Seed, 7))
	if err := c.registerVectors(rng); err != nil {
		return err
	}
	stop, err := c.startWorkers()
	defer stop()
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "shmsteer demo: owner pid %d, %s attached (%s), %d steps of ≤%d rows over %d layers × %d hooks, hidden %d\n",
		os.Getpid(), plural(p.Workers, "worker"), plural(c.owner.Clients(), "client"), p.Steps, p.Tokens, p.Layers, c.cfg.NumHooks(), p.Hidden)
	t, err := c.steps(newDriver(c.eng, c.keys, c.cfg, c.names, p, rng))
	if err != nil {
		return err
	}
	for _, w := range c.workers {
		w.in.Encode(stepMsg{Quit: true})
	}
	status, err := c.eng.Status()
	if err != nil {
		return err
	}
	return c.report(stdout, t, status, time.Since(start))
}

// startOwner creates the region for p's model under a fresh secret and namespace, and the
// steering engine over it, serving the workers' writes.
func startOwner(p params, stderr io.Writer) (*cluster, error) {
	secretHex := make([]byte, 32)
	if _, err := rand.Read(secretHex); err != nil {
		return nil, err
	}
	c := &cluster{p: p, cfg: steer.ModelConfig{Hidden: p.Hidden, Layers: p.Layers}, secret: hex.EncodeToString(secretHex), stderr: stderr}
	secret := ipc.NewSecret([]byte(c.secret))
	c.p.Namespace = fmt.Sprintf("demo-%d", os.Getpid())
	arena := int64(64 << 20)
	if need := int64(p.Requests*8+64) * int64(p.Hidden) * 4 * 4; need > arena {
		arena = (need + 63) &^ 63
	}
	rc, err := steer.RegionConfig(c.cfg, shm.Config{IndexSlots: 1 << 14, ArenaBytes: arena})
	if err != nil {
		return nil, err
	}
	c.owner, err = ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: c.p.Namespace, Region: rc})
	if err != nil {
		return nil, err
	}
	if c.keys, err = keys.Open(c.owner, keys.Options{Grace: time.Second}); err != nil {
		c.owner.Close()
		return nil, err
	}
	var logged int
	c.eng, err = steer.Open(c.owner.Region(), &c.cfg, steer.Options{Clients: c.owner.Clients,
		Latch: steer.LatchConfig{MaxConversations: p.MaxConv, MaxLatchedBytes: p.MaxBytes}, Logf: func(f string, a ...any) {
			if logged == 0 {
				fmt.Fprintf(stderr, "shmsteer demo: the latch warnings below are behaviours this run demonstrates, not faults: its latch caps are small (--max-conversations %d, --max-latched-bytes %d) so large overrides are not latched, and it re-registers named vectors so latches that reference them are dropped\n",
					p.MaxConv, p.MaxBytes)
			}
			if logged < 5 {
				fmt.Fprintf(stderr, "  demonstrated: "+f+"\n", a...)
			}
			logged++
		}})
	if err != nil {
		c.owner.Close()
		return nil, err
	}
	c.eng.Serve(func(op uint16, h func([]byte) ([]byte, error)) { c.owner.Handle(op, h) })
	return c, nil
}

// registerVectors registers the owner's four named vectors; each worker registers one more
// over RPC when it starts.
func (c *cluster) registerVectors(rng *mrand.Rand) error {
	for i := range 4 {
		name := fmt.Sprint("owner-vec-", i)
		if _, err := c.eng.Register(name, randomSet(rng, c.cfg, 1+rng.IntN(6))); err != nil {
			return err
		}
		c.names = append(c.names, name)
	}
	return nil
}

// startWorkers re-executes this binary as p.Workers workers and reads each one's hello. The
// returned stop closes their stdin and waits for them (call it even on error).
func (c *cluster) startWorkers() (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range stops {
			f()
		}
	}
	self, err := os.Executable()
	if err != nil {
		return stop, err
	}
	pj, _ := json.Marshal(c.p)
	c.workers = make([]*worker, c.p.Workers)
	for i := range c.workers {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), RoleEnv+"="+fmt.Sprint(i+1), ipc.SecretEnv+"="+c.secret, "SHMSTEER_DEMO_PARAMS="+string(pj))
		cmd.Stderr = c.stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return stop, err
		}
		outp, err := cmd.StdoutPipe()
		if err != nil {
			return stop, err
		}
		if err := cmd.Start(); err != nil {
			return stop, err
		}
		sc := bufio.NewScanner(outp)
		sc.Buffer(make([]byte, 1<<16), 1<<24)
		c.workers[i] = &worker{cmd: cmd, in: json.NewEncoder(in), out: sc}
		stops = append([]func(){func() { in.Close(); cmd.Wait() }}, stops...)
	}
	for _, w := range c.workers {
		r, err := w.read()
		if err != nil {
			return stop, fmt.Errorf("worker start: %w", err)
		}
		c.names = append(c.names, r.Registered)
	}
	return stop, nil
}

// steps runs the p.Steps steps: the driver lays out each batch, every worker applies it at one
// pinned version and answers with its checksum, and the replies are summed.
func (c *cluster) steps(drv *driver) (*tally, error) {
	n := c.p.Workers
	t := &tally{sums: make([]uint64, n), applyNs: make([]int64, n), bareNs: make([]int64, n), lookupNs: make([]int64, n), lookups: make([]int, n)}
	for step := range c.p.Steps {
		batch, err := drv.step(step)
		if err != nil {
			return nil, err
		}
		first, err := c.step(step, batch, t)
		if err != nil {
			return nil, err
		}
		if (step+1)%max(1, c.p.Steps/10) == 0 || step+1 == c.p.Steps {
			fmt.Fprintf(c.stderr, "  step %4d/%d  requests %3d  rows %3d  checksum %016x\n", step+1, c.p.Steps, drv.live(), len(batch), first)
		}
	}
	return t, nil
}

// step sends one batch to every worker at a pinned version and adds their replies to t; it
// returns the first worker's checksum.
func (c *cluster) step(step int, batch []steer.Span, t *tally) (uint64, error) {
	// Pin the version for every rank: whatever the owner writes next, they apply this state.
	snap, err := c.owner.Region().Snapshot()
	if err != nil {
		return 0, err
	}
	defer snap.Close()
	msg := stepMsg{Step: step, Version: snap.Version(), Batch: batch}
	for _, w := range c.workers {
		if err := w.in.Encode(msg); err != nil {
			return 0, fmt.Errorf("worker gone: %w", err)
		}
	}
	var first uint64
	for i, w := range c.workers {
		r, err := w.read()
		if err != nil {
			return 0, fmt.Errorf("worker %d step %d: %w", i+1, step, err)
		}
		if i == 0 {
			first = r.Sum
			t.rows += r.Rows
		} else if r.Sum != first {
			t.disagree++
		}
		t.sums[i] = t.sums[i]*0x100000001b3 ^ r.Sum
		t.applyNs[i] += r.ApplyNs
		t.bareNs[i] += r.BareNs
		t.lookups[i] += r.Lookups
		t.lookupNs[i] += r.LookupNs
		t.mismatches += r.Mismatches
		if t.firstBad == "" && r.FirstBad != "" {
			t.firstBad = fmt.Sprintf("worker %d step %d: %s", i+1, step, r.FirstBad)
		}
	}
	return first, nil
}

// report prints the run's summary and fails it on any mismatch or disagreement.
func (c *cluster) report(stdout io.Writer, t *tally, status steer.Status, took time.Duration) error {
	p, cfg := c.p, c.cfg
	blocks := p.Steps * p.Layers * cfg.NumHooks()
	fmt.Fprintf(stdout, "shmsteer demo: %s, %d steps × %d layers × %d hooks, hidden %d, %d rows in all, %.1fs\n",
		plural(p.Workers, "worker"), p.Steps, p.Layers, cfg.NumHooks(), p.Hidden, t.rows, took.Seconds())
	for i := range c.workers {
		apply := float64(t.applyNs[i]) / float64(p.Steps)
		bare := float64(t.bareNs[i]) / float64(p.Steps)
		// Not a like-for-like overhead: Apply runs on a block just copied in, composes whatever
		// the demo's churn changed, and adds each request's own vectors and clamps; the reference
		// adds one shared vector to the same rows right after, cache-warm. The steady-state cost
		// of a step against the kernel over the same vectors is `shmsteer bench`'s
		// steer.step.{prefill,decode}.* figures.
		fmt.Fprintf(stdout, "worker %d: per-step Apply %.1f µs (%.2f µs per hook×layer; includes recomposition after churn and clamps); one shared vector added to the same rows %.1f µs (ratio %.2f×, not like for like: see `shmsteer bench` steer.step.*); key lookups %.2f M/s; checksum %016x\n",
			i+1, apply/1e3, apply/1e3*float64(p.Steps)/float64(blocks), bare/1e3, apply/math.Max(bare, 1), float64(t.lookups[i])/math.Max(float64(t.lookupNs[i]), 1)*1e3, t.sums[i])
	}
	sj, _ := json.MarshalIndent(status, "", "  ")
	fmt.Fprintf(stdout, "status: %s\n", sj)
	fmt.Fprintf(stdout, "latches: %d triggers, %d bridges, %d bridge drops, %d evictions, %d oversize refusals\n",
		status.Triggers, status.Bridges, status.BridgeDrops, status.Evictions, status.OversizeRefusals)
	if t.mismatches > 0 || t.disagree > 0 {
		return fmt.Errorf("FAILED: %d reference mismatches (first: %s), %d steps where worker checksums differ", t.mismatches, t.firstBad, t.disagree)
	}
	if p.Workers == 1 {
		fmt.Fprintln(stdout, "OK: the worker matched the reference on every step")
	} else {
		fmt.Fprintf(stdout, "OK: every worker matched the reference on every step, and all %d workers' checksums agree\n", p.Workers)
	}
	return nil
}

// plural is "1 worker", "2 workers".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// randomSet makes a named steering set of n entries at distinct (hook, layer) sites.
func randomSet(rng *mrand.Rand, cfg steer.ModelConfig, n int) []steer.Vector {
	var out []steer.Vector
	seen := map[[2]int]bool{}
	for range n {
		h, l := rng.IntN(cfg.NumHooks()), rng.IntN(cfg.Layers)
		if seen[[2]int{h, l}] {
			continue
		}
		seen[[2]int{h, l}] = true
		out = append(out, steer.Vector{Hook: cfg.HookName(steer.HookID(h)), Layer: l, Scale: float32(0.5 + rng.Float64()), Data: randVec(rng, cfg.Hidden, 0.1)})
	}
	return out
}

func randVec(rng *mrand.Rand, d int, scale float64) []float32 {
	v := make([]float32, d)
	for i := range v {
		v[i] = float32(rng.NormFloat64() * scale)
	}
	return v
}

// driver is the synthetic scheduler: it admits and ends requests, sets and removes their keys,
// and lays out each step's batch.
type driver struct {
	eng    *steer.Owner
	keys   *keys.Owner
	cfg    steer.ModelConfig
	names  []string
	p      params
	rng    *mrand.Rand
	next   int
	active map[string]*request
}

type request struct {
	id       string
	prefill  int // rows of prefill left (first step)
	decoding int // decode steps left
}

func newDriver(eng *steer.Owner, keys *keys.Owner, cfg steer.ModelConfig, names []string, p params, rng *mrand.Rand) *driver {
	return &driver{eng: eng, keys: keys, cfg: cfg, names: names, p: p, rng: rng, active: map[string]*request{}}
}

func (d *driver) live() int { return len(d.active) }

func (d *driver) step(step int) ([]steer.Span, error) {
	if err := d.churn(step); err != nil {
		return nil, err
	}
	if err := d.endFinished(); err != nil {
		return nil, err
	}
	if err := d.admitNew(); err != nil {
		return nil, err
	}
	return d.layout(), nil
}

// churn is the occasional control-plane change: a named vector re-registered (latches on it
// drop at their next bridge) or the global tiers changed.
func (d *driver) churn(step int) error {
	rng := d.rng
	if step%17 == 5 {
		if _, err := d.eng.Register(d.names[rng.IntN(4)], randomSet(rng, d.cfg, 1+rng.IntN(4))); err != nil {
			return err
		}
	}
	if step%29 == 0 {
		g := steer.Steering{Base: steer.Tier{Vectors: randomSet(rng, d.cfg, 2)}}
		g.Decode.Refs = []steer.Ref{{Name: d.names[rng.IntN(len(d.names))], Strength: 0.3}}
		if _, err := d.eng.SetGlobal(g); err != nil {
			return err
		}
	}
	return nil
}

// activeIDs is the ids in flight, sorted (a deterministic order for the seeded workload).
func (d *driver) activeIDs() []string {
	ids := make([]string, 0, len(d.active))
	for id := range d.active {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// endFinished ends the requests with nothing left to run: key removed (revoked sentinel),
// steering entry deleted.
func (d *driver) endFinished() error {
	for _, id := range d.activeIDs() {
		if r := d.active[id]; r.prefill == 0 && r.decoding == 0 {
			if err := d.keys.Remove(id); err != nil {
				return err
			}
			if _, err := d.eng.End(id); err != nil {
				return err
			}
			delete(d.active, id)
		}
	}
	return nil
}

// admitNew admits requests, each with a key and an admission, until p.Requests are in flight.
func (d *driver) admitNew() error {
	rng := d.rng
	for len(d.active) < d.p.Requests {
		id := fmt.Sprintf("req-%06d", d.next)
		d.next++
		key := make([]byte, 32)
		for i := range key {
			key[i] = byte(rng.Uint32())
		}
		if err := d.keys.Set(id, key); err != nil {
			return err
		}
		if _, err := d.eng.Admit(d.admission(id)); err != nil {
			return err
		}
		d.active[id] = &request{id: id, prefill: 1 + rng.IntN(8), decoding: 1 + rng.IntN(12)}
	}
	return nil
}

// layout lays out this step's batch: each request's prefill rows on its first step, then one
// decode row a step, while they fit in p.Tokens rows.
func (d *driver) layout() []steer.Span {
	var batch []steer.Span
	row := 0
	for _, id := range d.activeIDs() {
		r := d.active[id]
		n, ph := 1, steer.PhaseDecode
		if r.prefill > 0 {
			n, ph = r.prefill, steer.PhasePrefill
		}
		if row+n > d.p.Tokens {
			continue // not scheduled this step
		}
		batch = append(batch, steer.Span{ID: id, Start: row, End: row + n, Phase: ph})
		row += n
		if r.prefill > 0 {
			r.prefill = 0
		} else {
			r.decoding--
		}
	}
	return batch
}

// admission draws a request: no steering, inline vectors, references, clamps (some ablations),
// in conversations of a few tenants (bridging and composing latches), or not.
func (d *driver) admission(id string) steer.Admission {
	rng, cfg := d.rng, d.cfg
	a := steer.Admission{RequestID: id}
	if rng.IntN(4) != 0 {
		a.Conversation = steer.ConvKey{Tenant: fmt.Sprint("tenant-", rng.IntN(3)), ID: fmt.Sprint("conv-", rng.IntN(12))}
	}
	if rng.IntN(3) == 0 {
		return a // no override: bridge the conversation's latch if any
	}
	var s steer.Steering
	if rng.IntN(40) == 0 {
		// A rare huge override: a vector at every (hook, layer). Larger than the demo's byte
		// cap, it steers its own request but is refused as a latch.
		for h := range cfg.NumHooks() {
			for l := range cfg.Layers {
				s.Base.Vectors = append(s.Base.Vectors, steer.Vector{Hook: cfg.HookName(steer.HookID(h)), Layer: l, Scale: 0.1, Data: randVec(rng, cfg.Hidden, 0.1)})
			}
		}
		a.Override = &s
		return a
	}
	for _, t := range []*steer.Tier{&s.Base, &s.Prefill, &s.Decode} {
		switch rng.IntN(4) {
		case 0:
			t.Vectors = randomSet(rng, cfg, 1+rng.IntN(3))
		case 1:
			t.Refs = []steer.Ref{{Name: d.names[rng.IntN(len(d.names))], Strength: float32(rng.NormFloat64())}}
		case 2:
			c := steer.Clamp{Hook: cfg.HookName(steer.HookID(rng.IntN(cfg.NumHooks()))), Layer: rng.IntN(cfg.Layers), Dir: randVec(rng, cfg.Hidden, 1), Min: -0.5, Max: 0.5, Strength: 1}
			if rng.IntN(2) == 0 {
				c.Min, c.Max = 0, 0 // ablation
			}
			t.Clamps = []steer.Clamp{c}
		}
	}
	if rng.IntN(2) == 0 {
		s.Compose = steer.ComposeAdd
	}
	a.Override = &s
	return a
}
