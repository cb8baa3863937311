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

	// Hidden states come from one pool drawn from the shared seed, so every worker steers the
	// same inputs and their outputs (and checksums) must agree exactly.
	d := p.Hidden
	block := p.Tokens * d
	pool := randVec(mrand.New(mrand.NewPCG(p.Seed, 3)), max(1<<20, 2*block), 1)
	h, in, bare := make([]float32, block), make([]float32, block), make([]float32, block)
	bareVec := randVec(rng, d, 0.1)
	keyBuf := make([]byte, 0, 64)
	st := eng.NewStepper()
	defer st.Close()
	dec := json.NewDecoder(os.Stdin)
	for {
		var m stepMsg
		if err := dec.Decode(&m); err != nil || m.Quit {
			return nil
		}
		r := reply{Worker: id, Step: m.Step}
		rows := 0
		for _, sp := range m.Batch {
			rows = max(rows, sp.End)
		}
		r.Rows = rows
		// Key lookups, as a worker does for every request at every step.
		t0 := time.Now()
		for range 16 {
			for _, sp := range m.Batch {
				keyBuf, _ = reg.Get(sp.ID, keyBuf[:0])
				r.Lookups++
			}
		}
		r.LookupNs = time.Since(t0).Nanoseconds()

		if err := st.Begin(m.Version); err != nil {
			return err
		}
		snap, err := client.Region().SnapshotAt(m.Version)
		if err != nil {
			return err
		}
		ref, err := newReference(eng.Engine, &snap, m.Batch)
		if err != nil {
			snap.Close()
			return err
		}
		for l := range p.Layers {
			for hk := range cfg.NumHooks() {
				off := int((uint64(m.Step)*7919 + uint64(l)*104729 + uint64(hk)*1299709) % uint64(len(pool)-block))
				copy(h[:rows*d], pool[off:])
				copy(in[:rows*d], h[:rows*d])
				copy(bare[:rows*d], h[:rows*d])
				t := time.Now()
				if err := st.Apply(steer.HookID(hk), l, h[:rows*d], m.Batch); err != nil {
					snap.Close()
					return err
				}
				r.ApplyNs += time.Since(t).Nanoseconds()
				t = time.Now()
				if rows > 0 {
					kernels.AddRows(bare[:rows*d], d, 1, bareVec)
				}
				r.BareNs += time.Since(t).Nanoseconds()
				if bad := ref.check(steer.HookID(hk), l, in[:rows*d], h[:rows*d], m.Batch); bad != "" {
					r.Mismatches++
					if r.FirstBad == "" {
						r.FirstBad = bad
					}
				}
			}
		}
		r.Sum = st.End()
		snap.Close()
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
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
