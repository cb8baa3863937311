package capture

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// newOwner opens an owner engine over a new region of cfg, declaring decl's consumers.
func newOwner(t testing.TB, cfg steer.ModelConfig, decl map[string]string) *steer.Owner {
	t.Helper()
	v, err := Validators(decl)
	if err != nil {
		t.Fatal(err)
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
	e, err := steer.Open(r, &cfg, steer.Options{CaptureConsumers: v, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestDeclarations(t *testing.T) {
	for _, c := range []struct {
		in   string
		err  error
		name string
	}{
		{"fs=filesystem", nil, "fs"},
		{"a.b-c_1=filesystem", nil, "a.b-c_1"},
		{"fs", ErrConsumerType, ""},
		{"fs=sqlite", ErrConsumerType, ""},
		{"=filesystem", ErrBadConsumer, ""},
		{"a/b=filesystem", ErrBadConsumer, ""},
	} {
		name, typ, err := ParseDeclaration(c.in)
		if !errors.Is(err, c.err) || err == nil && (name != c.name || typ != TypeFilesystem) {
			t.Errorf("%q: %q %q %v, want %q, %v", c.in, name, typ, err, c.name, c.err)
		}
	}
	if _, err := Validators(map[string]string{"fs": "nope"}); !errors.Is(err, ErrConsumerType) {
		t.Errorf("unknown type: %v", err)
	}
	if _, err := Validators(map[string]string{"a b": TypeFilesystem}); !errors.Is(err, ErrBadConsumer) {
		t.Errorf("bad name: %v", err)
	}
}

// The owner validates a filesystem spec at admission and stores what the workers need of its
// plan; every bad spec is its typed error and admits nothing.
func TestAdmitFilesystemSpec(t *testing.T) {
	e := newOwner(t, testCfg, map[string]string{"fs": TypeFilesystem})
	js := spec(`{"post_block": [3, 1], "pre_attn": {"ranges": [[0, 1]]}}`, `[4, 2, 2]`)
	if _, err := e.Admit(steer.Admission{RequestID: "r1", PromptLen: 6, Capture: map[string]json.RawMessage{"fs": json.RawMessage(js)}}); err != nil {
		t.Fatal(err)
	}
	s, err := e.Region().Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rc, err := e.Capture(&s, "r1")
	if err != nil || rc.PromptLen != 6 || len(rc.Consumers) != 1 {
		t.Fatalf("%+v %v", rc, err)
	}
	c := rc.Consumers[0]
	L := int32(testCfg.Layers)
	pre, _ := testCfg.Hook("pre_attn")
	pb, _ := testCfg.Hook("post_block")
	want := []int32{int32(pre)*L + 0, int32(pre)*L + 1, int32(pb)*L + 1, int32(pb)*L + 3}
	if c.Name != "fs" || string(c.Spec) != js || !equalInts(c.Sites, want) {
		t.Fatalf("stored %q %s %v, want sites %v", c.Name, c.Spec, c.Sites, want)
	}
	if c.Positions.Kind != steer.CaptureList || !equalInts(c.Positions.List, []int{2, 4}) || c.Positions.PromptLen != 6 {
		t.Fatalf("positions %+v", c.Positions)
	}
	// The spec decodes again from the stored bytes (a consumer reads tag and request_id there).
	if fs, err := DecodeFilesystemSpec(c.Spec); err != nil || fs.Tag != "t" || fs.RequestID != "r1" {
		t.Fatalf("%+v %v", fs, err)
	}

	for _, b := range []struct {
		capture   string
		promptLen int
		want      error
	}{
		{`{"fs": ` + spec(`{"post_block": [9]}`, `"all"`) + `}`, 4, ErrLayerRange},
		{`{"fs": ` + spec(`{"post_mlp": [0]}`, `"all"`) + `}`, 4, ErrUnknownHook},
		{`{"fs": ` + spec(`{"post_block": [0]}`, `"every"`) + `}`, 4, ErrBadPositions},
		{`{"fs": ` + spec(`{"post_block": [0]}`, `[5]`) + `}`, 4, ErrPositionRange},
		{`{"fs": ` + spec(`{"post_block": [0]}`, `"all"`) + `}`, 0, ErrPositionRange},
		{`{"fs": ` + spec(`{"post_block": [0]}`, `"all"`, `"layout": "sharded"`) + `}`, 4, ErrBadLayout},
		{`{"fs": {"request_id": "../x", "tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}}`, 4, ErrBadSlug},
		{`{"fs": {"hooks": {}}}`, 4, ErrBadSpec},
		{`{"other": ` + spec(`{"post_block": [0]}`, `"all"`) + `}`, 4, steer.ErrCaptureConsumer},
	} {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(b.capture), &m); err != nil {
			t.Fatal(err)
		}
		v0 := e.Region().Version()
		_, err := e.Admit(steer.Admission{RequestID: "r2", PromptLen: b.promptLen, Capture: m})
		if !errors.Is(err, b.want) {
			t.Errorf("%s: %v, want %v", b.capture, err, b.want)
		}
		if e.Region().Version() != v0 {
			t.Errorf("%s: a refused admission wrote the region", b.capture)
		}
	}
}

func equalInts[T int | int32](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
