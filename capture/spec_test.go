package capture

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/shmsteer/shmsteer/steer"
)

var testCfg = steer.ModelConfig{Hidden: 8, Layers: 6} // DefaultHooks: pre_attn post_attn post_block mlp_in mlp_out

func spec(hooks, positions string, extra ...string) string {
	s := `{"request_id": "r1", "tag": "t", "hooks": ` + hooks + `, "positions": ` + positions
	for _, e := range extra {
		s += ", " + e
	}
	return s + "}"
}

func resolve(t *testing.T, js string, promptLen int) (*Plan, error) {
	t.Helper()
	s, err := DecodeFilesystemSpec([]byte(js))
	if err != nil {
		return nil, err
	}
	before := fmt.Sprint(s)
	p, err := s.Resolve(testCfg, promptLen)
	if fmt.Sprint(s) != before {
		t.Fatalf("Resolve changed its spec: %s, then %s", before, fmt.Sprint(s))
	}
	return p, err
}

func sites(p *Plan) string {
	var b []string
	for _, s := range p.Sites {
		b = append(b, fmt.Sprintf("%d/%s", s.Layer, s.HookName))
	}
	return strings.Join(b, " ")
}

func TestHookSelectors(t *testing.T) {
	for _, c := range []struct {
		name, hooks, want string
		err               error
	}{
		{"list", `{"post_block": [3, 1]}`, "1/post_block 3/post_block", nil},
		{"list duplicates", `{"post_block": [2, 2, 0]}`, "0/post_block 2/post_block", nil},
		{"all", `{"pre_attn": "all"}`, "0/pre_attn 1/pre_attn 2/pre_attn 3/pre_attn 4/pre_attn 5/pre_attn", nil},
		{"dict layers", `{"mlp_out": {"layers": [5, 0]}}`, "0/mlp_out 5/mlp_out", nil},
		{"dict ranges", `{"mlp_out": {"ranges": [[1, 3]]}}`, "1/mlp_out 2/mlp_out 3/mlp_out", nil},
		{"dict one-layer range", `{"mlp_out": {"ranges": [[4, 4]]}}`, "4/mlp_out", nil},
		{"dict overlapping ranges and layers", `{"mlp_out": {"layers": [2, 5], "ranges": [[0, 2], [1, 3]]}}`, "0/mlp_out 1/mlp_out 2/mlp_out 3/mlp_out 5/mlp_out", nil},
		{"dict layers null, ranges set", `{"mlp_out": {"layers": null, "ranges": [[0, 0]]}}`, "0/mlp_out", nil},
		{"two hooks sorted by layer then hook order", `{"post_block": [1, 0], "pre_attn": [1]}`, "0/post_block 1/pre_attn 1/post_block", nil},
		{"unknown hook", `{"post_mlp": [0]}`, "", ErrUnknownHook},
		{"layer past the end", `{"post_block": [6]}`, "", ErrLayerRange},
		{"negative layer", `{"post_block": [-1]}`, "", ErrLayerRange},
		{"range start > end", `{"post_block": {"ranges": [[3, 2]]}}`, "", ErrLayerRange},
		{"range past the end", `{"post_block": {"ranges": [[0, 6]]}}`, "", ErrLayerRange},
		{"negative range", `{"post_block": {"ranges": [[-1, 2]]}}`, "", ErrLayerRange},
		{"empty hooks", `{}`, "", ErrEmptySelector},
		{"empty list", `{"post_block": []}`, "", ErrEmptySelector},
		{"empty dict", `{"post_block": {}}`, "", ErrEmptySelector},
		{"dict both null", `{"post_block": {"layers": null, "ranges": null}}`, "", ErrEmptySelector},
		{"dict empty lists", `{"post_block": {"layers": [], "ranges": []}}`, "", ErrEmptySelector},
		{"dict unknown key", `{"post_block": {"layer": [1]}}`, "", ErrBadSpec},
		{"string not all", `{"post_block": "some"}`, "", ErrBadSpec},
		{"bool layer", `{"post_block": [true]}`, "", ErrBadSpec},
		{"fraction layer", `{"post_block": [1.5]}`, "", ErrBadSpec},
		{"exponent layer", `{"post_block": [1e0]}`, "", ErrBadSpec},
		{"string layer", `{"post_block": ["1"]}`, "", ErrBadSpec},
		{"null selector", `{"post_block": null}`, "", ErrBadSpec},
		{"number selector", `{"post_block": 3}`, "", ErrBadSpec},
		{"range of three", `{"post_block": {"ranges": [[0, 1, 2]]}}`, "", ErrBadSpec},
		{"range not a pair", `{"post_block": {"ranges": [3]}}`, "", ErrBadSpec},
		{"ranges not a list", `{"post_block": {"ranges": {"a": 1}}}`, "", ErrBadSpec},
		{"layers not a list", `{"post_block": {"layers": 1}}`, "", ErrBadSpec},
		{"hooks a list", `["post_block"]`, "", ErrBadSpec},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := resolve(t, spec(c.hooks, `"last_prompt"`), 4)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				if !strings.HasPrefix(err.Error(), "shmsteer: ") || strings.Count(err.Error(), "shmsteer:") != 1 {
					t.Fatalf("error %q lacks its shmsteer: prefix", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := sites(p); got != c.want {
				t.Fatalf("sites %q, want %q", got, c.want)
			}
		})
	}
}

