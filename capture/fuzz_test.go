package capture

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
)

// FuzzDecodeFilesystemSpec: any bytes decode to a spec or a typed error, never a panic; a spec
// that resolves has sorted distinct sites inside the model and rows inside every span.
func FuzzDecodeFilesystemSpec(f *testing.F) {
	for _, s := range []string{
		spec(`{"post_block": [3, 1]}`, `"last_prompt"`),
		spec(`{"pre_attn": "all", "mlp_out": {"layers": [1], "ranges": [[0, 2]]}}`, `[0, 2, 2]`, `"layout": "packed"`),
		spec(`{"post_block": {"ranges": [[5, 1]]}}`, `"all_generated"`),
		`{"request_id": "../x", "tag": "é/t", "hooks": {}, "positions": "all"}`,
		`{"filesystem": null}`, `[`, `null`,
	} {
		f.Add([]byte(s), 4, 2, 3)
	}
	sentinels := []error{ErrBadSpec, ErrBadSlug, ErrUnknownHook, ErrLayerRange, ErrEmptySelector, ErrBadPositions, ErrPositionRange, ErrBadLayout}
	f.Fuzz(func(t *testing.T, b []byte, promptLen, first, n int) {
		typed := func(err error) {
			if !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(err, s) }) {
				t.Fatalf("untyped error %v", err)
			}
			if !strings.HasPrefix(err.Error(), "shmsteer: ") || strings.Count(err.Error(), "shmsteer:") != 1 {
				t.Fatalf("error %q wants one shmsteer: prefix", err)
			}
		}
		if _, err := DecodeRequest(b); err != nil && !errors.Is(err, ErrBadSpec) && !errors.Is(err, ErrBadConsumer) {
			t.Fatalf("DecodeRequest: untyped error %v", err)
		}
		s, err := DecodeFilesystemSpec(b)
		if err != nil {
			typed(err)
			return
		}
		promptLen %= 1 << 20
		p, err := s.Resolve(testCfg, promptLen)
		if err != nil {
			typed(err)
			return
		}
		for i, st := range p.Sites {
			if st.Layer < 0 || st.Layer >= testCfg.Layers || testCfg.HookName(st.Hook) != st.HookName {
				t.Fatalf("site %+v", st)
			}
			if i > 0 && (p.Sites[i-1].Layer > st.Layer || p.Sites[i-1].Layer == st.Layer && p.Sites[i-1].Hook >= st.Hook) {
				t.Fatalf("sites not sorted and distinct: %+v", p.Sites)
			}
		}
		first, n = first%(1<<20), n%4096
		rows := p.Rows(nil, first, n)
		for i, r := range rows {
			if r < 0 || r >= n || (i > 0 && rows[i-1] >= r) || !p.Selects(first+r) {
				t.Fatalf("rows %v of span (%d, %d)", rows, first, n)
			}
		}
	})
}

// FuzzCaptureAdmission: a request's capture object and a consumer declaration, as serve's
// admit and --capture-consumer read them, decode or fail typed, never panic; what decodes
// validates (ValidateFilesystem) to a selection of the model's sites or a typed error.
func FuzzCaptureAdmission(f *testing.F) {
	f.Add([]byte(`{"fs": `+spec(`{"post_block": "all"}`, `"all"`)+`}`), "fs=filesystem", 5)
	f.Add([]byte(`{"a b": {}}`), "fs", 0)
	f.Add([]byte(`[]`), "=filesystem", -1)
	sentinels := []error{ErrBadSpec, ErrBadConsumer, ErrBadSlug, ErrUnknownHook, ErrLayerRange, ErrEmptySelector, ErrBadPositions, ErrPositionRange, ErrBadLayout, ErrConsumerType}
	typed := func(t *testing.T, err error) {
		if !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(err, s) }) {
			t.Fatalf("untyped error %v", err)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, decl string, promptLen int) {
		if name, typ, err := ParseDeclaration(decl); err != nil {
			typed(t, err)
		} else if name == "" || typ != TypeFilesystem {
			t.Fatalf("declaration %q parsed to %q %q", decl, name, typ)
		}
		m, err := DecodeRequest(b)
		if err != nil {
			typed(t, err)
			return
		}
		nsites := int32(testCfg.NumHooks() * testCfg.Layers)
		for _, raw := range m {
			sel, err := ValidateFilesystem(testCfg, raw, promptLen)
			if err != nil {
				typed(t, err)
				continue
			}
			if len(sel.Sites) == 0 || !slices.IsSorted(sel.Sites) || sel.Sites[0] < 0 || sel.Sites[len(sel.Sites)-1] >= nsites {
				t.Fatalf("sites %v", sel.Sites)
			}
		}
	})
}

