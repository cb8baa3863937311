//go:build linux

package capture

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// openGlobal opens an owner engine of cfg declaring decl's consumers with global's global
// specs (raw JSON by consumer name), returning Open's error.
func openGlobal(t testing.TB, cfg steer.ModelConfig, decl map[string]string, global map[string]string) (*steer.Owner, *shm.Region, error) {
	t.Helper()
	v, err := Validators(decl)
	if err != nil {
		t.Fatal(err)
	}
	raw := map[string][]byte{}
	for n, s := range global {
		raw[n] = []byte(s)
	}
	g, err := GlobalSpecs(decl, raw)
	if err != nil {
		return nil, nil, err
	}
	rc, err := steer.RegionConfig(cfg, shm.Config{IndexSlots: 1 << 10, ArenaBytes: 8 << 20, ReaderSlots: 16})
	if err != nil {
		t.Fatal(err)
	}
	r, err := shm.Create(rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	e, err := steer.Open(r, &cfg, steer.Options{CaptureConsumers: v, CaptureGlobal: g, Logf: t.Logf})
	return e, r, err
}

// A declared global spec is checked as a request's spec is, at declaration (GlobalSpecs: the
// model-independent checks) and at Open (the model's): each refusal its typed error, and no
// engine.
func TestGlobalSpecRefused(t *testing.T) {
	decl := map[string]string{"g": TypeFilesystem}
	for _, c := range []struct {
		name, spec string
		want       error
	}{
		{"not an object", `[1]`, ErrBadSpec},
		{"null", `null`, ErrBadSpec},
		{"sets request_id", `{"request_id": "x", "tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSpec},
		{"no tag", `{"hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSpec},
		{"unknown field", `{"tag": "t", "hooks": {"post_block": [0]}, "positions": "all", "extra": 1}`, ErrBadSpec},
		{"bad positions", `{"tag": "t", "hooks": {"post_block": [0]}, "positions": "every"}`, ErrBadPositions},
		{"bad layout", `{"tag": "t", "hooks": {"post_block": [0]}, "positions": "all", "layout": "sharded"}`, ErrBadLayout},
		{"unknown hook", `{"tag": "t", "hooks": {"post_mlp": [0]}, "positions": "all"}`, ErrUnknownHook},
		{"layer out of range", `{"tag": "t", "hooks": {"post_block": [6]}, "positions": "all"}`, ErrLayerRange},
		{"bad tag", `{"tag": "../up", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSlug},
	} {
		e, _, err := openGlobal(t, testCfg, decl, map[string]string{"g": c.spec})
		if !errors.Is(err, c.want) || e != nil {
			t.Errorf("%s: %v, want %v and no engine", c.name, err, c.want)
		}
	}
	if _, _, err := openGlobal(t, testCfg, decl, map[string]string{"other": `{"tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}`}); !errors.Is(err, ErrBadConsumer) {
		t.Errorf("undeclared consumer: %v", err)
	}
	// Built by hand (not through GlobalSpecs), a global spec of an undeclared consumer is
	// steer's refusal.
	rc, _ := steer.RegionConfig(testCfg, shm.Config{IndexSlots: 1 << 10, ArenaBytes: 8 << 20, ReaderSlots: 16})
	r, err := shm.Create(rc)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	g := map[string]steer.CaptureGlobalSpec{"x": func(string) ([]byte, error) { return []byte(`{}`), nil }}
	if _, err := steer.Open(r, &testCfg, steer.Options{CaptureGlobal: g}); !errors.Is(err, steer.ErrCaptureConsumer) {
		t.Errorf("steer: undeclared consumer: %v", err)
	}
}

// The fork's merge: a request that does not name a consumer with a global spec is captured
// with it (written under its own id); a request's own spec for that consumer replaces it; a
// global spec that cannot apply to a request (no prompt length for last_prompt, an id that
// cannot name a directory) is skipped for that request, which is still admitted; a request's
// own bad spec still refuses it, whatever the global specs.
func TestAdmitGlobalSpec(t *testing.T) {
	global := `{"tag": "every", "hooks": {"post_block": [1]}, "positions": "last_prompt", "layout": "packed"}`
	e, r, err := openGlobal(t, testCfg, map[string]string{"g": TypeFilesystem, "fs": TypeFilesystem}, map[string]string{"g": global})
	if err != nil {
		t.Fatal(err)
	}
	stored := func(id string) steer.RequestCapture {
		t.Helper()
		s, err := r.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		rc, err := e.Capture(&s, id)
		if err != nil {
			t.Fatal(err)
		}
		for i := range rc.Consumers {
			rc.Consumers[i].Spec = slices.Clone(rc.Consumers[i].Spec)
		}
		return rc
	}
	pb, _ := testCfg.Hook("post_block")
	mo, _ := testCfg.Hook("mlp_out")
	L := int32(testCfg.Layers)

	// No capture of its own: the global spec, under the request's id.
	ad, err := e.Admit(steer.Admission{RequestID: "plain", PromptLen: 5})
	if err != nil {
		t.Fatal(err)
	}
	rc := stored("plain")
	if len(rc.Consumers) != 1 || rc.Consumers[0].Name != "g" || !slices.Equal(rc.Consumers[0].Sites, []int32{int32(pb)*L + 1}) ||
		rc.Consumers[0].Positions.Kind != steer.CaptureLastPrompt || rc.PromptLen != 5 {
		t.Fatalf("stored %+v", rc)
	}
	fs, err := DecodeFilesystemSpec(rc.Consumers[0].Spec)
	if err != nil || fs.RequestID != "plain" || fs.Tag != "every" || fs.Layout != LayoutPacked {
		t.Fatalf("stored spec %s: %+v %v", rc.Consumers[0].Spec, fs, err)
	}
	if !ad.Capture.Global["g"] || len(ad.Capture.Specs) != 1 || !bytes.Equal(ad.Capture.Specs["g"], rc.Consumers[0].Spec) || ad.Capture.PromptLen != 5 || len(ad.Capture.Skipped) != 0 {
		t.Fatalf("admitted %+v", ad.Capture)
	}

	// Its own spec for g replaces the global one; another consumer's spec adds to it.
	own := fsSpec("mine", `{"mlp_out": [2]}`, `"all"`)
	other := fsSpec("o", `{"pre_attn": [0]}`, `[1]`)
	ad, err = e.Admit(steer.Admission{RequestID: "both", PromptLen: 3, Capture: map[string]json.RawMessage{"g": json.RawMessage(own), "fs": json.RawMessage(other)}})
	if err != nil {
		t.Fatal(err)
	}
	rc = stored("both")
	if len(rc.Consumers) != 2 || rc.Consumers[1].Name != "g" || string(rc.Consumers[1].Spec) != own || !slices.Equal(rc.Consumers[1].Sites, []int32{int32(mo)*L + 2}) {
		t.Fatalf("own spec: %+v", rc)
	}
	if ad.Capture.Global["g"] || ad.Capture.Global["fs"] || len(ad.Capture.Specs) != 2 {
		t.Fatalf("own spec admitted %+v", ad.Capture)
	}
	ad, err = e.Admit(steer.Admission{RequestID: "other", PromptLen: 3, Capture: map[string]json.RawMessage{"fs": json.RawMessage(other)}})
	if err != nil {
		t.Fatal(err)
	}
	if rc = stored("other"); len(rc.Consumers) != 2 || !ad.Capture.Global["g"] || ad.Capture.Global["fs"] {
		t.Fatalf("other consumer: %+v %+v", rc, ad.Capture)
	}

	// Skipped, the request admitted: no prompt length; an id that cannot name a directory.
	for id, want := range map[string]error{"noprompt": ErrPositionRange, "a..b": ErrBadSlug} {
		pl := 4
		if id == "noprompt" {
			pl = 0
		}
		ad, err := e.Admit(steer.Admission{RequestID: id, PromptLen: pl})
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if !errors.Is(ad.Capture.Skipped["g"], want) || len(ad.Capture.Specs) != 0 || len(stored(id).Consumers) != 0 {
			t.Fatalf("%s: %+v, want g skipped with %v", id, ad.Capture, want)
		}
	}

	// A request's own bad spec refuses it and changes nothing.
	v0 := r.Version()
	if _, err := e.Admit(steer.Admission{RequestID: "bad", PromptLen: 3, Capture: map[string]json.RawMessage{"fs": json.RawMessage(fsSpec("b", `{"post_block": [9]}`, `"all"`))}}); !errors.Is(err, ErrLayerRange) {
		t.Fatalf("own bad spec: %v", err)
	}
	if r.Version() != v0 || len(stored("bad").Consumers) != 0 {
		t.Fatal("a refused admission wrote the region")
	}
	// End drops what the global spec stored.
	if _, err := e.End("plain"); err != nil {
		t.Fatal(err)
	}
	if len(stored("plain").Consumers) != 0 {
		t.Fatal("ended request keeps its capture")
	}
}

// The hub tells a global spec's consumer of a request that named no capture, and the result
// says the global spec captured it; a skipped global spec is the request's error result.
func TestHubGlobalResults(t *testing.T) {
	h, err := NewHub(HubOptions{Consumers: map[string]string{"g": TypeFilesystem}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	h.Begin("r", steer.AdmittedCapture{Specs: map[string]json.RawMessage{"g": json.RawMessage(`{}`)}, Global: map[string]bool{"g": true}, PromptLen: 2})
	res, _ := h.Result("r")
	if g := res["g"]; g.Status != StatusError || !g.Global { // not attached: error at once, still marked global
		t.Fatalf("%+v", g)
	}
	h.Begin("s", steer.AdmittedCapture{Skipped: map[string]error{"g": ErrPositionRange}})
	res, _ = h.Result("s")
	b, _ := json.Marshal(res["g"])
	if g := res["g"]; g.Status != StatusError || !g.Global || !bytes.Contains(b, []byte(`"global":true`)) || !bytes.Contains(b, []byte("out of range")) {
		t.Fatalf("skipped: %s", b)
	}
	res, _ = h.Result("never")
	if b, _ := json.Marshal(res["g"]); bytes.Contains(b, []byte("global")) {
		t.Fatalf("not requested: %s", b)
	}
}

// A worker process steps requests of which one names no capture: the owner's global spec put
// its capture in the region, and the worker captures exactly the global spec's rows for it,
// the own spec's rows for the request that names the consumer, nothing for the one the global
// spec skipped.
func TestGlobalSpecWorkerProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	global := `{"tag": "every", "hooks": {"post_block": [1]}, "positions": "all_generated"}`
	e, _, err := openGlobal(t, rankCfg, map[string]string{"g": TypeFilesystem}, map[string]string{"g": global})
	if err != nil {
		t.Fatal(err)
	}
	// rankIDs a, b, c: a names nothing, b its own spec for g, c no prompt length (skipped).
	adm := map[string]steer.Admission{
		"a": {RequestID: "a", PromptLen: 4},
		"b": {RequestID: "b", PromptLen: 4, Capture: map[string]json.RawMessage{"g": json.RawMessage(fsSpec("b", `{"mlp_out": [2]}`, `"all"`))}},
		"c": {RequestID: "c"},
	}
	for _, id := range rankIDs {
		if _, err := e.Admit(adm[id]); err != nil {
			t.Fatal(err)
		}
	}
	ring := newRing(t, 4<<20, 1)
	rd, err := ring.Attach(Block)
	if err != nil {
		t.Fatal(err)
	}
	data, readers := e.Region().Files()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), rankChildEnv+"=0")
	cmd.ExtraFiles = []*os.File{data, readers, ringFile(t, ring)}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	pb, _ := rankCfg.Hook("post_block")
	mo, _ := rankCfg.Hook("mlp_out")
	type key struct {
		id    string
		hook  string
		layer int
	}
	seen := map[key][]int{}
	for {
		rec, ok, err := rd.Next()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		h, _ := rankCfg.Hook(rec.Hook)
		site := int(h)*rankCfg.Layers + rec.Layer
		var want []float32
		for _, pos := range rec.Positions {
			for i := range rankCfg.Hidden {
				want = append(want, rankValue(0, site, pos, i))
			}
		}
		if !bytes.Equal(rec.Data, shm.Float32Bytes(want)) {
			t.Fatalf("record %s %s/%d: not the rows the worker saw", rec.RequestID, rec.Hook, rec.Layer)
		}
		k := key{rec.RequestID, rec.Hook, rec.Layer}
		seen[k] = append(seen[k], rec.Positions...)
	}
	want := map[key][]int{
		{"a", rankCfg.HookName(pb), 1}: {4, 5, 6, 7, 8, 9},
		{"b", rankCfg.HookName(mo), 2}: {0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
	}
	if len(seen) != len(want) {
		t.Fatalf("captured %v, want %v", seen, want)
	}
	for k, pos := range want {
		if !slices.Equal(seen[k], pos) {
			t.Fatalf("%v: positions %v, want %v", k, seen[k], pos)
		}
	}
}