func TestPositionSelectors(t *testing.T) {
	type span struct{ first, n int }
	for _, c := range []struct {
		name, positions string
		promptLen       int
		spans           []span
		want            [][]int // rows per span
		err             error
	}{
		{"last_prompt in a prefill", `"last_prompt"`, 5, []span{{0, 5}}, [][]int{{4}}, nil},
		{"last_prompt across chunked prefill", `"last_prompt"`, 5, []span{{0, 3}, {3, 2}, {5, 1}}, [][]int{nil, {1}, nil}, nil},
		{"last_prompt of a one-token prompt", `"last_prompt"`, 1, []span{{0, 1}, {1, 1}}, [][]int{{0}, nil}, nil},
		{"all_prompt", `"all_prompt"`, 4, []span{{0, 2}, {2, 3}, {5, 1}}, [][]int{{0, 1}, {0, 1}, nil}, nil},
		{"all_generated", `"all_generated"`, 3, []span{{0, 3}, {2, 3}, {5, 1}, {6, 1}}, [][]int{nil, {1, 2}, {0}, {0}}, nil},
		{"all", `"all"`, 2, []span{{0, 2}, {2, 1}, {3, 1}}, [][]int{{0, 1}, {0}, {0}}, nil},
		{"list", `[3, 0, 3, 2]`, 4, []span{{0, 2}, {2, 2}, {4, 1}}, [][]int{{0}, {0, 1}, nil}, nil},
		{"list in one decode-sized span", `[1]`, 4, []span{{1, 1}, {0, 1}}, [][]int{{0}, nil}, nil},
		{"empty span", `"all"`, 4, []span{{0, 0}}, [][]int{nil}, nil},
		{"list past the prompt", `[4]`, 4, nil, nil, ErrPositionRange},
		{"negative position", `[-1]`, 4, nil, nil, ErrPositionRange},
		{"empty list", `[]`, 4, nil, nil, ErrEmptySelector},
		{"unknown kind", `"last"`, 4, nil, nil, ErrBadPositions},
		{"bool position", `[false]`, 4, nil, nil, ErrBadSpec},
		{"fraction position", `[0.5]`, 4, nil, nil, ErrBadSpec},
		{"object positions", `{"a": 1}`, 4, nil, nil, ErrBadSpec},
		{"zero prompt", `"all"`, 0, nil, nil, ErrPositionRange},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := resolve(t, spec(`{"post_block": [0]}`, c.positions), c.promptLen)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range c.spans {
				got := p.Rows(nil, s.first, s.n)
				if !slices.Equal(got, c.want[i]) {
					t.Fatalf("span %v: rows %v, want %v", s, got, c.want[i])
				}
				// Rows agrees with Selects row by row.
				var brute []int
				for r := range s.n {
					if p.Selects(s.first + r) {
						brute = append(brute, r)
					}
				}
				if !slices.Equal(got, brute) {
					t.Fatalf("span %v: Rows %v, Selects says %v", s, got, brute)
				}
			}
		})
	}
}

// Rows equals Selects on every span of every selector over a small grid.
func TestRowsMatchesSelects(t *testing.T) {
	for _, pos := range []string{`"last_prompt"`, `"all_prompt"`, `"all_generated"`, `"all"`, `[0, 2, 5, 6]`} {
		for promptLen := 7; promptLen <= 9; promptLen++ {
			p, err := resolve(t, spec(`{"post_block": [0]}`, pos), promptLen)
			if err != nil {
				t.Fatal(err)
			}
			for first := range 12 {
				for n := range 6 {
					got := p.Rows(make([]int, 0, 8), first, n)
					var brute []int
					for r := range n {
						if p.Selects(first + r) {
							brute = append(brute, r)
						}
					}
					if !slices.Equal(got, brute) {
						t.Fatalf("%s prompt %d span (%d, %d): Rows %v, Selects %v", pos, promptLen, first, n, got, brute)
					}
				}
			}
		}
	}
}

