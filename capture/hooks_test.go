//go:build linux

package capture

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// hookReq is one captured request of a hooks test: its specs, prompt, and the spans its
// steps give it (prefill chunks, then decode rows).
type hookReq struct {
	id        string
	specs     map[string]string // consumer → spec JSON
	promptLen int
	plans     []*Plan // resolved independently of the hooks, for the expected rows
}

// site key of the expected and the captured rows.
type hookKey struct {
	id    string
	layer int
	hook  string
}

type siteRows struct {
	pos  []int
	data []byte
}

// hookPath says how a test step hands a site's block to the engine.
type hookPath int

const (
	pathApply   hookPath = iota // Stepper.Apply on float32 (captures, then steers)
	pathCapture                 // Stepper.Capture on the block in its dtype, then Apply on float32
	pathBatch                   // Batch.Resolve, gather CaptureRows, Batch.Capture
)

func (p hookPath) String() string { return [...]string{"apply", "capture", "batch"}[p] }

// bf16 renders f as bfloat16 bits (truncated) and back, so both paths see the same values.
func bf16(f float32) (uint16, float32) {
	b := uint16(math.Float32bits(f) >> 16)
	return b, math.Float32frombits(uint32(b) << 16)
}

// runHooks steps reqs through prefill (in chunks of chunk tokens) and decode steps at every
// site of the model, through path, in dtype dt, and returns what reached the ring and what
// the hooks saw at the sites and positions the plans select (computed with Plan.Selects, not
// with the hooks' Rows).
func runHooks(t *testing.T, cfg steer.ModelConfig, decl map[string]string, reqs []hookReq, chunk, decodeSteps int, path hookPath, dt steer.CaptureDtype) (got, want map[hookKey]*siteRows) {
	t.Helper()
	e := newOwner(t, cfg, decl)
	rng := rand.New(rand.NewPCG(uint64(len(reqs)), uint64(path)))
	admitHookReqs(t, e, cfg, reqs)
	ring := newRing(t, 1<<22, 1)
	rd, err := ring.Attach(Block)
	if err != nil {
		t.Fatal(err)
	}
	st := e.NewStepper()
	defer st.Close()
	if err := st.SetCapture(steer.CaptureOptions{Sink: NewRingSink(ring.Writer(0))}); err != nil {
		t.Fatal(err)
	}
	var b *steer.Batch
	if path == pathBatch {
		if b, err = st.NewBatch(steer.BatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	got, want = map[hookKey]*siteRows{}, map[hookKey]*siteRows{}
	done := make([]int, len(reqs)) // tokens computed per request
	d := cfg.Hidden
	size := dt.Size()
	for step := 0; ; step++ {
		spans, rows := hookStepSpans(reqs, done, chunk, decodeSteps)
		if len(spans) == 0 {
			break
		}
		if path == pathBatch {
			if err := b.Resolve(0, spans, rows); err != nil {
				t.Fatal(err)
			}
		} else if err := st.Begin(0); err != nil {
			t.Fatal(err)
		}
		for h := range cfg.NumHooks() {
			for l := range cfg.Layers {
				hook := steer.HookID(h)
				f32, raw := hookRows(t, rng, rows*d, dt)
				wantSelected(want, reqs, spans, cfg.HookName(hook), hook, l, raw, d*size)
				switch path {
				case pathApply:
					if dt != steer.CaptureF32 {
						t.Fatal("Apply captures float32")
					}
					if err := st.Apply(hook, l, f32, spans); err != nil {
						t.Fatal(err)
					}
				case pathCapture:
					if err := st.Capture(hook, l, raw, dt, spans); err != nil {
						t.Fatal(err)
					}
					if err := st.Apply(hook, l, f32, spans); err != nil { // captured already: steers only
						t.Fatal(err)
					}
				case pathBatch:
					site := int32(h*cfg.Layers + l)
					var data []byte
					if i, ok := slices.BinarySearch(b.CaptureSites, site); ok {
						for _, r := range b.CaptureRows[b.CaptureStart[i]:b.CaptureStart[i+1]] {
							data = append(data, raw[int(r)*d*size:(int(r)+1)*d*size]...)
						}
					}
					if err := b.Capture(site, dt, data); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		st.End()
		for i := range spans {
			for j := range reqs {
				if reqs[j].id == spans[i].ID {
					done[j] += spans[i].End - spans[i].Start
				}
			}
		}
		// Drain: records of one site and request arrive in position order across steps.
		drainHookRecords(t, rd, got, size, d)
	}
	if s := st.Stats(); s.CaptureErrors != 0 {
		t.Fatalf("%d sink errors: %v", s.CaptureErrors, st.CaptureErr())
	}
	return got, want
}

// admitHookReqs resolves each request's capture specs into its plans and admits it, steered at
// every site so that a capture after the add would differ.
func admitHookReqs(t *testing.T, e *steer.Owner, cfg steer.ModelConfig, reqs []hookReq) {
	t.Helper()
	var vecs []steer.Vector
	for h := range cfg.NumHooks() {
		for l := range cfg.Layers {
			v := make([]float32, cfg.Hidden)
			for i := range v {
				v[i] = 1 + float32(i)
			}
			vecs = append(vecs, steer.Vector{Hook: cfg.HookName(steer.HookID(h)), Layer: l, Scale: 1, Data: v})
		}
	}
	for i := range reqs {
		r := &reqs[i]
		caps := map[string]json.RawMessage{}
		for name, js := range r.specs {
			caps[name] = json.RawMessage(js)
			fs, err := DecodeFilesystemSpec([]byte(js))
			if err != nil {
				t.Fatal(err)
			}
			p, err := fs.Resolve(cfg, r.promptLen)
			if err != nil {
				t.Fatal(err)
			}
			r.plans = append(r.plans, p)
		}
		if _, err := e.Admit(steer.Admission{RequestID: r.id, PromptLen: r.promptLen, Capture: caps, Override: &steer.Steering{Base: steer.Tier{Vectors: vecs}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// hookStepSpans is the next step's batch: a chunk of prompt for each request still in prefill,
// one decode row for each with decode steps left (done counts the tokens computed).
func hookStepSpans(reqs []hookReq, done []int, chunk, decodeSteps int) ([]steer.Span, int) {
	var spans []steer.Span
	rows := 0
	for i := range reqs {
		r := &reqs[i]
		n, ph := 1, steer.PhaseDecode
		if done[i] < r.promptLen {
			n, ph = min(chunk, r.promptLen-done[i]), steer.PhasePrefill
		} else if done[i] >= r.promptLen+decodeSteps {
			continue
		}
		spans = append(spans, steer.Span{ID: r.id, Start: rows, End: rows + n, Phase: ph, Pos: done[i]})
		rows += n
	}
	return spans, rows
}

// hookRows draws n random hidden-state floats and returns them as float32 and as the raw bytes
// of dtype dt (in bf16, the floats are the rounded values).
func hookRows(t *testing.T, rng *rand.Rand, n int, dt steer.CaptureDtype) ([]float32, []byte) {
	t.Helper()
	f32 := make([]float32, n)
	raw := make([]byte, n*dt.Size())
	for i := range f32 {
		x := float32(rng.NormFloat64())
		switch dt {
		case steer.CaptureF32:
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		case steer.CaptureBF16:
			var bits uint16
			bits, x = bf16(x)
			binary.LittleEndian.PutUint16(raw[2*i:], bits)
		default:
			t.Fatalf("dtype %s", dt)
		}
		f32[i] = x
	}
	return f32, raw
}

// wantSelected appends to want the rows of raw (rowBytes each) that the requests' plans select
// at site (hook, l), as the hooks saw them.
func wantSelected(want map[hookKey]*siteRows, reqs []hookReq, spans []steer.Span, hookName string, hook steer.HookID, l int, raw []byte, rowBytes int) {
	for _, sp := range spans {
		var reqIx int
		for reqIx = range reqs {
			if reqs[reqIx].id == sp.ID {
				break
			}
		}
		for row := sp.Start; row < sp.End; row++ {
			pos := sp.Pos + row - sp.Start
			sel := false
			for _, p := range reqs[reqIx].plans {
				sel = sel || p.Selects(pos) && slices.ContainsFunc(p.Sites, func(s Site) bool { return s.Hook == hook && s.Layer == l })
			}
			if sel {
				k := hookKey{sp.ID, l, hookName}
				if want[k] == nil {
					want[k] = &siteRows{}
				}
				want[k].pos = append(want[k].pos, pos)
				want[k].data = append(want[k].data, raw[row*rowBytes:(row+1)*rowBytes]...)
			}
		}
	}
}

// drainHookRecords reads every record in the ring into got, checking each has the dtype size and
// width d.
func drainHookRecords(t *testing.T, rd *RingReader, got map[hookKey]*siteRows, size, d int) {
	t.Helper()
	for {
		rec, ok, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		if rec.Dtype.Size() != size || rec.Width != d {
			t.Fatalf("record of %s width %d", rec.Dtype, rec.Width)
		}
		k := hookKey{rec.RequestID, rec.Layer, rec.Hook}
		if got[k] == nil {
			got[k] = &siteRows{}
		}
		got[k].pos = append(got[k].pos, rec.Positions...)
		got[k].data = append(got[k].data, rec.Data...)
	}
}

func compareCaptured(t *testing.T, got, want map[hookKey]*siteRows) {
	t.Helper()
	for k, w := range want {
		g := got[k]
		if g == nil {
			t.Errorf("%v: nothing captured, want positions %v", k, w.pos)
			continue
		}
		if !slices.Equal(g.pos, w.pos) || !bytes.Equal(g.data, w.data) {
			t.Errorf("%v: captured positions %v (data equal %v), want %v", k, g.pos, bytes.Equal(g.data, w.data), w.pos)
		}
	}
	for k, g := range got {
		if want[k] == nil {
			t.Errorf("%v: captured positions %v, want none", k, g.pos)
		}
	}
}

func fsSpec(id, hooks, positions string) string {
	return fmt.Sprintf(`{"request_id": %q, "tag": "t", "hooks": %s, "positions": %s}`, id, hooks, positions)
}

// Every position selector and hook selector, through every hook path, rows bitwise what the
// hooks saw before steering, in float32 and bfloat16; chunked prefill and decode steps.
func TestHooksCaptureSelectors(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 8, Layers: 4}
	decl := map[string]string{"fs": TypeFilesystem, "probe": TypeFilesystem}
	reqs := []hookReq{
		{id: "last", promptLen: 7, specs: map[string]string{"fs": fsSpec("last", `{"post_block": [3, 1]}`, `"last_prompt"`)}},
		{id: "prompt", promptLen: 5, specs: map[string]string{"fs": fsSpec("prompt", `{"pre_attn": "all"}`, `"all_prompt"`)}},
		{id: "gen", promptLen: 3, specs: map[string]string{"fs": fsSpec("gen", `{"mlp_out": {"layers": [0], "ranges": [[2, 3]]}}`, `"all_generated"`)}},
		{id: "all", promptLen: 4, specs: map[string]string{"fs": fsSpec("all", `{"mlp_in": {"ranges": [[0, 1], [1, 2]]}, "post_attn": [0]}`, `"all"`)}},
		{id: "list", promptLen: 9, specs: map[string]string{"fs": fsSpec("list", `{"post_block": "all"}`, `[8, 0, 4, 4]`)}},
		// Two consumers: their union at the sites they share, each alone elsewhere.
		{id: "two", promptLen: 6, specs: map[string]string{
			"fs":    fsSpec("two", `{"post_block": [1, 2]}`, `"last_prompt"`),
			"probe": fsSpec("two", `{"post_block": [2], "pre_attn": [0]}`, `[1, 2]`)}},
		{id: "none", promptLen: 3},
	}
	for _, path := range []hookPath{pathApply, pathCapture, pathBatch} {
		for _, dt := range []steer.CaptureDtype{steer.CaptureF32, steer.CaptureBF16} {
			if path == pathApply && dt != steer.CaptureF32 {
				continue
			}
			t.Run(fmt.Sprintf("%s/%s", path, dt), func(t *testing.T) {
				got, want := runHooks(t, cfg, decl, slices.Clone(reqs), 3, 4, path, dt)
				if len(want) < 10 {
					t.Fatalf("the scenario captures too little: %d sites", len(want))
				}
				compareCaptured(t, got, want)
			})
		}
	}
}

// A captured request's decode span must carry its position; capture is the writing rank's
// only; a Stepper without a sink reads no capture entries.
func TestHooksCaptureRefusalsAndRanks(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 4, Layers: 2}
	e := newOwner(t, cfg, map[string]string{"fs": TypeFilesystem})
	if _, err := e.Admit(steer.Admission{RequestID: "r", PromptLen: 5, Capture: map[string]json.RawMessage{
		"fs": json.RawMessage(fsSpec("r", `{"post_block": "all"}`, `"all"`))}}); err != nil {
		t.Fatal(err)
	}
	ring := newRing(t, 1<<16, 1)
	rd, _ := ring.Attach(Drop)
	pb, _ := cfg.Hook("post_block")
	h := make([]float32, cfg.Hidden)
	for _, c := range []struct {
		rank, writer int
		sink         bool
		records      uint64
	}{{0, 0, true, 1}, {1, 0, true, 0}, {2, 2, true, 1}, {0, 0, false, 0}} {
		st := e.NewStepper()
		o := steer.CaptureOptions{Rank: c.rank, WriterRank: c.writer}
		if c.sink {
			o.Sink = NewRingSink(ring.Writer(0))
		}
		if err := st.SetCapture(o); err != nil {
			t.Fatal(err)
		}
		if err := st.Begin(0); err != nil {
			t.Fatal(err)
		}
		if err := st.Apply(pb, 1, h, []steer.Span{{ID: "r", Start: 0, End: 1, Phase: steer.PhaseDecode, Pos: 5}}); err != nil {
			t.Fatal(err)
		}
		st.End()
		if s := st.Stats(); s.CaptureRecords != c.records {
			t.Errorf("rank %d of writer %d (sink %v): %d records, want %d", c.rank, c.writer, c.sink, s.CaptureRecords, c.records)
		}
		for {
			if _, ok, _ := rd.Next(); !ok {
				break
			}
		}
		// A decode span without its position is refused where capture reads the entry.
		if err := st.Begin(0); err != nil {
			t.Fatal(err)
		}
		h2 := []float32{1, 2, 3, 4}
		err := st.Apply(pb, 1, h2, []steer.Span{{ID: "r", Start: 0, End: 1, Phase: steer.PhaseDecode}})
		if c.records > 0 && (!errors.Is(err, steer.ErrBadBatch) || !slices.Equal(h2, []float32{1, 2, 3, 4})) {
			t.Errorf("decode span at position 0: %v, h %v", err, h2)
		} else if c.records == 0 && err != nil {
			t.Errorf("a Stepper that does not capture refused: %v", err)
		}
		st.Close()
	}
	if err := e.NewStepper().SetCapture(steer.CaptureOptions{Rank: -1}); !errors.Is(err, steer.ErrBadConfig) {
		t.Errorf("negative rank: %v", err)
	}
}

// Batch.Capture checks its data against the plan and changes nothing on a mismatch.
func TestBatchCaptureChecks(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 4, Layers: 2}
	e := newOwner(t, cfg, map[string]string{"fs": TypeFilesystem})
	if _, err := e.Admit(steer.Admission{RequestID: "r", PromptLen: 3, Capture: map[string]json.RawMessage{
		"fs": json.RawMessage(fsSpec("r", `{"post_block": [1]}`, `"all_prompt"`))}}); err != nil {
		t.Fatal(err)
	}
	ring := newRing(t, 1<<16, 1)
	rd, _ := ring.Attach(Drop)
	st := e.NewStepper()
	if err := st.SetCapture(steer.CaptureOptions{Sink: NewRingSink(ring.Writer(0))}); err != nil {
		t.Fatal(err)
	}
	b, _ := st.NewBatch(steer.BatchOptions{})
	if err := b.Resolve(0, []steer.Span{{ID: "r", Start: 1, End: 4, Phase: steer.PhasePrefill}}, 5); err != nil {
		t.Fatal(err)
	}
	st.End() // the plan stays valid until the next Resolve
	pb, _ := cfg.Hook("post_block")
	site := int32(int(pb)*cfg.Layers + 1)
	if !slices.Equal(b.CaptureSites, []int32{site}) || !slices.Equal(b.CaptureRows, []int32{1, 2, 3}) || !slices.Equal(b.CaptureStart, []int32{0, 3}) {
		t.Fatalf("plan %v %v %v", b.CaptureSites, b.CaptureStart, b.CaptureRows)
	}
	for _, c := range []struct {
		site int32
		dt   steer.CaptureDtype
		n    int
		want error
	}{{site, steer.CaptureF32, 2 * 16, steer.ErrShape}, {site, 7, 3 * 16, steer.ErrShape}, {99, steer.CaptureF32, 0, steer.ErrLayerRange}, {0, steer.CaptureF32, 16, steer.ErrShape}} {
		if err := b.Capture(c.site, c.dt, make([]byte, c.n)); !errors.Is(err, c.want) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if _, ok, _ := rd.Next(); ok {
		t.Fatal("a refused Capture wrote a record")
	}
	if err := b.Capture(0, steer.CaptureF32, nil); err != nil { // a site with no rows takes none
		t.Fatal(err)
	}
	data := shm.Float32Bytes([]float32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	if err := b.Capture(site, steer.CaptureF32, data); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := rd.Next()
	if err != nil || !ok || !slices.Equal(rec.Positions, []int{0, 1, 2}) || !bytes.Equal(rec.Data, data) {
		t.Fatalf("%+v %v %v", rec, ok, err)
	}
}
