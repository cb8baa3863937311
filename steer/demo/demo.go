// Package demo is `shmsteer demo`: an owner process and N re-executed worker processes steer a
// stream of synthetic requests through the shared region, each worker checks every result
// against a plain reference computation, and the workers' determinism checksums must agree.
//
// It uses only the public APIs of steer, ipc, shm and kernels; it owns no state format.
package demo

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"sync"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// RoleEnv marks a re-executed worker; its value is the worker number.
const RoleEnv = "SHMSTEER_DEMO_WORKER"

// params are the demo's sizes, sent to every worker.
type params struct {
	Workers   int    `json:"workers"`
	Steps     int    `json:"steps"`
	Hidden    int    `json:"hidden"`
	Layers    int    `json:"layers"`
	Tokens    int    `json:"tokens"`
	Requests  int    `json:"requests"`
	Seed      uint64 `json:"seed"`
	MaxConv   int    `json:"max_conversations"`
	MaxBytes  int64  `json:"max_latched_bytes"`
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

// Main runs `shmsteer demo` with args (without the subcommand) and returns the exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("shmsteer demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	p := params{}
	fs.IntVar(&p.Workers, "workers", 2, "worker processes")
	fs.IntVar(&p.Steps, "steps", 160, "generation steps")
	fs.IntVar(&p.Hidden, "hidden", 2048, "hidden size")
	fs.IntVar(&p.Layers, "layers", 8, "layers (each with the 5 default hooks)")
	fs.IntVar(&p.Tokens, "tokens", 128, "at most this many rows per step")
	fs.IntVar(&p.Requests, "requests", 48, "requests in flight")
	// Small latch caps by default so a short run shows evictions and oversize refusals; the
	// library defaults are 1024 conversations and 256 MiB.
	fs.IntVar(&p.MaxConv, "max-conversations", 16, "latch count cap")
	fs.Int64Var(&p.MaxBytes, "max-latched-bytes", 256<<10, "latch byte cap")
	fs.Uint64Var(&p.Seed, "seed", 1, "seed of the synthetic workload")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "shmsteer demo: takes no positional arguments (got %q); see -h\n", fs.Args())
		return 2
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"workers", int64(p.Workers)}, {"steps", int64(p.Steps)}, {"hidden", int64(p.Hidden)}, {"layers", int64(p.Layers)},
		{"tokens", int64(p.Tokens)}, {"requests", int64(p.Requests)}, {"max-conversations", int64(p.MaxConv)}, {"max-latched-bytes", p.MaxBytes}} {
		if f.v < 1 {
			fmt.Fprintf(stderr, "shmsteer demo: -%s must be at least 1 (got %d)\n", f.name, f.v)
			return 2
		}
	}
	if err := run(p, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "shmsteer demo:", err)
		return 1
	}
	return 0
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