func TestSlug(t *testing.T) {
	for _, c := range []struct {
		in, want string
		err      bool
	}{
		{"probe_0001", "probe_0001", false},
		{"mnist-probe-v1.2", "mnist-probe-v1.2", false},
		{"a b/c:d", "a%20b%2Fc%3Ad", false},
		{"é€x", "%C3%A9%E2%82%ACx", false}, // each byte
		{"a/./b", "a%2F.%2Fb", false},
		{"a_b", "a_b", false}, // not a/b's
		{"a%2Fb", "a%252Fb", false},
		{"@acme", "%40acme", false}, // no slug names a tenant's directory
		{".hidden", ".hidden", false},
		{"", "", true},
		{"..", "", true},
		{"a/../b", "", true},
		{"x..y", "", true},
		{"/abs", "", true},
		{".", "", true},
		{strings.Repeat("x", maxSegment), strings.Repeat("x", maxSegment), false},
		{strings.Repeat("x", maxSegment+1), "", true}, // longer than a path segment may be
		{strings.Repeat("x", MaxSlugLen+1), "", true},
		{strings.Repeat("é", 42), strings.Repeat("%C3%A9", 42), false},
		{strings.Repeat("é", 43), "", true}, // 258 bytes encoded
	} {
		got, err := Slug(c.in)
		if c.err {
			if !errors.Is(err, ErrBadSlug) {
				t.Errorf("Slug(%q) = %q, %v; want ErrBadSlug", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want || !isSlug(got) {
			t.Errorf("Slug(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	// Injective: distinct names, distinct slugs.
	seen := map[string]string{}
	for _, n := range []string{"a/b", "a_b", "a b", "a%2Fb", "a%2fb", "é", "_", "%", "%25", "a.b", "A/B"} {
		s, err := Slug(n)
		if err != nil {
			t.Fatal(err)
		}
		if o, ok := seen[s]; ok {
			t.Errorf("%q and %q share the slug %q", o, n, s)
		}
		seen[s] = n
	}
	for _, bad := range []string{"a%2f", "a%41", "a%2", "%", "a b", "..", "%2E%2E"} {
		if isSlug(bad) {
			t.Errorf("isSlug(%q)", bad)
		}
	}
}

func TestFilesystemSpecFields(t *testing.T) {
	for _, c := range []struct {
		name, js string
		err      error
		layout   Layout
	}{
		{"no layout", spec(`{"post_block": [0]}`, `"all"`), nil, LayoutDefault},
		{"null layout", spec(`{"post_block": [0]}`, `"all"`, `"layout": null`), nil, LayoutDefault},
		{"per_file", spec(`{"post_block": [0]}`, `"all"`, `"layout": "per_file"`), nil, LayoutPerFile},
		{"packed", spec(`{"post_block": [0]}`, `"all"`, `"layout": "packed"`), nil, LayoutPacked},
		{"sharded is not written here", spec(`{"post_block": [0]}`, `"all"`, `"layout": "sharded"`), ErrBadLayout, ""},
		{"layout a number", spec(`{"post_block": [0]}`, `"all"`, `"layout": 1`), ErrBadSpec, ""},
		{"unknown field", spec(`{"post_block": [0]}`, `"all"`, `"tags": "x"`), ErrBadSpec, ""},
		{"field case matters", `{"Request_ID": "r", "tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSpec, ""},
		{"missing request_id", `{"tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSpec, ""},
		{"missing tag", `{"request_id": "r", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSpec, ""},
		{"missing hooks", `{"request_id": "r", "tag": "t", "positions": "all"}`, ErrBadSpec, ""},
		{"missing positions", `{"request_id": "r", "tag": "t", "hooks": {"post_block": [0]}}`, ErrBadSpec, ""},
		{"request_id a number", `{"request_id": 1, "tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSpec, ""},
		{"tag traverses", `{"request_id": "r", "tag": "../x", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSlug, ""},
		{"request id absolute", `{"request_id": "/etc", "tag": "t", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSlug, ""},
		{"empty tag", `{"request_id": "r", "tag": "", "hooks": {"post_block": [0]}, "positions": "all"}`, ErrBadSlug, ""},
		{"trailing bytes", spec(`{"post_block": [0]}`, `"all"`) + ` {}`, ErrBadSpec, ""},
		{"not an object", `[1]`, ErrBadSpec, ""},
		{"null", `null`, ErrBadSpec, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := resolve(t, c.js, 3)
			if c.err != nil {
				if !errors.Is(err, c.err) {
					t.Fatalf("err = %v, want %v", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Layout != c.layout || p.RequestID != "r1" || p.IDSlug != "r1" || p.TagSlug != "t" {
				t.Fatalf("plan %+v", p)
			}
		})
	}
	if LayoutDefault.Or(LayoutPacked) != LayoutPacked || LayoutPerFile.Or(LayoutPacked) != LayoutPerFile {
		t.Fatal("Layout.Or")
	}
}

func TestDecodeRequest(t *testing.T) {
	m, err := DecodeRequest([]byte(`{"filesystem": {"request_id": "r"}, "my-probe.v2": 7}`))
	if err != nil || len(m) != 2 || string(m["filesystem"]) != `{"request_id": "r"}` || string(m["my-probe.v2"]) != "7" {
		t.Fatalf("DecodeRequest = %v, %v", m, err)
	}
	for _, none := range []string{`null`, `{}`, ` null `} {
		if m, err := DecodeRequest([]byte(none)); err != nil || m != nil {
			t.Errorf("DecodeRequest(%s) = %v, %v; want no capture", none, m, err)
		}
	}
	many := "{"
	for i := range MaxConsumers + 1 {
		many += fmt.Sprintf(`"c%d": {},`, i)
	}
	many = strings.TrimSuffix(many, ",") + "}"
	for _, c := range []struct {
		js  string
		err error
	}{
		{`[]`, ErrBadSpec},
		{`"filesystem"`, ErrBadSpec},
		{`{"a": 1} x`, ErrBadSpec},
		{`{"": {}}`, ErrBadConsumer},
		{`{"a b": {}}`, ErrBadConsumer},
		{`{"` + strings.Repeat("c", MaxConsumerName+1) + `": {}}`, ErrBadConsumer},
		{many, ErrBadConsumer},
	} {
		if _, err := DecodeRequest([]byte(c.js)); !errors.Is(err, c.err) {
			t.Errorf("DecodeRequest(%.40s) = %v, want %v", c.js, err, c.err)
		}
	}
	// A spec over steer.MaxCaptureSpec is refused as too large (it read "consumer not
	// declared" at the owner); one of exactly that size is not.
	for _, n := range []int{steer.MaxCaptureSpec, steer.MaxCaptureSpec + 1} {
		js := `{"fs": {"pad": "` + strings.Repeat("x", n-len(`{"pad": ""}`)) + `"}}`
		_, err := DecodeRequest([]byte(js))
		if n == steer.MaxCaptureSpec && err != nil {
			t.Errorf("a %d-byte spec: %v", n, err)
		}
		if n > steer.MaxCaptureSpec && (!errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), "too large")) {
			t.Errorf("a %d-byte spec: %v, want ErrBadSpec, too large", n, err)
		}
	}
}

// A spec decoded from a request's capture object, end to end, as a client sends it.
func TestForkExample(t *testing.T) {
	m, err := DecodeRequest([]byte(`{"filesystem": {"request_id": "probe_train_0001", "tag": "capital-probe",
		"hooks": {"post_block": [1, 2, 3, 4]}, "positions": "last_prompt"}}`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := DecodeFilesystemSpec(m[FilesystemConsumer])
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Resolve(testCfg, 12)
	if err != nil {
		t.Fatal(err)
	}
	if sites(p) != "1/post_block 2/post_block 3/post_block 4/post_block" || p.TagSlug != "capital-probe" ||
		!slices.Equal(p.Rows(nil, 8, 4), []int{3}) {
		t.Fatalf("plan %+v", p)
	}
}

// Selector sizes cost the model's layers, not the ranges' lengths summed.
func TestManyOverlappingRanges(t *testing.T) {
	cfg := steer.ModelConfig{Hidden: 8, Layers: steer.MaxLayers}
	var b strings.Builder
	b.WriteString(`{"post_block": {"ranges": [`)
	for i := range 20000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "[0, %d]", steer.MaxLayers-1)
	}
	b.WriteString(`]}}`)
	s, err := DecodeFilesystemSpec([]byte(spec(b.String(), `"all"`)))
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Resolve(cfg, 1)
	if err != nil || len(p.Sites) != steer.MaxLayers {
		t.Fatalf("%d sites, %v", len(p.Sites), err)
	}
}
