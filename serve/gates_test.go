package serve

import (
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// gatesOf reads the gates the owner stored for request id, through a worker's attachment.
func (f *forkServer) gatesOf(t *testing.T, id string) []steer.AdmittedGate {
	t.Helper()
	cs, err := AttachClient(f.ns, f.secret)
	require.NoError(t, err)
	defer cs.Close()
	s, err := cs.Engine.Region().Snapshot()
	require.NoError(t, err)
	defer s.Close()
	g, err := cs.Engine.Gates(&s, id)
	require.NoError(t, err)
	for i := range g {
		g[i].Probe.Data = nil // aliases the snapshot
		g[i].Steer = nil
	}
	return g
}

// POST /v1/requests/admit takes the fork's "steering" gates: names (tenant-checked) and inline
// packed sources; every refusal is a 400 with a typed "type" and admits nothing.
func TestAdmitSteeringGates(t *testing.T) {
	f := startForkServer(t, "gates", nil)
	pk := func(v []float64, layer int) map[string]any {
		return map[string]any{hp: packHook(map[int][]float64{layer: v}, "float32", nil)}
	}
	ones := row(1, 1, 1, 1, 1, 1, 1, 1)
	f.ok(t, "/v1/steering/vectors/register", map[string]any{"name": "p", "kind": "probe", "packed": pk(row(0, 1, 2, 3, 4, 5, 6, 7), 5)})
	f.ok(t, "/v1/steering/vectors/register", map[string]any{"name": "s", "kind": "steer", "packed": pk(ones, 9)})
	probe := map[string]any{"kind": "probe", "probe": map[string]any{"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 2}
	add := map[string]any{"kind": "add", "steer": map[string]any{"kind": "name", "name": "s"}, "strength": 3}
	gate := func(when any, scope string, apply any) map[string]any {
		return map[string]any{"when": when, "scope": scope, "apply": apply}
	}
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r", "steering": []any{
		gate(probe, "this_token", add),
		gate(map[string]any{"kind": "always"}, "next_step", map[string]any{"kind": "attenuate", "strength": 0.5}),
		gate(map[string]any{"kind": "probe", "probe": map[string]any{"kind": "inline", "packed": pk(ones, 2)}, "threshold": 0}, "rest_of_request",
			map[string]any{"kind": "add", "steer": map[string]any{"kind": "inline", "packed": pk(ones, 3)}}),
	}})
	g := f.gatesOf(t, "r")
	require.Len(t, g, 3)
	require.Equal(t, steer.AdmittedGate{When: steer.WhenProbe, Scope: steer.ScopeThisToken, Apply: steer.ApplyAdd, Threshold: 0.5, Sharpness: 2, Strength: 3,
		ProbeName: "p", ProbeDigest: g[0].ProbeDigest, Probe: steer.Vector{Hook: hp, Layer: 5, Scale: 1}, SteerName: "s", SteerDigest: g[0].SteerDigest}, g[0])
	require.NotZero(t, g[0].ProbeDigest)
	require.Equal(t, steer.ApplyAttenuate, g[1].Apply)
	require.Equal(t, 2, g[2].Probe.Layer)
	require.Equal(t, float32(1), g[2].Sharpness, "the fork's default sharpness")
	_, dyn := f.get(t, "/v1/steering/dynamic")
	require.Equal(t, map[string]any{"requests": 1.0, "probes": 2.0,
		"by_scope": map[string]any{"this_token": 1.0, "next_step": 1.0, "rest_of_request": 1.0, "rest_of_conversation": 0.0},
		"by_apply": map[string]any{"add": 2.0, "attenuate": 1.0}}, dyn["gates"])
	resp, err := http.Get(f.addr + "/metrics")
	require.NoError(t, err)
	met, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{"shmsteer_gated_requests 1", `shmsteer_gates{scope="this_token"} 1`, `shmsteer_gates{scope="rest_of_conversation"} 0`} {
		require.Contains(t, string(met), line+"\n")
	}

	cases := []struct {
		name     string
		steering any
		typ      string
		says     string
	}{
		{"not a list", map[string]any{}, "bad_gate", "must be a list"},
		{"unknown scope", []any{gate(probe, "forever", add)}, "bad_gate", "forever"},
		{"attenuate probe this_token", []any{gate(probe, "this_token", map[string]any{"kind": "attenuate", "strength": 0.5})}, "gate_unsupported", "next_step or rest_of_request"},
		{"negative sharpness", []any{gate(map[string]any{"kind": "probe", "probe": map[string]any{"kind": "name", "name": "p"}, "threshold": 0, "sharpness": -1}, "next_step", add)}, "bad_gate", "non-negative"},
		{"threshold beyond float32", []any{gate(map[string]any{"kind": "probe", "probe": map[string]any{"kind": "name", "name": "p"}, "threshold": 1e39}, "next_step", add)}, "non_finite", "when.threshold"},
		{"unknown probe", []any{gate(map[string]any{"kind": "probe", "probe": map[string]any{"kind": "name", "name": "s"}, "threshold": 0}, "next_step", add)}, "unknown_vector", `unknown probe vector name "s"`},
		{"unknown steer", []any{gate(probe, "next_step", map[string]any{"kind": "add", "steer": map[string]any{"kind": "name", "name": "p"}})}, "unknown_vector", `unknown steering vector name "p"`},
		{"inline probe of two sites", []any{gate(map[string]any{"kind": "probe", "probe": map[string]any{"kind": "inline", "packed": map[string]any{hp: packHook(map[int][]float64{1: ones, 2: ones}, "float32", nil)}}, "threshold": 0}, "next_step", add)}, "probe_site", "2 sites"},
		{"inline of the wrong width", []any{gate(probe, "next_step", map[string]any{"kind": "add", "steer": map[string]any{"kind": "inline", "packed": pk([]float64{1, 2}, 1)}})}, "hidden_size", "steering[0].apply.steer"},
		{"bad packed", []any{gate(probe, "next_step", map[string]any{"kind": "add", "steer": map[string]any{"kind": "inline", "packed": map[string]any{hp: map[string]any{"dtype": "float32", "data": "!!", "shape": []int{1, 8}, "layer_indices": []int{1}}}}})}, "bad_request", "apply.steer.packed"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, m := f.post(t, "/v1/requests/admit", map[string]any{"request_id": "refused", "steering": tc.steering})
			require.Equal(t, 400, code, "%v", m)
			require.Equal(t, tc.typ, m["type"], "%v", m)
			require.Contains(t, m["error"], tc.says)
			require.Nil(t, f.gatesOf(t, "refused"))
		})
	}
	f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r", "steering": nil})
	require.Nil(t, f.gatesOf(t, "r"), "re-admitted with no gates")
	_, dyn = f.get(t, "/v1/steering/dynamic")
	require.Equal(t, 0.0, dyn["gates"].(map[string]any)["requests"])
}

// AdmissionFromRequest passes an OpenAI body's gates on to the admission, checked.
func TestAdmissionFromRequestGates(t *testing.T) {
	gates := `[{"when": {"kind": "always"}, "scope": "next_step", "apply": {"kind": "attenuate", "strength": 0.5}}]`
	a, err := AdmissionFromRequest([]byte(`{"model": "m", "steering": `+gates+`}`), forkCfg, OpenAIOptions{MaxClampDirections: -1})
	require.NoError(t, err)
	require.JSONEq(t, gates, string(a.Steering))
	_, err = AdmissionFromRequest([]byte(`{"steering": [{"when": {"kind": "probe"}, "scope": "next_step"}]}`), forkCfg, OpenAIOptions{})
	require.ErrorIs(t, err, steer.ErrBadGate)
	a, err = AdmissionFromRequest([]byte(`{"steering": null}`), forkCfg, OpenAIOptions{})
	require.NoError(t, err)
	require.Nil(t, a.Steering)
}