func run(p params, stdout, stderr io.Writer) error {
	start := time.Now()
	stderr = &lockedWriter{w: stderr}
	secretHex := make([]byte, 32)
	if _, err := rand.Read(secretHex); err != nil {
		return err
	}
	secretStr := hex.EncodeToString(secretHex)
	secret := ipc.NewSecret([]byte(secretStr))
	p.Namespace = fmt.Sprintf("demo-%d", os.Getpid())
	cfg := steer.ModelConfig{Hidden: p.Hidden, Layers: p.Layers}
	arena := int64(64 << 20)
	if need := int64(p.Requests*8+64) * int64(p.Hidden) * 4 * 4; need > arena {
		arena = (need + 63) &^ 63
	}
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 14, ArenaBytes: arena})
	if err != nil {
		return err
	}
	owner, err := ipc.NewOwner(ipc.OwnerOptions{Secret: &secret, Namespace: p.Namespace, Region: rc, Grace: time.Second})
	if err != nil {
		return err
	}
	defer owner.Close()
	var logged int
	eng, err := steer.Open(owner.Region(), &cfg, steer.Options{Clients: owner.Clients,
		Latch: steer.LatchConfig{MaxConversations: p.MaxConv, MaxLatchedBytes: p.MaxBytes}, Logf: func(f string, a ...any) {
			if logged == 0 {
				fmt.Fprintf(stderr, "shmsteer demo: the latch warnings below are behaviours this run demonstrates, not faults: its latch caps are small (-max-conversations %d, -max-latched-bytes %d) so large overrides are not latched, and it re-registers named vectors so latches that reference them are dropped\n",
					p.MaxConv, p.MaxBytes)
			}
			if logged < 5 {
				fmt.Fprintf(stderr, "  demonstrated: "+f+"\n", a...)
			}
			logged++
		}})
	if err != nil {
		return err
	}
	eng.Serve(func(op uint16, h func([]byte) ([]byte, error)) { owner.Handle(op, h) })

	// Named vectors registered by the owner; each worker registers one more over RPC.
	rng := mrand.New(mrand.NewPCG(p.Seed, 7))
	var names []string
	for i := range 4 {
		name := fmt.Sprint("owner-vec-", i)
		if _, err := eng.Register(name, randomSet(rng, cfg, 1+rng.IntN(6))); err != nil {
			return err
		}
		names = append(names, name)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pj, _ := json.Marshal(p)
	workers := make([]*worker, p.Workers)
	for i := range workers {
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), RoleEnv+"="+fmt.Sprint(i+1), ipc.SecretEnv+"="+secretStr, "SHMSTEER_DEMO_PARAMS="+string(pj))
		cmd.Stderr = stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return err
		}
		outp, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		sc := bufio.NewScanner(outp)
		sc.Buffer(make([]byte, 1<<16), 1<<24)
		workers[i] = &worker{cmd: cmd, in: json.NewEncoder(in), out: sc}
		defer func() {
			in.Close()
			cmd.Wait()
		}()
	}
	for _, w := range workers {
		r, err := w.read()
		if err != nil {
			return fmt.Errorf("worker start: %w", err)
		}
		names = append(names, r.Registered)
	}
	fmt.Fprintf(stderr, "shmsteer demo: owner pid %d, %s attached (%s), %d steps of ≤%d rows over %d layers × %d hooks, hidden %d\n",
		os.Getpid(), plural(p.Workers, "worker"), plural(owner.Clients(), "client"), p.Steps, p.Tokens, p.Layers, cfg.NumHooks(), p.Hidden)

	drv := newDriver(eng, owner.Keys(), cfg, names, p, rng)
	var (
		sums       = make([]uint64, p.Workers)
		applyNs    = make([]int64, p.Workers)
		bareNs     = make([]int64, p.Workers)
		lookups    = make([]int, p.Workers)
		lookupNs   = make([]int64, p.Workers)
		mismatches int
		disagree   int
		rows       int
		firstBad   string
	)
	for step := range p.Steps {
		batch, err := drv.step(step)
		if err != nil {
			return err
		}
		// Pin the version for every rank: whatever the owner writes next, they apply this state.
		snap, err := owner.Region().Snapshot()
		if err != nil {
			return err
		}
		msg := stepMsg{Step: step, Version: snap.Version(), Batch: batch}
		for _, w := range workers {
			if err := w.in.Encode(msg); err != nil {
				snap.Close()
				return fmt.Errorf("worker gone: %w", err)
			}
		}
		var first uint64
		for i, w := range workers {
			r, err := w.read()
			if err != nil {
				snap.Close()
				return fmt.Errorf("worker %d step %d: %w", i+1, step, err)
			}
			if i == 0 {
				first = r.Sum
			} else if r.Sum != first {
				disagree++
			}
			sums[i] = sums[i]*0x100000001b3 ^ r.Sum
			applyNs[i] += r.ApplyNs
			bareNs[i] += r.BareNs
			lookups[i] += r.Lookups
			lookupNs[i] += r.LookupNs
			mismatches += r.Mismatches
			if firstBad == "" && r.FirstBad != "" {
				firstBad = fmt.Sprintf("worker %d step %d: %s", i+1, step, r.FirstBad)
			}
			if i == 0 {
				rows += r.Rows
			}
		}
		snap.Close()
		if (step+1)%max(1, p.Steps/10) == 0 || step+1 == p.Steps {
			fmt.Fprintf(stderr, "  step %4d/%d  requests %3d  rows %3d  checksum %016x\n", step+1, p.Steps, drv.live(), len(batch), first)
		}
	}
	for _, w := range workers {
		w.in.Encode(stepMsg{Quit: true})
	}
	status, err := eng.Status()
	if err != nil {
		return err
	}

	blocks := p.Steps * p.Layers * cfg.NumHooks()
	fmt.Fprintf(stdout, "shmsteer demo: %s, %d steps × %d layers × %d hooks, hidden %d, %d rows in all, %.1fs\n",
		plural(p.Workers, "worker"), p.Steps, p.Layers, cfg.NumHooks(), p.Hidden, rows, time.Since(start).Seconds())
	for i := range workers {
		apply := float64(applyNs[i]) / float64(p.Steps)
		bare := float64(bareNs[i]) / float64(p.Steps)
		fmt.Fprintf(stdout, "worker %d: per-step apply %.1f µs (%.2f µs per hook×layer); bare add pass %.1f µs; steering overhead %.2f×; key lookups %.2f M/s; checksum %016x\n",
			i+1, apply/1e3, apply/1e3*float64(p.Steps)/float64(blocks), bare/1e3, apply/math.Max(bare, 1), float64(lookups[i])/math.Max(float64(lookupNs[i]), 1)*1e3, sums[i])
	}
	sj, _ := json.MarshalIndent(status, "", "  ")
	fmt.Fprintf(stdout, "status: %s\n", sj)
	fmt.Fprintf(stdout, "latches: %d triggers, %d bridges, %d bridge drops, %d evictions, %d oversize refusals\n",
		status.Triggers, status.Bridges, status.BridgeDrops, status.Evictions, status.OversizeRefusals)
	if mismatches > 0 || disagree > 0 {
		return fmt.Errorf("FAILED: %d reference mismatches (first: %s), %d steps where worker checksums differ", mismatches, firstBad, disagree)
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
	eng    *steer.Engine
	keys   *ipc.Registry
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

func newDriver(eng *steer.Engine, keys *ipc.Registry, cfg steer.ModelConfig, names []string, p params, rng *mrand.Rand) *driver {
	return &driver{eng: eng, keys: keys, cfg: cfg, names: names, p: p, rng: rng, active: map[string]*request{}}
}

func (d *driver) live() int { return len(d.active) }

func (d *driver) step(step int) ([]steer.Span, error) {
	rng := d.rng
	// Occasional control-plane churn: a named vector re-registered (latches on it drop at their
	// next bridge) or the global tiers changed.
	if step%17 == 5 {
		if _, err := d.eng.Register(d.names[rng.IntN(4)], randomSet(rng, d.cfg, 1+rng.IntN(4))); err != nil {
			return nil, err
		}
	}
	if step%29 == 0 {
		g := steer.Steering{Base: steer.Tier{Vectors: randomSet(rng, d.cfg, 2)}}
		g.Decode.Refs = []steer.Ref{{Name: d.names[rng.IntN(len(d.names))], Strength: 0.3}}
		if _, err := d.eng.SetGlobal(g); err != nil {
			return nil, err
		}
	}
	// Finished requests end: key removed (revoked sentinel), steering entry deleted.
	ids := make([]string, 0, len(d.active))
	for id := range d.active {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if r := d.active[id]; r.prefill == 0 && r.decoding == 0 {
			if err := d.keys.Remove(id); err != nil {
				return nil, err
			}
			if _, err := d.eng.End(id); err != nil {
				return nil, err
			}
			delete(d.active, id)
		}
	}
	for len(d.active) < d.p.Requests {
		id := fmt.Sprintf("req-%06d", d.next)
		d.next++
		key := make([]byte, 32)
		for i := range key {
			key[i] = byte(rng.Uint32())
		}
		if err := d.keys.Set(id, key); err != nil {
			return nil, err
		}
		if _, err := d.eng.Admit(d.admission(id)); err != nil {
			return nil, err
		}
		d.active[id] = &request{id: id, prefill: 1 + rng.IntN(8), decoding: 1 + rng.IntN(12)}
	}
	ids = ids[:0]
	for id := range d.active {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var batch []steer.Span
	row := 0
	for _, id := range ids {
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
	return batch, nil
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
