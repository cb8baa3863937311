package steer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// errTestPacked is testUnpack's refusal.
var errTestPacked = errors.New("test packed blob refused")

// testUnpack stands in for serve's packed decoder: a blob is {"layer_indices": [..], "rows":
// [[floats], ..]}.
func testUnpack(hook string, raw json.RawMessage) ([]Vector, error) {
	var p struct {
		LayerIndices []int       `json:"layer_indices"`
		Rows         [][]float32 `json:"rows"`
	}
	if err := json.Unmarshal(raw, &p); err != nil || len(p.LayerIndices) != len(p.Rows) {
		return nil, errTestPacked
	}
	out := make([]Vector, len(p.Rows))
	for i := range p.Rows {
		out[i] = Vector{Hook: hook, Layer: p.LayerIndices[i], Scale: 1, Data: p.Rows[i]}
	}
	return out, nil
}

const (
	srcProbe  = `{"kind": "name", "name": "p"}`
	srcSteer  = `{"kind": "name", "name": "s"}`
	srcInline = `{"kind": "inline", "packed": {"post_block": {"layer_indices": [1], "rows": [[1, 2, 3, 4]]}}}`
)

func gateJSON(when, scope, apply string) string {
	return fmt.Sprintf(`[{"when": %s, "scope": %s, "apply": %s}]`, when, scope, apply)
}

func TestDecodeGates(t *testing.T) {
	probeWhen := `{"kind": "probe", "probe": ` + srcProbe + `, "threshold": 0.5, "sharpness": 4}`
	add := `{"kind": "add", "steer": ` + srcSteer + `, "strength": 2}`
	cases := []struct {
		name string
		in   string
		want Gate
	}{
		{"always add default strength", gateJSON(`{"kind": "always"}`, `"rest_of_request"`, `{"kind": "add", "steer": `+srcSteer+`}`),
			Gate{Scope: ScopeRestOfRequest, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 1}}},
		{"probe this_token add", gateJSON(probeWhen, `"this_token"`, add),
			Gate{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 4}, Scope: ScopeThisToken, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}},
		{"probe default sharpness", gateJSON(`{"kind": "probe", "probe": `+srcProbe+`, "threshold": -1}`, `"next_step"`, add),
			Gate{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: -1, Sharpness: 1}, Scope: ScopeNextStep, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}},
		{"attenuate next_step", gateJSON(probeWhen, `"next_step"`, `{"kind": "attenuate", "strength": 0.25}`),
			Gate{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: 0.5, Sharpness: 4}, Scope: ScopeNextStep, Apply: GateApply{Kind: ApplyAttenuate, Strength: 0.25}}},
		{"attenuate always this_token", gateJSON(`{"kind": "always"}`, `"this_token"`, `{"kind": "attenuate", "strength": 0}`),
			Gate{Scope: ScopeThisToken, Apply: GateApply{Kind: ApplyAttenuate}}},
		{"inline probe, unknown keys ignored", `[{"when": {"kind": "probe", "probe": ` + srcInline + `, "threshold": 0, "x": 1}, "scope": "rest_of_conversation", "apply": ` + add + `, "extra": true}]`,
			Gate{When: When{Kind: WhenProbe, Probe: GateSource{Vectors: []Vector{{Hook: "post_block", Layer: 1, Scale: 1, Data: []float32{1, 2, 3, 4}}}}, Sharpness: 1}, Scope: ScopeRestOfConversation, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 2}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, err := DecodeGates([]byte(tc.in), testUnpack)
			if err != nil {
				t.Fatal(err)
			}
			if len(g) != 1 || fmt.Sprint(g[0]) != fmt.Sprint(tc.want) {
				t.Fatalf("got %+v\nwant %+v", g, tc.want)
			}
			if err := CheckGates(g); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, in := range []string{"", "null", " [] "} {
		if g, err := DecodeGates([]byte(in), nil); err != nil || len(g) != 0 {
			t.Fatalf("%q: %v %v", in, g, err)
		}
	}
}