// FuzzGlobalSpec: a consumer's global spec as serve's --capture-global reads it, checked or
// refused typed, never a panic; what checks instantiates for any request id to a spec whose
// request_id is that id, which validates (ValidateFilesystem) or fails typed.
func FuzzGlobalSpec(f *testing.F) {
	f.Add([]byte(`{"tag": "t", "hooks": {"post_block": "all"}, "positions": "all"}`), "r1", 5)
	f.Add([]byte(`{"tag": "t", "hooks": {"pre_attn": [0]}, "positions": [1, 2], "layout": "packed"}`), "a/../b", 2)
	f.Add([]byte(`{"request_id": "x"}`), "", 0)
	f.Add([]byte(`null`), "r", 1)
	sentinels := []error{ErrBadSpec, ErrBadSlug, ErrUnknownHook, ErrLayerRange, ErrEmptySelector, ErrBadPositions, ErrPositionRange, ErrBadLayout}
	typed := func(t *testing.T, err error) {
		if !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(err, s) }) {
			t.Fatalf("untyped error %v", err)
		}
	}
	decl := map[string]string{"g": TypeFilesystem}
	f.Fuzz(func(t *testing.T, b []byte, requestID string, promptLen int) {
		g, err := GlobalSpecs(decl, map[string][]byte{"g": b})
		if err != nil {
			typed(t, err)
			return
		}
		spec, err := g["g"](requestID)
		if err != nil {
			typed(t, err)
			return
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(spec, &fields); err != nil {
			t.Fatalf("instance %q does not parse: %v", spec, err)
		}
		var id string
		if err := json.Unmarshal(fields["request_id"], &id); err != nil || id != requestID {
			t.Fatalf("instance request_id %s, want %q (%v)", fields["request_id"], requestID, err)
		}
		if _, err := ValidateFilesystem(testCfg, spec, promptLen); err != nil {
			typed(t, err)
		}
	})
}

// Slug is injective and its output is what isSlug (OpenRequest's check) accepts: two names
// with one slug, or a slug isSlug refuses, or an isSlug-accepted string that is not the slug
// of the name it decodes to, fail. TenantDir never yields a name a slug can take.
func FuzzSlug(f *testing.F) {
	for _, s := range []string{"a/b", "a_b", "a%2Fb", "é", "..", ".", "@x", "%41", strings.Repeat("x", 300)} {
		f.Add(s, "a_b")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		sa, erra := Slug(a)
		sb, errb := Slug(b)
		if erra == nil && !isSlug(sa) {
			t.Fatalf("isSlug(Slug(%q) = %q) is false", a, sa)
		}
		if erra == nil && errb == nil && a != b && sa == sb {
			t.Fatalf("%q and %q share the slug %q", a, b, sa)
		}
		if erra == nil && strings.HasPrefix(sa, "@") {
			t.Fatalf("Slug(%q) = %q names a tenant directory", a, sa)
		}
		if isSlug(a) {
			if len(a) > maxSegment || strings.Contains(a, "/") || a == "." || a == ".." || strings.Contains(a, "..") {
				t.Fatalf("isSlug(%q) accepts a bad path segment", a)
			}
		}
		if d := TenantDir(a); d != "" && (!strings.HasPrefix(d, "@") || strings.Contains(d, "/")) {
			t.Fatalf("TenantDir(%q) = %q", a, d)
		}
	})
}
