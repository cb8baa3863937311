package demo

import (
	"encoding/json"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"strconv"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/kernels"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// RunWorkerIfRequested runs the demo's worker role and exits if this process was re-executed
// as one (RoleEnv set); otherwise it returns at once. Call it first thing in main.
func RunWorkerIfRequested() {
	n, ok := os.LookupEnv(RoleEnv)
	if !ok {
		return
	}
	id, _ := strconv.Atoi(n)
	enc := json.NewEncoder(os.Stdout)
	if err := workerMain(id, enc); err != nil {
		enc.Encode(reply{Worker: id, Err: err.Error()})
		os.Exit(1)
	}
	os.Exit(0)
}

// workerMain is one demo worker: attach, register a vector of its own, then answer every
// step message on stdin with a reply on enc until stdin ends or a message says quit.
func workerMain(id int, enc *json.Encoder) error {
	var p params
	if err := json.Unmarshal([]byte(os.Getenv("SHMSTEER_DEMO_PARAMS")), &p); err != nil {
		return fmt.Errorf("worker %d: params: %w", id, err)
	}
	client, err := ipc.Attach(ipc.ClientOptions{Namespace: p.Namespace, DropEnv: true})
	if err != nil {
		return fmt.Errorf("worker %d: attach: %w", id, err)
	}
	defer client.Close()
	reg, err := keys.Attach(client)
	if err != nil {
		return fmt.Errorf("worker %d: attach: %w", id, err)
	}
	cfg := steer.ModelConfig{Hidden: p.Hidden, Layers: p.Layers}
	eng, err := steer.Attach(client.Region(), &cfg, steer.Options{Caller: client})
	if err != nil {
		return err
	}
	// A worker registers a named vector of its own: a client write, validated by the owner.
	name := fmt.Sprint("worker-vec-", id)
	rng := mrand.New(mrand.NewPCG(p.Seed, uint64(100+id)))
	if _, err := eng.Register(name, randomSet(rng, cfg, 3)); err != nil {
		return fmt.Errorf("worker %d: register over RPC: %w", id, err)
	}
	if err := enc.Encode(reply{Worker: id, Registered: name}); err != nil {
		return err
	}
	w := newStepWorker(id, p, cfg, client, reg, eng, rng)
	defer w.st.Close()
	dec := json.NewDecoder(os.Stdin)
	for {
		var m stepMsg
		if err := dec.Decode(&m); err != nil || m.Quit {
			return nil
		}
		r, err := w.step(m)
		if err != nil {
			return err
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
}

// stepWorker is a worker's state across steps: its stepper and its hidden-state buffers.
type stepWorker struct {
	id     int
	layers int
	cfg    steer.ModelConfig
	client *ipc.Client
	reg    *keys.Worker
	eng    *steer.Worker
	st     *steer.Stepper
	// Hidden states come from one pool drawn from the shared seed, so every worker steers the
	// same inputs and their outputs (and checksums) must agree exactly.
	pool, h, in, bare, bareVec []float32
	keyBuf                     []byte
}

func newStepWorker(id int, p params, cfg steer.ModelConfig, client *ipc.Client, reg *keys.Worker, eng *steer.Worker, rng *mrand.Rand) *stepWorker {
	block := p.Tokens * p.Hidden
	return &stepWorker{
		id: id, layers: p.Layers, cfg: cfg, client: client, reg: reg, eng: eng, st: eng.NewStepper(),
		pool: randVec(mrand.New(mrand.NewPCG(p.Seed, 3)), max(1<<20, 2*block), 1),
		h:    make([]float32, block), in: make([]float32, block), bare: make([]float32, block),
		bareVec: randVec(rng, p.Hidden, 0.1),
		keyBuf:  make([]byte, 0, 64),
	}
}

// step runs one step message: the key lookups, then every site applied and checked against
// the reference at the message's version.
func (w *stepWorker) step(m stepMsg) (reply, error) {
	r := reply{Worker: w.id, Step: m.Step}
	for _, sp := range m.Batch {
		r.Rows = max(r.Rows, sp.End)
	}
	// Key lookups, as a worker does for every request at every step.
	t0 := time.Now()
	for range 16 {
		for _, sp := range m.Batch {
			w.keyBuf, _ = w.reg.Get(sp.ID, w.keyBuf[:0])
			r.Lookups++
		}
	}
	r.LookupNs = time.Since(t0).Nanoseconds()

	if err := w.st.Begin(m.Version); err != nil {
		return r, err
	}
	snap, err := w.client.Region().SnapshotAt(m.Version)
	if err != nil {
		return r, err
	}
	defer snap.Close()
	ref, err := newReference(w.eng.Engine, &snap, m.Batch)
	if err != nil {
		return r, err
	}
	for l := range w.layers {
		for hk := range w.cfg.NumHooks() {
			if err := w.site(m, ref, steer.HookID(hk), l, &r); err != nil {
				return r, err
			}
		}
	}
	r.Sum = w.st.End()
	return r, nil
}

// site applies the step's steering at (hook, layer) to a slice of the pool, times it against
// a bare add of one vector, and counts a mismatch with the reference.
func (w *stepWorker) site(m stepMsg, ref *reference, hook steer.HookID, layer int, r *reply) error {
	d, rows := w.cfg.Hidden, r.Rows
	block := len(w.h)
	off := int((uint64(m.Step)*7919 + uint64(layer)*104729 + uint64(hook)*1299709) % uint64(len(w.pool)-block))
	h, in, bare := w.h[:rows*d], w.in[:rows*d], w.bare[:rows*d]
	copy(h, w.pool[off:])
	copy(in, h)
	copy(bare, h)
	t := time.Now()
	if err := w.st.Apply(hook, layer, h, m.Batch); err != nil {
		return err
	}
	r.ApplyNs += time.Since(t).Nanoseconds()
	t = time.Now()
	if rows > 0 {
		kernels.AddRows(bare, d, 1, w.bareVec)
	}
	r.BareNs += time.Since(t).Nanoseconds()
	if bad := ref.check(hook, layer, in, h, m.Batch); bad != "" {
		r.Mismatches++
		if r.FirstBad == "" {
			r.FirstBad = bad
		}
	}
	return nil
}

// reference is the plain computation of the steering model from what the region holds at the
// pinned version: decode the entries (fully verified), sum every term in float64, clamp.
type reference struct {
	eng    *steer.Engine
	snap   *shm.Snapshot
	global steer.Steering
	reqs   map[string]steer.Steering
	named  map[string][]steer.Vector
}

func newReference(eng *steer.Engine, snap *shm.Snapshot, batch []steer.Span) (*reference, error) {
	ref := &reference{eng: eng, snap: snap, reqs: map[string]steer.Steering{}, named: map[string][]steer.Vector{}}
	cfg := eng.Config()
	if b, _, err := snap.View(steer.KindGlobal, "global"); err == nil {
		if ref.global, _, err = steer.DecodeSteering(b, cfg); err != nil {
			return nil, err
		}
	}
	for _, sp := range batch {
		if b, _, err := snap.View(steer.KindRequest, sp.ID); err == nil {
			s, _, err := steer.DecodeSteering(b, cfg)
			if err != nil {
				return nil, err
			}
			ref.reqs[sp.ID] = s
		}
	}
	return ref, nil
}

func (ref *reference) vector(name string) []steer.Vector {
	v, ok := ref.named[name]
	if !ok {
		nv, err := ref.eng.Vector(ref.snap, name)
		if err == nil {
			v = nv.Vectors
		}
		ref.named[name] = v // nil: unregistered, the term does not apply
	}
	return v
}

// check returns "" if out is in (steered by the reference) within float32 tolerance.
func (ref *reference) check(hook steer.HookID, layer int, in, out []float32, batch []steer.Span) string {
	cfg := ref.eng.Config()
	d := cfg.Hidden
	hn := cfg.HookName(hook)
	owned := make([]bool, len(in)/d)
	row := make([]float64, d)
	for _, sp := range batch {
		eff := make([]float64, d)
		var clamps []steer.Clamp
		req := ref.reqs[sp.ID]
		for _, s := range []*steer.Steering{&ref.global, &req} {
			for _, t := range []*steer.Tier{&s.Base, s.Tier(sp.Phase)} {
				for _, v := range t.Vectors {
					if v.Hook == hn && v.Layer == layer {
						for i := range eff {
							eff[i] += float64(v.Scale) * float64(v.Data[i])
						}
					}
				}
				for _, r := range t.Refs {
					for _, v := range ref.vector(r.Name) {
						if v.Hook == hn && v.Layer == layer {
							for i := range eff {
								eff[i] += float64(r.Strength) * float64(v.Scale) * float64(v.Data[i])
							}
						}
					}
				}
			}
		}
		for _, s := range []*steer.Steering{&ref.global, &req} {
			for _, t := range []*steer.Tier{&s.Base, s.Tier(sp.Phase)} {
				for _, c := range t.Clamps {
					if c.Hook == hn && c.Layer == layer {
						clamps = append(clamps, c)
					}
				}
			}
		}
		for r := sp.Start; r < sp.End; r++ {
			owned[r] = true
			for i := range row {
				row[i] = float64(in[r*d+i]) + eff[i]
			}
			for _, c := range clamps {
				var p float64
				for i := range row {
					p += row[i] * float64(c.Dir[i]) // stored directions are unit length
				}
				q := math.Min(math.Max(p, float64(c.Min)), float64(c.Max))
				for i := range row {
					row[i] += float64(c.Strength) * (q - p) * float64(c.Dir[i])
				}
			}
			for i := range row {
				if math.Abs(float64(out[r*d+i])-row[i]) > 1e-3*(1+math.Abs(row[i])) {
					return fmt.Sprintf("%s layer %d request %s row %d element %d: got %g, reference %g", hn, layer, sp.ID, r, i, out[r*d+i], row[i])
				}
			}
		}
	}
	for r, o := range owned {
		if !o {
			for i := r * d; i < (r+1)*d; i++ {
				if out[i] != in[i] {
					return fmt.Sprintf("row %d belongs to no request but changed", r)
				}
			}
		}
	}
	return ""
}