// TestDecodeGatesRefusals is every refusal of the fork's validation, with its sentinel and the
// field the message names.
func TestDecodeGatesRefusals(t *testing.T) {
	probe := func(thr, sharp string) string {
		return `{"kind": "probe", "probe": ` + srcProbe + `, "threshold": ` + thr + `, "sharpness": ` + sharp + `}`
	}
	add := `{"kind": "add", "steer": ` + srcSteer + `}`
	cases := []struct {
		name, in string
		want     error
		says     string
	}{
		{"not a list", `{"when": 1}`, ErrBadGate, "must be a list"},
		{"gate not an object", `[1]`, ErrBadGate, "must be an object"},
		{"no scope", `[{"when": {"kind": "always"}, "apply": ` + add + `}]`, ErrBadGate, "scope: missing"},
		{"unknown scope", gateJSON(`{"kind": "always"}`, `"forever"`, add), ErrBadGate, `"forever"`},
		{"scope not a string", gateJSON(`{"kind": "always"}`, `3`, add), ErrBadGate, "scope: expected a string"},
		{"no when", `[{"scope": "next_step", "apply": ` + add + `}]`, ErrBadGate, "when: expected an object"},
		{"unknown when kind", gateJSON(`{"kind": "sometimes"}`, `"next_step"`, add), ErrBadGate, "when.kind"},
		{"no threshold", gateJSON(`{"kind": "probe", "probe": `+srcProbe+`}`, `"next_step"`, add), ErrBadGate, "when.threshold: missing"},
		{"threshold a string", gateJSON(probe(`"1"`, "1"), `"next_step"`, add), ErrBadGate, "when.threshold: expected a number"},
		{"threshold beyond float32", gateJSON(probe("1e39", "1"), `"next_step"`, add), ErrNonFinite, "when.threshold"},
		{"threshold overflows float64", gateJSON(probe("1e400", "1"), `"next_step"`, add), ErrNonFinite, "when.threshold"},
		{"sharpness beyond float32", gateJSON(probe("0", "-1e39"), `"next_step"`, add), ErrNonFinite, "when.sharpness"},
		{"negative sharpness", gateJSON(probe("0", "-0.5"), `"next_step"`, add), ErrBadGate, "non-negative"},
		{"attenuate probe this_token", gateJSON(probe("0", "1"), `"this_token"`, `{"kind": "attenuate", "strength": 0.5}`), ErrGateUnsupported, "next_step or rest_of_request"},
		{"attenuate without strength", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "attenuate"}`), ErrBadGate, "apply.strength: missing"},
		{"strength beyond float32", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": `+srcSteer+`, "strength": 1e39}`), ErrNonFinite, "apply.strength"},
		{"unknown apply kind", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "mul"}`), ErrBadGate, "apply.kind"},
		{"add without steer", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add"}`), ErrBadGate, "apply.steer"},
		{"source kind", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": {"kind": "url"}}`), ErrBadGate, "'name' or 'inline'"},
		{"empty name", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": {"kind": "name", "name": ""}}`), ErrBadGate, "non-empty 'name'"},
		{"long name", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": {"kind": "name", "name": "`+strings.Repeat("n", MaxNameLen+1)+`"}}`), ErrBadName, "apply.steer"},
		{"empty packed", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": {"kind": "inline", "packed": {}}}`), ErrBadGate, "non-empty 'packed'"},
		{"packed with no rows", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": {"layer_indices": [], "rows": []}}}}`), ErrBadGate, "carries no vectors"},
		{"packed refused by the unpacker", gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": {"kind": "inline", "packed": {"post_block": 7}}}`), errTestPacked, `apply.steer.packed["post_block"]`},
		{"too many gates", "[" + strings.Repeat(`{},`, MaxGates) + "{}]", ErrBadGate, "at most"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g, err := DecodeGates([]byte(tc.in), testUnpack)
			if !errors.Is(err, tc.want) || g != nil {
				t.Fatalf("got %v, %v; want %v", g, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("%q does not say %q", err, tc.says)
			}
		})
	}
	// A later gate's refusal names its index.
	_, err := DecodeGates([]byte(`[{"when": {"kind": "always"}, "scope": "next_step", "apply": `+add+`}, {"scope": "x"}]`), testUnpack)
	if !errors.Is(err, ErrBadGate) || !strings.HasPrefix(err.Error(), "steering[1]: ") {
		t.Fatal(err)
	}
	// Without an unpacker inline sources are refused rather than dropped.
	if _, err := DecodeGates([]byte(gateJSON(`{"kind": "always"}`, `"next_step"`, `{"kind": "add", "steer": `+srcInline+`}`)), nil); !errors.Is(err, ErrBadGate) {
		t.Fatal(err)
	}
}

// TestCheckGates covers what a Go caller can build and the JSON cannot say.
func TestCheckGates(t *testing.T) {
	ok := Gate{Scope: ScopeNextStep, Apply: GateApply{Kind: ApplyAdd, Steer: GateSource{Name: "s"}, Strength: 1}}
	nan := float32(0)
	nan /= nan
	cases := []struct {
		name string
		edit func(g *Gate)
		want error
	}{
		{"ok", func(g *Gate) {}, nil},
		{"bad scope", func(g *Gate) { g.Scope = numScopes }, ErrBadGate},
		{"bad when", func(g *Gate) { g.When.Kind = 9 }, ErrBadGate},
		{"bad apply", func(g *Gate) { g.Apply.Kind = 9 }, ErrBadGate},
		{"NaN threshold", func(g *Gate) { g.When = When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Threshold: nan} }, ErrNonFinite},
		{"NaN sharpness", func(g *Gate) { g.When = When{Kind: WhenProbe, Probe: GateSource{Name: "p"}, Sharpness: nan} }, ErrNonFinite},
		{"NaN strength", func(g *Gate) { g.Apply.Strength = nan }, ErrNonFinite},
		{"probe source empty", func(g *Gate) { g.When = When{Kind: WhenProbe} }, ErrBadGate},
		{"source both", func(g *Gate) { g.Apply.Steer.Vectors = []Vector{{Hook: "post_block"}} }, ErrBadGate},
		{"attenuate with a vector", func(g *Gate) { g.Apply.Kind = ApplyAttenuate }, ErrBadGate},
		{"attenuate probe this_token", func(g *Gate) {
			*g = Gate{When: When{Kind: WhenProbe, Probe: GateSource{Name: "p"}}, Scope: ScopeThisToken, Apply: GateApply{Kind: ApplyAttenuate}}
		}, ErrGateUnsupported},
	}
	for _, tc := range cases {
		g := ok
		tc.edit(&g)
		err := CheckGates([]Gate{ok, g})
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "steering[1]: ") {
			t.Fatalf("%s: %q does not name the gate", tc.name, err)
		}
	}
}

func FuzzDecodeGates(f *testing.F) {
	f.Add([]byte(gateJSON(`{"kind": "probe", "probe": `+srcInline+`, "threshold": 0.5, "sharpness": 4}`, `"this_token"`, `{"kind": "add", "steer": `+srcSteer+`, "strength": 2}`)))
	f.Add([]byte(gateJSON(`{"kind": "always"}`, `"rest_of_conversation"`, `{"kind": "attenuate", "strength": 0.5}`)))
	f.Add([]byte(`[{"when": {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 1e400}, "scope": "next_step", "apply": {"kind": "add"}}]`))
	f.Add([]byte(`[{}, null, "x"]`))
	known := []error{ErrBadGate, ErrGateUnsupported, ErrNonFinite, ErrBadName, errTestPacked}
	f.Fuzz(func(t *testing.T, b []byte) {
		g, err := DecodeGates(b, testUnpack)
		if err != nil {
			if g != nil {
				t.Fatal("gates returned with an error")
			}
			matched := false
			for _, s := range known {
				matched = matched || errors.Is(err, s)
			}
			if !matched {
				t.Fatalf("untyped error %q", err)
			}
			if msg := err.Error(); strings.Contains(msg, "json:") || strings.Contains(msg, "Go value") {
				t.Fatalf("decoder wording in %q", msg)
			}
			return
		}
		if len(g) > MaxGates {
			t.Fatalf("%d gates", len(g))
		}
		if err := CheckGates(g); err != nil {
			t.Fatalf("decoded gates fail CheckGates: %v", err)
		}
	})
}
